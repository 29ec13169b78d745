"""A message given back by an activation whose lease moved on runs once (L-7, L-8,
R-DUR-*, R-REP-*), both backends, SQLite and PostgreSQL.

Found by the crash soak (PostgreSQL, stalls): a child reported quietly to its
parent, live in the same worker; the report was committed, taken by the parent's
activation, and as it was handed over the parent's lease lapsed (another worker,
stopped while it held the parent's row lock, had held up this worker's writes
past the ttl) and was taken over. The new holder's resume read the report as
taken by the old activation and replayed it as context of its next turn. The old
one, its parent agent disposed as it lost the lease, gave the report back to
nobody (``DurableQueues.give_back``, which no fence guards) -- and the new
holder's next follow-up took it again from the inbox as a message nobody had
taken: the report twice in one turn's context (a waking report or a message
would have run twice). A give-back now leaves a message alone once a later
activation took the lease.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from durability_kit import settled_child
from pgcluster import outside_sql
from subagents.actors import Runtime
from subagents.actors._agents._sessions import SessionService
from subagents.actors._kernel._backend import Backend
from subagents.protocol import (
    ErrorCode,
    MessageEvent,
    ReportEvent,
    SessionId,
    SubagentError,
    new_message_id,
)


@contextmanager
def _two_and_a_parent(backend: Backend, db: str, watch: Any) -> Iterator[tuple[Any, ...]]:
    """``(a, b, parent, child_id)``: two runtimes on ``db`` with the ``watch`` model;
    ``a`` holds ``parent``, whose continuable child ran its prompt and settled."""
    with Runtime(db, backend=backend) as a, Runtime(db, backend=backend) as b:
        for rt in (a, b):
            rt.models.register("watch", watch)
        parent = a.spawn("watch", label="parent")
        yield a, b, parent, settled_child(a, parent)


def _taken_over(db: str, b: Runtime, pid: Any, taken_over: list[Any], error: Exception) -> Any:
    """A hook for ``a``'s delivery to the parent: the parent's lease lapses in the
    store, ``b`` takes the parent over (noted in ``taken_over``; it replays what
    ``a``'s activation took), and the delivery fails with ``error``."""

    def hook(*_args: Any, **_kwargs: Any) -> None:
        outside_sql(
            db,
            "UPDATE leases SET holder = NULL, expires = 0 WHERE session = ?",
            SessionId(pid).to_bytes(),
        )
        taken_over.append(b.agents.resume(pid))
        raise error

    return hook


def _logged_once(b: Runtime, pid: Any, mid: str) -> None:
    """The parent's log holds the report once, and nothing stays pending."""
    b.sessions.flush()
    logged = [r.event for r in b.sessions.read(SessionId(pid))]
    assert [e.message_id for e in logged if isinstance(e, ReportEvent)] == [mid]
    assert b.store is not None and b.store.pending(pid) == []


def test_a_quiet_report_given_back_after_a_takeover_is_context_once(
    backend: Backend, db: str
) -> None:
    """Runtime ``a`` holds the parent; its quiet report is committed (taken by
    ``a``'s activation) and, as ``a`` hands it over, ``b`` takes the parent over
    (the lease freed in the store: it lapsed) and ``a``'s parent agent is found
    disposed. ``b``'s next turn has the report in its context once (it had it
    twice: replayed, then taken again by the follow-up's take-ahead), the log
    holds it once, and nothing stays pending."""
    contexts: list[tuple[Any, tuple[Any, ...]]] = []

    def watch(_options: Any) -> Any:
        def on_turn(turn: Any) -> Any:
            contexts.append((turn.content, tuple(m.message_id for m in turn.context)))
            return "ok"

        return on_turn

    with _two_and_a_parent(backend, db, watch) as (a, b, parent, child_id):
        pid = parent.session_id
        mid = "b" * 32
        taken_over: list[Any] = []

        # Committed by a's activation; now its lease lapses, b takes the parent over
        # (replaying the report), and a's agent is found leaving.
        disposed = SubagentError("agent is disposed", code=ErrorCode.AGENT_DISPOSED)
        parent.inject_quiet = _taken_over(db, b, pid, taken_over, disposed)  # type: ignore[method-assign]
        assert a.subagents.report_from(child_id, "fyi", message_id=mid) == mid
        (again,) = taken_over
        again.followup("next")
        assert again.wait_idle(10)
        assert [(c, ctx.count(mid)) for c, ctx in contexts] == [("next", 1)]
        _logged_once(b, pid, mid)


def test_a_waking_report_refused_after_a_takeover_stays_accepted(backend: Backend, db: str) -> None:
    """As above, but ``a``'s parent refuses the waking report for a reason of its own
    (here ``ADMISSION_CLOSED``), after ``b`` took the parent over and replayed the
    report as a turn. Its retraction by ``a``'s old epoch used to delete it from
    the inbox and ``report_from`` raised -- nothing accepted, the caller was told
    -- while ``b`` ran it. Now it stays accepted: ``report_from`` returns its id
    and ``b`` runs it once."""
    ran: list[Any] = []

    def watch(_options: Any) -> Any:
        def on_turn(turn: Any) -> Any:
            ran.append((turn.content, turn.redelivered))
            return "ok"

        return on_turn

    with _two_and_a_parent(backend, db, watch) as (a, b, parent, child_id):
        pid = parent.session_id
        mid = "c" * 32
        taken_over: list[Any] = []

        closed = SubagentError("admission is closed", code=ErrorCode.ADMISSION_CLOSED)
        parent.deliver = _taken_over(db, b, pid, taken_over, closed)  # type: ignore[method-assign]
        assert a.subagents.report_from(child_id, "fyi", delivery="waking", message_id=mid) == mid
        (again,) = taken_over
        assert again.wait_idle(10)
        assert ran == [("fyi", True)]
        _logged_once(b, pid, mid)


def test_a_message_taken_back_as_a_resume_reads_it_does_not_run(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A resume read the session's inbox -- a message nobody took -- and, before its
    hand-over, the process that committed the message took it back (its delivery
    failed; its caller is told nothing was accepted). The hand-over takes nothing;
    the resume used to replay the message all the same, from what it had read: it
    ran, though its caller was told it was refused. Now the resume replays only
    what it holds (taken now, or taken by an earlier activation)."""
    ran: list[Any] = []

    def watch(_options: Any) -> Any:
        def on_turn(turn: Any) -> Any:
            ran.append(turn.content)
            return "ok"

        return on_turn

    # adopt=False: the session waits with nobody holding it, and a sweep of this
    # runtime's own (a second after it opened, on a slow box) must not take it first.
    with Runtime(db, backend=backend, adopt=False) as rt:
        rt.models.register("watch", watch)
        agent = rt.spawn("watch", label="root")
        sid = agent.session_id
        agent.dispose()
        assert rt.store is not None
        (gone, kept) = (MessageEvent(message_id=new_message_id(), content=c) for c in "gk")
        rt.store.accept(sid, [gone, kept])
        real = SessionService.hand_over

        def hand_over(self: Any, session_id: Any, message_ids: Any, live: Any) -> Any:
            # The committing process takes ``gone`` back now (it never held the session).
            assert self.persistence.retract(session_id, gone.message_id)
            return real(self, session_id, message_ids, live)

        monkeypatch.setattr(SessionService, "hand_over", hand_over)
        again = rt.agents.resume(sid)
        monkeypatch.setattr(SessionService, "hand_over", real)
        assert again.wait_idle(10)
        assert ran == ["k"]
        rt.sessions.flush()
        assert rt.store.pending(sid) == []
