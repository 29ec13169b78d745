"""One activation of a session at a time inside one runtime (R-DUR-LEASE, R-LIFE-4).

Activating a persisted session takes its lease first, and the store lets a holder
take its own lease again at the next epoch. Two activations racing in one runtime
-- two ``resume`` calls, sends to a cold session, follow-ups by the id of a parent
that is not live, a send right after ``dispose(wait=False)`` -- both took it: the
loser's rollback then gave the winner's lease up, and the winner's writes failed
with ``LEASE_LOST``; messages were refused after they ran, or ran twice. Now an
activation claims the session in the runtime before the lease is touched, and a
second one waits for the first (or for the previous agent's disposal).

Each race runs many rounds, on both backends, on SQLite and PostgreSQL, strict
and relaxed; one test forces the interleaving with a gate inside the activation.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._agents import _claims
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Gate
from subagents.protocol import ErrorCode, SubagentError

pytestmark = pytest.mark.timeout(120)

ROUNDS = 12


class Calls:
    """Message ids the ``count`` model ran, with how often (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()

    def model(self, _options: Any) -> Callable[[Any], str]:
        def behaviour(turn: Any) -> str:
            with self._lock:
                for message in turn.messages:
                    self.counts[message.message_id] += 1
            return "ok"

        return behaviour


@pytest.fixture(params=["strict", "relaxed"])
def durability(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def calls() -> Calls:
    return Calls()


@pytest.fixture
def rt(backend: Backend, db: str, durability: str, calls: Calls) -> Iterator[Runtime]:
    with Runtime(db, backend=backend, durability=durability) as runtime:
        runtime.models.register("count", calls.model)
        yield runtime


@pytest.fixture
def errors_logged(caplog: pytest.LogCaptureFixture) -> Callable[[], list[str]]:
    caplog.set_level(logging.WARNING, logger="subagents")
    return lambda: [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


class Refused(str):
    """The code of the ``SubagentError`` a call raised."""


def _together(rt: Runtime, fns: list[Callable[[], Any]]) -> list[Any]:
    """Run ``fns`` at once (threads, or greenlets of this hub); each one's result,
    or the :class:`Refused` code of the ``SubagentError`` it raised."""
    out: list[Any] = [None] * len(fns)

    def run(i: int) -> None:
        try:
            out[i] = fns[i]()
        except SubagentError as exc:
            out[i] = Refused(exc.code)

    tasks = [rt.backend.spawn(run, i) for i in range(len(fns))]
    for task in tasks:
        assert task.join(60)
        assert task.exception is None
    return out


def _leases(rt: Runtime) -> int:
    return rt.statistics().leases_held


def test_racing_resumes_make_one_agent_and_it_keeps_its_lease(
    rt: Runtime, calls: Calls, errors_logged: Callable[[], list[str]]
) -> None:
    """Concurrent ``agents.resume`` of one cold session: one agent, the others
    ``SESSION_EXISTS``; the agent's lease stays its own, so its follow-ups run
    (they failed with ``LEASE_LOST`` when a loser had taken the lease over)."""
    sid = rt.spawn("count", label="root").session_id
    for round_ in range(ROUNDS):
        agent = rt.agents.get(sid)
        assert agent is not None
        agent.dispose()
        got = _together(rt, [lambda: rt.agents.resume(sid)] * 3)
        winners = [g for g in got if not isinstance(g, Refused)]
        assert len(winners) == 1, got
        assert got.count(ErrorCode.SESSION_EXISTS) == 2, got
        assert rt.agents.get(sid) is winners[0]
        mid = winners[0].followup(round_)
        assert rt.wait_idle(30)
        assert calls.counts[mid] == 1
        if rt.sessions.leases is not None:
            assert _leases(rt) == 1
    assert errors_logged() == []


def test_racing_sends_to_a_cold_session_are_each_accepted_and_run_once(
    rt: Runtime, calls: Calls, errors_logged: Callable[[], list[str]]
) -> None:
    """Concurrent ``agents.send`` to a session that is not live: every call returns
    its id, and every message runs exactly once (calls raised ``LEASE_LOST`` or
    ``SESSION_EXISTS``, some after their message had run, and some ran twice)."""
    sid = rt.spawn("count", label="root").session_id
    sent: list[str] = []
    for round_ in range(ROUNDS):
        agent = rt.agents.get(sid)
        if agent is not None:
            agent.dispose()
        got = _together(rt, [lambda i=i, r=round_: rt.agents.send(sid, (r, i)) for i in range(4)])
        assert not any(isinstance(g, Refused) for g in got), got
        sent.extend(got)
        assert rt.wait_idle(30)
    assert all(calls.counts[m] == 1 for m in sent), calls.counts
    assert sum(calls.counts.values()) == len(sent)
    assert errors_logged() == []


def test_a_send_right_after_dispose_without_waiting_runs_once(
    rt: Runtime, calls: Calls, errors_logged: Callable[[], list[str]]
) -> None:
    """``dispose(wait=False)`` releases the session later, in the agent's actor; a
    send at once waits for that release and activates the session afresh (it took
    the still-held lease, so the disposing agent's last writes and the send itself
    failed with ``LEASE_LOST``)."""
    sid = rt.spawn("count", label="root").session_id
    sent = []
    for round_ in range(ROUNDS * 2):
        agent = rt.agents.get(sid)
        if agent is not None:
            agent.dispose(wait=False)
        sent.append(rt.agents.send(sid, round_))
        assert rt.wait_idle(30)
    assert [calls.counts[m] for m in sent] == [1] * len(sent)
    assert errors_logged() == []


def test_racing_followups_by_a_cold_parents_id_are_each_accepted(rt: Runtime, calls: Calls) -> None:
    """Follow-ups by id to a continuable child of a parent that is not live resume
    the parent here: concurrent ones all go through, each runs once (all but one
    failed with ``SESSION_EXISTS``)."""
    parent = rt.spawn("echo", label="root")
    pid = parent.session_id
    cid, _ = rt.subagents.start_continuable(
        ContinuableStartSpec(parent=parent, provider="local", prompt="hi", label="c", model="count")
    )
    sent: list[str] = []
    for round_ in range(ROUNDS):
        live = rt.agents.get(pid)
        if live is not None:
            live.dispose()
        got = _together(
            rt, [lambda i=i, r=round_: rt.subagents.followup(pid, cid, (r, i)) for i in range(4)]
        )
        assert not any(isinstance(g, Refused) for g in got), got
        sent.extend(got)
        assert rt.wait_idle(30)
    assert all(calls.counts[m] == 1 for m in sent)


class Held:
    """The ``gated`` model: once armed, its factory holds the next activation at a
    gate (inside the activation: after its claim and its lease, before it is live)."""

    def __init__(self, rt: Runtime, calls: Calls) -> None:
        self._gate: Gate | None = None
        self._calls = calls
        rt.models.register("gated", self.model)

    def arm(self) -> Gate:
        self._gate = gate = Gate("activation")
        return gate

    def model(self, options: Any) -> Callable[[Any], str]:
        gate, self._gate = self._gate, None
        if gate is not None:
            gate.pass_through()
        return self._calls.model(options)


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
@pytest.mark.parametrize("second", ["send", "resume"])
def test_a_second_activation_waits_for_the_first_in_flight(
    rt: Runtime, calls: Calls, second: str, errors_logged: Callable[[], list[str]]
) -> None:
    """Forced interleaving: the first activation is held inside it; a ``send`` or a
    ``resume`` meanwhile waits for it (the old code activated the session a second
    time, past the first, and took its lease). Released: the send's message runs
    once, on the agent the first one built; the resume answers ``SESSION_EXISTS``."""
    held = Held(rt, calls)
    sid = rt.spawn("gated", label="root").session_id
    for round_ in range(4):
        live = rt.agents.get(sid)
        assert live is not None
        live.dispose()
        gate = held.arm()
        got: dict[str, Any] = {}
        first = rt.backend.spawn(lambda got=got: got.update(first=rt.agents.resume(sid)))
        assert gate.wait_reached(30)

        def call(round_: int = round_, got: dict[str, Any] = got) -> None:
            try:
                if second == "send":
                    got["second"] = rt.agents.send(sid, round_)
                else:
                    got["second"] = rt.agents.resume(sid)
            except SubagentError as exc:
                got["second"] = exc.code

        task = rt.backend.spawn(call)
        assert not task.join(0.2)  # it waits for the first, which cannot end yet
        assert "second" not in got
        gate.release()
        assert first.join(30) and task.join(30)
        assert rt.agents.get(sid) is got["first"]
        if second == "send":
            assert rt.wait_idle(30)
            assert calls.counts[got["second"]] == 1
        else:
            assert got["second"] == ErrorCode.SESSION_EXISTS
        if rt.sessions.leases is not None:
            assert _leases(rt) == 1
    assert errors_logged() == []


@pytest.mark.parametrize("db", ["sqlite"], indirect=True)
def test_a_second_activation_waits_a_bounded_time(
    rt: Runtime, calls: Calls, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A second activation that waits past ``CLAIM_WAIT`` is refused with
    ``SESSION_EXISTS`` (it does not hang with the first), and takes nothing: the
    first one still becomes live with its lease."""
    monkeypatch.setattr(_claims, "CLAIM_WAIT", 0.1)
    held = Held(rt, calls)
    sid = rt.spawn("gated", label="root").session_id
    live = rt.agents.get(sid)
    assert live is not None
    live.dispose()
    gate = held.arm()
    got: dict[str, Any] = {}
    first = rt.backend.spawn(lambda: got.update(first=rt.agents.resume(sid)))
    assert gate.wait_reached(30)
    with pytest.raises(SubagentError) as err:
        rt.agents.resume(sid)
    assert err.value.code == ErrorCode.SESSION_EXISTS
    assert "being activated" in str(err.value)
    gate.release()
    assert first.join(30)
    mid = got["first"].followup("after")
    assert rt.wait_idle(30)
    assert calls.counts[mid] == 1
