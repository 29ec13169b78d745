"""A repeated ``message_id`` racing a refusal is not told "accepted": top-level
agents and reports.

Under relaxed durability and on a memory store a message id is deduplicated in
memory: the first caller claims ``(session, id)`` before its message is accepted
and gives the claim back when it is refused. A repeat that found the claim
meanwhile was answered with the id -- a duplicate, accepted already -- though
nothing was accepted and nothing ran. A continuable child's follow-ups were fixed
first (``test_duplicate_refused.py``); a top-level agent's ``followup`` and a
child's report by id had the same shape. A repeat now waits for the first
caller's outcome, as a child's follow-up does.

The interleaving is forced: the first caller is held at a gate right after its
claim of the id, until the repeat has reached the deduplication of the same id
(its own claim, or its wait for the first one's outcome); then the receiver is
disposed, and the first caller goes on to be refused.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path
from typing import Any

import pytest
from continuable_kit import spawn
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._agents import _underway
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Gate
from subagents.protocol import ErrorCode, MessageId, SubagentError
from subagents.store import MemoryStore

ROUNDS = 12
MODES = pytest.mark.parametrize("mode", ["memory", "relaxed"])
VIAS = ("followup", "steer", "send")


def _runtime(backend: Backend, tmp_path: Path, mode: str) -> Runtime:
    if mode == "memory":
        return Runtime(MemoryStore(), backend=backend)
    return Runtime(str(tmp_path / "d.db"), backend=backend, durability="relaxed")


class _Held:
    """Holds the first claim of :attr:`mid` -- once it is made -- at :attr:`gate`;
    :attr:`arrived` is set once a second caller reaches the deduplication of the
    same id: its claim, or its wait for the first one's outcome (the session
    service's table of acceptances under way, where there is one)."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._lock = threading.Lock()
        self.mid: MessageId | None = None
        sessions: Any = rt.sessions
        claim = sessions.claim

        def held_claim(scope: Any, mid: MessageId) -> bool:
            made = claim(scope, mid)
            if mid == self.mid and self._count("claims") == 1:
                self.gate.pass_through()
            elif mid == self.mid:
                self.arrived.set()
            return bool(made)

        sessions.claim = held_claim
        underway = getattr(sessions, "underway", None)
        if underway is not None:
            enter = underway.enter

            def counted_enter(key: Any, signal: Any) -> Any:
                if key[1] == self.mid and self._count("entries") > 1:
                    self.arrived.set()
                return enter(key, signal)

            underway.enter = counted_enter

    def arm(self, rnd: int) -> MessageId:
        """A new id to hold, for round ``rnd``."""
        with self._lock:
            self.counts = {"claims": 0, "entries": 0}
            self.gate = Gate(f"claim{rnd}")
            self.arrived = self._rt.backend.event()
            self.mid = MessageId(uuid.uuid4().hex)
            return self.mid

    def _count(self, what: str) -> int:
        with self._lock:
            self.counts[what] += 1
            return self.counts[what]


def _race(held: _Held, offer: Any, refuse: Any, rt: Runtime) -> list[Any]:
    """``offer()`` twice with the held id; ``refuse()`` once the repeat arrived,
    then the first goes on. Returns each caller's error (None: it was told the id)."""
    first = spawn(rt, offer)
    assert held.gate.wait_reached(10)
    second = spawn(rt, offer)
    assert held.arrived.wait(10)
    refuse()
    held.gate.release()
    return [first.error(30), second.error(30)]


def _offer(rt: Runtime, agent: Any, via: str, mid: MessageId) -> Any:
    if via == "followup":
        return lambda: agent.followup("once", message_id=mid)
    if via == "steer":
        return lambda: agent.followup("once", message_id=mid, steer=True)
    return lambda: rt.agents.send(agent.session_id, "once", message_id=mid)


@MODES
@pytest.mark.parametrize("via", VIAS)
def test_a_repeated_followup_racing_the_agent_s_disposal_is_refused_too(
    backend: Backend, tmp_path: Path, mode: str, via: str
) -> None:
    """Race, 12 rounds: a top-level agent's ``followup`` with a ``message_id`` (or
    a steer, or ``agents.send``) claims the id, is held, and is refused
    ``AGENT_DISPOSED`` (the agent was disposed meanwhile; ``send`` then tries to
    resume the session, which records no model: ``MODEL_NOT_FOUND``); a repeat of
    the id that reached its deduplication before that was told the id --
    accepted (``Steered`` "duplicate") -- though the message never ran. Now it
    waits for the first one's refusal, and is refused itself. R-FUP-1, R-DUR-1."""
    ran: list[Any] = []
    with _runtime(backend, tmp_path, mode) as rt:
        held = _Held(rt)
        for rnd in range(ROUNDS):
            agent = rt.spawn(lambda turn: ran.append(turn.content))
            mid = held.arm(rnd)
            errors = _race(held, _offer(rt, agent, via, mid), agent.dispose, rt)
            # send falls back to resuming the disposed session here, which records
            # no model (spawned with a behaviour): nothing is accepted either.
            code = ErrorCode.MODEL_NOT_FOUND if via == "send" else ErrorCode.AGENT_DISPOSED
            for err in errors:
                assert isinstance(err, SubagentError), (rnd, errors)
                assert err.code == code, (rnd, errors)
    assert ran == []


@MODES
def test_a_repeated_report_racing_the_parent_s_disposal_is_refused_too(
    backend: Backend, tmp_path: Path, mode: str
) -> None:
    """Race, 12 rounds: a child's waking report by id with a ``message_id`` claims
    the id at its live parent, is held, and is refused (``UNAUTHORIZED``: the parent
    left residency meanwhile); a repeat that reached its deduplication before that
    was told the id -- accepted -- though the parent never got the report. Now it
    waits for the first one's refusal, and is refused itself. R-FUP-1, R-CONT-*."""
    ran: list[Any] = []
    with _runtime(backend, tmp_path, mode) as rt:
        rt.models.register("silent", lambda _options: lambda _turn: None)
        held = _Held(rt)
        for rnd in range(ROUNDS):
            parent = rt.spawn(lambda turn: ran.append(turn.content))
            spec = ContinuableStartSpec(
                parent=parent, provider="local", prompt="go", label=f"kid{rnd}", model="silent"
            )
            cid = rt.subagents.start_continuable(spec).child_id
            mid = held.arm(rnd)
            errors = _race(
                held,
                lambda c=cid, m=mid: rt.subagents.report_from(
                    c, "news", delivery="waking", message_id=m
                ),
                parent.dispose,
                rt,
            )
            for err in errors:
                assert isinstance(err, SubagentError), (rnd, errors)
                assert err.code == ErrorCode.UNAUTHORIZED, (rnd, errors)
    assert ran == []


@MODES
def test_an_acceptance_nobody_repeats_makes_no_latch(
    backend: Backend, tmp_path: Path, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-FUP-1, R-DUR-1 (and the follow-up hot path): a follow-up by id, a steer by
    id and a send by id that no repeat meets while under way are deduplicated
    without making the latch a repeat would wait on -- one made per acceptance
    cost more than the claim itself -- and each is still accepted once."""
    made: list[object] = []
    real = _underway.Latch

    def counted() -> Any:
        made.append(None)
        return real()

    monkeypatch.setattr(_underway, "Latch", counted)
    with _runtime(backend, tmp_path, mode) as rt:
        agent = rt.spawn(lambda turn: turn.content)
        mids = [MessageId(uuid.uuid4().hex) for _ in range(3)]
        for offer in (_offer(rt, agent, via, mid) for via, mid in zip(VIAS, mids)):
            offer()
            offer()  # a repeat after the outcome: a duplicate, no wait
        assert agent.wait_idle(10)
        assert len(rt.sessions.turn_ends(agent.session_id)) == 3
        assert made == []
