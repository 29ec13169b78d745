"""Takes of durable inbox messages (hand-overs) whose commit answer was lost.

A strict follow-up of a live agent committed at place ``n`` of its durable inbox
first takes, and queues, the messages before it that nobody took -- another
runtime's ``send``, committed untaken, whose ring the holder's pickup has not
answered yet (``_agents/_ahead.py``: the inbox is FIFO across processes). That
take is a hand-over (``store.hand_over``); its connection lost at the COMMIT, it
may have committed all the same. The take-ahead used to log the error and go
on: committed, the messages were taken by the live activation and never queued
-- no later take could take them, so they ran at the session's next activation,
if ever (R-DUR-1, R-DUR-2); not committed, the pickup took them later, and they
ran after the follow-up (R-FUP-1, R-FUP-5). Now the take settles at once, from
the store, and they run once, before the follow-up, in the same activation;
when the store cannot say at once either, they are left in doubt to the pickup,
which settles them at its next look: once, in the same activation.

Two more takers: the pickup's own lost take left its messages in doubt, and a
take-ahead that took one of them before the pickup looked again had it run
twice (the pickup queued it again); a resume's lost take left its messages
taken by the failed activation, and the next one ran them as redelivered.

PostgreSQL: a :class:`~commit_cut.CommitCut` proxy drops the hand-over's COMMIT
answer with the connection (after the server committed, or before the COMMIT
reached it). SQLite loses no commit answer, so there the store's ``hand_over``
is wrapped: it commits (or not) and raises ``PERSISTENCE_UNAVAILABLE``, the
error the runtime reads as "unsure".
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
from commit_cut import CommitCut
from durability_kit import Noted, gated_pickup
from subagents.actors import Runtime
from subagents.actors._agents import _mail
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Gate
from subagents.protocol import ErrorCode, SubagentError, new_message_id, trusted_message

OUTCOMES = pytest.mark.parametrize("committed", [True, False], ids=["committed", "not-committed"])
pytestmark = pytest.mark.timeout(120)


class LostTakes:
    """Loses the answer of a runtime's next hand-overs (see the module docstring)."""

    def __init__(self, cut: CommitCut | None) -> None:
        self._cut = cut
        self._left: list[bool] = []  # for each next hand-over: whether it commits
        self.lost = 0

    def arm(self, *committed: bool) -> None:
        """Lose the next ``len(committed)`` answers; none more when empty (an
        answer left armed must not cut another write's COMMIT)."""
        self._left = list(committed)
        if not committed and self._cut is not None:
            self._cut.arm(0)

    def install(self, rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> None:
        store = rt.store
        assert store is not None
        real = store.hand_over

        def hand_over(*args: Any, **kwargs: Any) -> Any:
            if not self._left:
                return real(*args, **kwargs)
            commits = self._left.pop(0)
            self.lost += 1
            if self._cut is not None:  # PostgreSQL: the proxy drops the COMMIT's answer
                self._cut.arm(forward=commits)
                return real(*args, **kwargs)
            if commits:
                real(*args, **kwargs)
            raise SubagentError("connection lost at COMMIT", code=ErrorCode.PERSISTENCE_UNAVAILABLE)

        monkeypatch.setattr(store, "hand_over", hand_over)


@contextlib.contextmanager
def _holder(
    backend: Backend, db: str, noted: Noted, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Runtime, Runtime, Any, LostTakes, CommitCut | None]]:
    """The holder ``a`` (through the proxy on PostgreSQL, its hand-overs' answers
    lost when armed), another runtime ``b`` on the store, and ``a``'s agent, which
    ran ``first`` and has nothing left to write. Long leases: a heartbeat of the
    holder must not take the proxy's cut."""
    with contextlib.ExitStack() as stack:
        cut = stack.enter_context(CommitCut(db)) if db.startswith("postgres") else None
        a = stack.enter_context(
            Runtime(db if cut is None else cut.url, backend=backend, lease_ttl=120)
        )
        b = stack.enter_context(Runtime(db, backend=backend, lease_ttl=120))
        noted.register(a, "a")
        noted.register(b, "b")
        agent = a.spawn("note")
        agent.followup("first")
        assert agent.wait_idle(10)
        a.sessions.flush()
        lost = LostTakes(cut)
        lost.install(a, monkeypatch)
        yield a, b, agent, lost, cut


def _stayed(a: Runtime, agent: Any, epoch: int, noted: Noted) -> None:
    """Once ``a`` ran three turns: nothing left pending, the same activation, no
    turn run by another runtime or run again."""
    assert noted.wait_for(lambda items: len(items) >= 3, 30), noted.items()
    assert agent.wait_idle(10)
    a.sessions.flush()
    sid = agent.session_id
    assert a.agents.get(sid) is agent and not agent.disposed
    assert a.store is not None
    assert a.store.pending(sid) == []
    assert a.store.get_lease(sid).epoch == epoch  # type: ignore[union-attr]
    assert all(name == "a" and not again for name, _, again in noted.items())


def _gated_pickup(monkeypatch: pytest.MonkeyPatch) -> Gate:
    """Hold every mail pickup at a gate until the test releases it."""
    gate, gated = gated_pickup()
    monkeypatch.setattr(_mail.Mailman, "pickup", gated)
    return gate


def _run(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch, *committed: bool
) -> tuple[list[Any], int]:
    """``b`` sends ``ahead`` to ``a``'s agent (committed untaken; ``a`` rung, its
    pickup held); ``a``'s next hand-overs lose their answers (``committed``:
    whether each commits), and its agent's follow-up ``after`` takes ``ahead``
    first. Returns what ``a`` ran, in order, once it ran all three (see
    :func:`_stayed`), and how many cut COMMITs the server made (-1: SQLite)."""
    noted = Noted()
    with _holder(backend, db, noted, monkeypatch) as (a, b, agent, lost, cut):
        assert a.store is not None
        epoch = a.store.get_lease(agent.session_id).epoch  # type: ignore[union-attr]
        pickup = _gated_pickup(monkeypatch)
        try:
            b.agents.send(agent.session_id, "ahead")  # committed untaken, ``a`` rung
            lost.arm(*committed)
            agent.followup("after")
            assert lost.lost >= 1
        finally:
            lost.arm()
            pickup.release()
        # Within the pickup's look (rung at once), not the session's next activation.
        _stayed(a, agent, epoch, noted)
        return noted.contents(), (cut.committed if cut is not None else -1)


@OUTCOMES
def test_messages_ahead_whose_take_answer_was_lost_run_once_before_the_followup(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch, committed: bool
) -> None:
    """R-DUR-1, R-DUR-2, R-FUP-1, R-FUP-5: the take-ahead's hand-over loses its
    answer. Committed, ``ahead`` used never to run in this activation (taken by it,
    never queued); not committed, it ran after ``after``. Now it runs once, before
    ``after``, in the same activation."""
    ran, server_committed = _run(backend, db, monkeypatch, committed)
    assert ran == ["first", "ahead", "after"]
    if server_committed >= 0:  # what the server did, as meant
        assert server_committed == (1 if committed else 0)


@pytest.mark.parametrize(
    "committed",
    [(True, True), (True, False), (False, True)],
    ids=["both-committed", "first-committed", "retry-committed"],
)
def test_messages_ahead_left_in_doubt_run_once_when_the_pickup_settles_them(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch, committed: tuple[bool, bool]
) -> None:
    """R-DUR-1, R-DUR-2: the take-ahead's hand-over and the one it settles with both
    lose their answers: the store cannot say at once. ``ahead`` is left in doubt to
    the pickup, which settles it at its next look (rung at once): it runs once, in
    the same activation -- after ``after``, which was queued meanwhile. Taken by
    the first hand-over, it used never to run in this activation. (``retry-committed``
    guards the other outcome -- taken by the second -- and passed before: no second
    hand-over was made, and the pickup took it.)"""
    ran, _ = _run(backend, db, monkeypatch, *committed)
    assert sorted(ran) == ["after", "ahead", "first"]
    assert ran[0] == "first"


def test_a_take_ahead_of_a_message_the_pickup_left_in_doubt_runs_it_once(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-DUR-1, R-FUP-5: the pickup's hand-over of ``ahead`` loses its answer (not
    committed) and leaves it in doubt; before the pickup looks again, a follow-up
    ``after`` takes it ahead of itself (its compare-and-swap wins) and queues it.
    The pickup's second look found ``ahead`` in doubt and taken by the activation,
    and queued it again: it ran twice. A take that took a message settles its doubt
    (one registry of doubts for every taker): it runs once, before ``after``."""
    noted = Noted()
    with _holder(backend, db, noted, monkeypatch) as (a, b, agent, lost, _cut):
        assert a.store is not None
        epoch = a.store.get_lease(agent.session_id).epoch  # type: ignore[union-attr]
        followed: list[bool] = []
        real = _mail.Mailman._doubted

        def doubted(self: Any, target: Any) -> bool:
            # After the pickup's first look failed, before it decides to look again.
            if target is agent and not followed:
                followed.append(True)
                agent.followup("after")
            return bool(real(self, target))

        monkeypatch.setattr(_mail.Mailman, "_doubted", doubted)
        lost.arm(False)  # the pickup's hand-over of ``ahead``: not committed
        b.agents.send(agent.session_id, "ahead")  # committed untaken, ``a`` rung
        _stayed(a, agent, epoch, noted)
        lost.arm()
        assert lost.lost == 1 and followed
        assert noted.contents() == ["first", "ahead", "after"]


def test_a_resume_whose_take_answer_was_lost_gives_its_messages_back(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-DUR-1, R-DUR-2: a resume takes the session's waiting message ``x`` (a
    hand-over); its answer lost after the commit, the resume fails, having run
    nothing. ``x`` used to stay taken by the failed activation: the next one ran
    it flagged ``redelivered`` (a turn of the failed one might have run it). Now
    the failed resume gives it back: it runs once, not redelivered."""
    noted = Noted()
    with _holder(backend, db, noted, monkeypatch) as (a, _b, agent, lost, _cut):
        sid = agent.session_id
        agent.dispose()  # cold: no lease, a checkpoint
        a.sessions.flush()  # nothing of it in flight: the cut is the take's COMMIT
        assert a.store is not None
        lease = a.store.get_lease(sid)
        assert lease is None or lease.holder is None, lease
        a.store.accept(sid, [trusted_message(new_message_id(), "x", None)])
        lost.arm(True)
        with pytest.raises(SubagentError) as err:
            a.agents.resume(sid)
        assert err.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
        lost.arm()
        with contextlib.suppress(SubagentError):  # SESSION_EXISTS: a sweep adopted it
            a.agents.resume(sid)
        assert noted.wait_for(lambda items: len(items) >= 2, 30), noted.items()
        assert a.wait_idle(10)
        assert noted.items() == [("a", "first", False), ("a", "x", False)]
