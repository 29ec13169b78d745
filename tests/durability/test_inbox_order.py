"""The inbox is FIFO across processes too (R-FUP-1, R-FUP-5, L-7): a follow-up
another worker committed for a child this process holds -- or a ``send`` to a
top-level session it holds -- runs before one sent after it here (a child's
report too), even when this process's pickup of the first has not run yet."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from durability_kit import exited, gated_pickup, looked_once, until, worker
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._agents import _mail
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Gate


def test_a_followup_committed_elsewhere_runs_before_one_sent_after_it(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Worker B (not holding the tree) commits m1 for the child and rings A; A's
    pickup is held at a gate; the client then sends m2 to A, which holds the child
    resident. m2 was admitted at once and ran before m1 (the two-servers example
    test saw it now and then). Now A takes m1 ahead of m2, in order."""
    db = str(tmp_path / "o.db")
    pickup, gated = gated_pickup()
    with Runtime(db, backend=backend, keep_warm=60) as a, Runtime(db, backend=backend) as b:
        a.models.register("w", lambda _o: lambda turn: turn.content)
        root = a.spawn("w")
        child = a.subagents.start_continuable(
            ContinuableStartSpec(parent=root, provider="local", prompt="p", label="k", model="w")
        ).child_id
        assert a.wait_idle(10)
        monkeypatch.setattr(_mail.Mailman, "pickup", gated)
        b.subagents.followup(root.session_id, child, "m1")  # committed there, A rung
        a.subagents.followup(root, child, "m2")
        pickup.release()
        for _ in range(200):
            ran = [e.output for e in a.sessions.turn_ends(child)]
            if len(ran) >= 3:
                break
            backend.sleep(0.05)
        assert ran == ["p", "m1", "m2"]


def test_a_send_committed_by_another_process_runs_before_one_sent_after_it(
    backend: Backend, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker process (``mp_worker.py send``) sends ``w-0`` to a top-level session
    this runtime holds: committed to its inbox, taken by nobody, and this runtime
    rung -- its pickup is held at a gate. Then a send here reaches the live agent:
    it was committed taken by the activation and queued at once, ahead of ``w-0``,
    so the two ran in the other order than they were accepted (one sender's two
    sends did the same in the crash soak: the first met the session's activation
    in progress, went through the inbox, and was overtaken by the second). Now the
    agent's follow-up takes the message ahead of it first."""
    pickup, gated = gated_pickup()
    with Runtime(db, backend=backend) as a:
        a.models.register("mark", lambda _o: lambda turn: turn.content)
        root = a.spawn("mark", label="held")
        sid = root.session_id
        monkeypatch.setattr(_mail.Mailman, "pickup", gated)
        marks = str(tmp_path / "marks")
        args = ("send", db, str(sid), "w", "1", "2", marks, backend.name, "30")
        with worker("mp_worker.py", *args) as b:
            assert b.stdout is not None
            assert b.stdout.readline().strip()  # w-0 is committed, and this runtime rung
            a.agents.send(sid, "m2")
            pickup.release()
            assert until(a, lambda: len(a.sessions.turn_ends(sid)) >= 2, timeout=30)
            assert exited(a, b) == 0  # (b waits to see the turns a writes)
        assert [e.output for e in a.sessions.turn_ends(sid)] == ["w-0", "m2"]


def test_a_send_waits_for_a_pickup_that_took_the_messages_before_it(
    backend: Backend, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker process sends ``w-0`` and ``w-1`` to a session this runtime holds;
    this runtime's pickup takes both and is held at a gate before it queues them.
    A send here meanwhile found nothing to take ahead (both taken), so it queued
    its message at once, before the pickup's: two takers of one run of messages,
    each in its own order (``test_processes_sending_to_one_session...`` saw one
    sender's messages swapped now and then). The send now waits for the pickup
    (the agent's taking lock) and runs after both. (In this set-up the turn order
    came out right even without the lock, so the test checks the wait; the split
    showed as swapped turns in the multi-process test.)"""
    queueing = Gate("queueing")
    held = _mail.replay

    def gated(agent: Any, entries: Any, **kw: Any) -> None:
        queueing.pass_through()
        held(agent, entries, **kw)

    with Runtime(db, backend=backend) as a:
        a.models.register("mark", lambda _o: lambda turn: turn.content)
        sid = a.spawn("mark", label="held").session_id
        monkeypatch.setattr(_mail, "replay", gated)
        marks = str(tmp_path / "marks")
        args = ("send", db, str(sid), "w", "2", "3", marks, backend.name, "30")
        with worker("mp_worker.py", *args) as b:
            assert b.stdout is not None
            assert b.stdout.readline().strip() and b.stdout.readline().strip()
            assert queueing.wait_reached(30)  # the pickup took both
            sent = a.backend.spawn(lambda: a.agents.send(sid, "m2"), name="sender")
            # It waits for the pickup: without the lock it queued m2 in this time.
            assert not sent.join(0.5)
            queueing.release()
            assert sent.join(30) and sent.exception is None
            assert until(a, lambda: len(a.sessions.turn_ends(sid)) >= 3, timeout=30)
            assert exited(a, b) == 0  # (b waits to see the turns a writes)
        assert [e.output for e in a.sessions.turn_ends(sid)] == ["w-0", "w-1", "m2"]


def test_a_report_runs_after_a_send_committed_before_it(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-FUP-5, L-5, L-7: runtime ``b`` sends ``m1`` to a top-level session ``a``
    holds (committed to its inbox, taken by nobody, ``a`` rung -- its pickup held
    at a gate); then the session's child, live in ``a``, sends it a waking report.
    The report was committed taken by the parent's activation and queued at once,
    ahead of ``m1``, as a follow-up's own message was before the take-ahead; now it
    takes what was committed ahead of it first, as a follow-up does."""
    pickup, gated = gated_pickup()
    with Runtime(db, backend=backend, keep_warm=60) as a, Runtime(db, backend=backend) as b:
        a.models.register("w", lambda _o: lambda turn: turn.content)
        root = a.spawn("w")
        sid = root.session_id
        child = a.subagents.start_continuable(
            ContinuableStartSpec(parent=root, provider="local", prompt="p", label="k", model="w")
        ).child_id
        assert a.wait_idle(10)
        monkeypatch.setattr(_mail.Mailman, "pickup", gated)
        b.agents.send(sid, "m1")  # committed for a's session, a rung
        a.subagents.report_from(child, "r", delivery="waking")
        pickup.release()
        assert until(a, lambda: len(a.sessions.turn_ends(sid)) >= 2, timeout=30)
        assert [e.output for e in a.sessions.turn_ends(sid)] == ["m1", "r"]


def test_a_followup_committed_behind_one_that_took_ahead_reads_no_inbox(
    backend: Backend, db: str
) -> None:
    """R-FUP-5 (and the follow-up hot path): follow-up ``a`` commits first and is
    held before it is queued; ``b`` commits after it, finds the gap ``a`` left,
    reads the untaken messages past the activation's last place once (none), and
    is queued. ``a`` then follows a place this activation already went past:
    everything committed before it that nobody took was taken by ``b``'s look, so
    it reads nothing. It read the whole pending inbox again -- with concurrent
    senders, nearly once a follow-up. And a look reads only the rows past the last
    place: it read the whole pending inbox, taken messages too, which made
    sixteen producers' acceptances quadratic in the queue. Each runs once, in the
    order each was queued."""
    committed = Gate("committed")
    with Runtime(db, backend=backend) as rt:
        agent = looked_once(rt)
        sid = agent.session_id
        sessions: Any = rt.sessions
        accept, untaken, pending = sessions.accept, sessions.untaken, sessions.pending
        reads: list[tuple[Any, ...]] = []
        whole: list[object] = []

        def held_accept(*args: Any, **kw: Any) -> Any:
            done = accept(*args, **kw)
            if args[1][0].content == "a":
                committed.pass_through()
            return done

        def counted_untaken(*args: Any, **kw: Any) -> Any:
            reads.append(args)
            return untaken(*args, **kw)

        def counted_pending(*args: Any, **kw: Any) -> Any:
            whole.append(args)
            return pending(*args, **kw)

        sessions.accept, sessions.untaken = held_accept, counted_untaken
        sessions.pending = counted_pending
        first = rt.backend.spawn(lambda: agent.followup("a"), name="a")
        assert committed.wait_reached(10)
        agent.followup("b")
        assert reads == [(sid, 1)]  # b's look behind the gap a left, past m0's place
        committed.release()
        assert first.join(10) and first.exception is None
        assert agent.wait_idle(10)
        assert len(reads) == 1
        assert whole == []
        assert [e.output for e in rt.sessions.turn_ends(sid)] == ["m0", "b", "a"]
