"""A report by the child's id (issue 17 point 4), both backends, SQLite and PostgreSQL.

``runtime.subagents.report_from(child_id, ...)``: the caller vouches for a
continuable child that need not be live (it settled, or lives in no process),
and the report reaches the child's direct parent as a report from the live
child's Agent does -- delivered at once to a live parent, kept in the durable
inbox of a parent that is not live and delivered at its next activation, once.
"""

from __future__ import annotations

from typing import Any

import pytest
from durability_kit import Noted, settled_child
from subagents.actors import AbortSignal, ContinuableStartSpec, Runtime, SubagentStartRequest
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, MessageSource, ReportEvent, SessionId, SubagentError


def _reports(rt: Runtime, parent_id: str) -> list[ReportEvent]:
    rt.sessions.flush()
    records = rt.sessions.read(SessionId(parent_id))
    return [r.event for r in records if isinstance(r.event, ReportEvent)]


def test_a_settled_child_reports_by_id_to_its_live_parent(backend: Backend, db: str) -> None:
    """Waking, by id: one later turn of the live parent, sourced from the child; the
    receipt names the turn; the same ``message_id`` again queues nothing."""
    noted = Noted()
    with Runtime(db, backend=backend) as rt:
        noted.register(rt, "p")
        parent = rt.spawn("note", label="parent")
        child_id = settled_child(rt, parent)
        mid = rt.subagents.report_from(child_id, "done", delivery="waking", message_id="a" * 32)
        again = rt.subagents.report_from(child_id, "done", delivery="waking", message_id="a" * 32)
        assert mid == again == "a" * 32
        assert noted.wait_for(lambda items: ("p", "done", False) in items)
        assert rt.wait_idle(10)
        assert noted.contents() == ["done"]  # once
        (report,) = _reports(rt, parent.session_id)
        assert report.source == MessageSource(kind="child", session_id=child_id)
        receipt = rt.subagents.report_receipt(child_id, mid)
        assert (receipt.status, receipt.turn) == ("delivered", 0)


def test_by_id_to_a_parent_not_live_is_kept_and_delivered(backend: Backend, db: str) -> None:
    """Neither the child nor its parent is live: a waking report activates the
    parent (from its recorded model) and runs once; a quiet one waits, pending,
    for the parent's next turn after a restart."""
    noted = Noted()
    with Runtime(db, backend=backend) as rt:
        noted.register(rt, "one")
        parent = rt.spawn("note", label="parent")
        parent_id = parent.session_id
        child_id = settled_child(rt, parent)
        parent.dispose()
        quiet = rt.subagents.report_from(child_id, "fyi")
        assert rt.subagents.report_receipt(child_id, quiet).status == "pending"
        woke = rt.subagents.report_from(child_id, "wake up", delivery="waking")
        assert noted.wait_for(lambda items: any(c == "wake up" for _, c, _ in items))
        assert rt.wait_idle(10)
        assert rt.subagents.report_receipt(child_id, woke).status == "delivered"
    seen: list[tuple[Any, tuple[Any, ...]]] = []
    with Runtime(db, backend=backend) as rt:

        def watch(_options: Any) -> Any:
            def on_turn(turn: Any) -> Any:
                seen.append((turn.content, tuple(m.content for m in turn.context)))

            return on_turn

        rt.models.register("note", watch)
        again = rt.agents.get(parent_id) or rt.agents.resume(parent_id)
        again.followup("next")
        assert again.wait_idle(10)
        # The waking turn consumed the quiet report as its context, or the next does.
        assert [c for c, _ in seen] == ["next"]
        assert noted.contents() == ["wake up"]
        assert rt.subagents.report_receipt(child_id, quiet).status == "delivered"
        assert [r.message_id for r in _reports(rt, parent_id)] == [quiet, woke]


def test_what_may_not_report_by_id(backend: Backend, db: str) -> None:
    """A top-level session and a one-shot child are refused (``UNAUTHORIZED``); an
    unknown session is ``SESSION_NOT_FOUND``; a malformed id or a value that is
    neither an Agent nor an id is ``INVALID_ARGUMENT``; nothing is delivered."""
    with Runtime(db, backend=backend) as rt:
        parent = rt.spawn("echo", label="parent")
        run = rt.subagents.start(
            "local",
            SubagentStartRequest(
                parent=parent, prompt="one", signal=AbortSignal.never(), model="echo"
            ),
        )
        run.result.get(10)
        one_shot = run.id
        run.dispose()
        for target, code in (
            (parent.session_id, ErrorCode.UNAUTHORIZED),
            (one_shot, ErrorCode.UNAUTHORIZED),
            ("0" * 32, ErrorCode.SESSION_NOT_FOUND),
            ("nothex", ErrorCode.INVALID_ARGUMENT),
            (42, ErrorCode.INVALID_ARGUMENT),
        ):
            with pytest.raises(SubagentError) as err:
                rt.subagents.report_from(target, "r", delivery="waking")  # type: ignore[arg-type]
            assert err.value.code == code, target
        assert rt.wait_idle(10)
        assert _reports(rt, parent.session_id) == []


def test_relaxed_by_id_needs_a_live_parent(backend: Backend, tmp_path: Any) -> None:
    """Relaxed durability keeps nothing for later: a parent that is not live refuses
    (``UNAUTHORIZED``); a live one receives the report."""
    with Runtime(str(tmp_path / "r.db"), backend=backend, durability="relaxed") as rt:
        parent = rt.spawn("echo", label="parent")
        child_id = settled_child(rt, parent)
        rt.subagents.report_from(child_id, "ok", delivery="waking")
        assert parent.wait_idle(10)
        parent.dispose()
        with pytest.raises(SubagentError) as err:
            rt.subagents.report_from(child_id, "lost", delivery="quiet")
        assert err.value.code == ErrorCode.UNAUTHORIZED
        assert [e.content for e in _reports(rt, parent.session_id)] == ["ok"]


def test_a_resident_child_reports_by_id(backend: Backend, db: str) -> None:
    """The child kept warm (resident, idle): by id is the same as by its Agent."""
    noted = Noted()
    with Runtime(db, backend=backend, keep_warm=float("inf")) as rt:
        noted.register(rt, "p")
        parent = rt.spawn("note", label="parent")
        child_id = rt.subagents.start_continuable(
            ContinuableStartSpec(
                parent=parent, provider="local", prompt="hi", label="kid", model="echo"
            )
        ).child_id
        assert rt.wait_idle(10)
        assert rt.agents.get(child_id) is not None  # resident
        mid = rt.subagents.report_from(child_id, "from warm", delivery="waking")
        assert noted.wait_for(lambda items: ("p", "from warm", False) in items)
        assert rt.wait_idle(10)
        assert rt.subagents.report_receipt(child_id, mid).status == "delivered"
        (report,) = _reports(rt, parent.session_id)
        assert report.source == MessageSource(kind="child", session_id=child_id)
