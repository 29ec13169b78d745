"""Durable reports and read receipts (L-9, L-10, issue 13 point 5), both backends.

Under strict durability a report to a parent that is not live is kept in the
parent's durable inbox and delivered when the parent is next live -- a waking
report as a turn of its own, a quiet one as context of the next turn -- once.
The child reads its receipt: pending, then delivered with the parent turn that
consumed it.
"""

from __future__ import annotations

from typing import Any

import pytest
from durability_kit import Noted
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel import Gate
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, MessageId, ReportEvent, SubagentError


def _reporter(rt: Runtime, gate: Gate, sent: list[MessageId], delivery: str) -> None:
    """A child model whose first turn waits at ``gate``, then reports."""

    def factory(_options: Any) -> Any:
        def on_turn(turn: Any) -> Any:
            if turn.index == 0:
                gate.pass_through(turn.signal)  # the test disposes the parent meanwhile
                sent.append(turn.subagents.report(f"{delivery} partial", delivery=delivery))
            return None

        return on_turn

    rt.models.register("reporter", factory)


def _start_and_orphan(
    rt: Runtime, gate: Gate, sent: list[MessageId], delivery: str
) -> tuple[Any, Any]:
    """A parent, its reporting child, and the parent disposed while the child runs
    (a continuable child outlives its parent's agent: it is the runtime's)."""
    _reporter(rt, gate, sent, delivery)
    parent = rt.spawn("note", label="parent")
    child = rt.subagents.start_continuable(
        ContinuableStartSpec(
            parent=parent, provider="local", prompt="go", label="kid", model="reporter"
        )
    ).child_id
    assert gate.wait_reached()
    parent.dispose()
    gate.release()
    assert rt.wait_idle(10)
    assert len(sent) == 1
    return parent.session_id, child


def _watch(rt: Runtime, seen: list[tuple[Any, tuple[Any, ...]]]) -> None:
    def watch(_options: Any) -> Any:
        def on_turn(turn: Any) -> Any:
            seen.append((turn.content, tuple(m.content for m in turn.context)))
            return None

        return on_turn

    rt.models.register("note", watch, replace=True)


def test_a_waking_report_to_a_parent_gone_wakes_it(backend: Backend, db: str) -> None:
    """Issue 13 point 5: a waking report to a parent that is not live is accepted,
    and starts a turn: the parent, held by nobody, is activated for it (here,
    from its recorded model) and runs it once; the receipt names the turn."""
    noted = Noted()
    gate = Gate("child running")
    sent: list[MessageId] = []
    with Runtime(db, backend=backend) as rt:
        noted.register(rt, "one")
        parent_id, child_id = _start_and_orphan(rt, gate, sent, "waking")
        assert noted.wait_for(lambda items: ("one", "waking partial", False) in items)
        assert rt.wait_idle(10)
        receipt = rt.subagents.report_receipt(child_id, sent[0])
        assert (receipt.status, receipt.turn, receipt.parent_session) == (
            "delivered",
            0,
            parent_id,
        )
    seen: list[tuple[Any, tuple[Any, ...]]] = []
    with Runtime(db, backend=backend) as rt:
        _watch(rt, seen)
        parent = rt.agents.resume(parent_id)
        parent.followup("later")
        assert parent.wait_idle(10)
        assert seen == [("later", ())]  # delivered once
        assert rt.subagents.report_receipt(child_id, sent[0]).turn == 0
        assert rt.store is not None
        logged = [r.event for r in rt.store.read(parent_id) if isinstance(r.event, ReportEvent)]
        assert [e.message_id for e in logged] == sent
    assert noted.items() == [("one", "waking partial", False)]


def test_a_quiet_report_to_a_parent_gone_is_context_of_its_next_turn(
    backend: Backend, db: str
) -> None:
    """Issue 13 point 5: a quiet report to a parent that is not live is accepted
    (receipt pending), wakes nobody, and is context of the parent's next turn
    after its resume in a new runtime -- once; the receipt then names that turn."""
    gate = Gate("child running")
    sent: list[MessageId] = []
    with Runtime(db, backend=backend) as rt:
        Noted().register(rt, "one")
        parent_id, child_id = _start_and_orphan(rt, gate, sent, "quiet")
        receipt = rt.subagents.report_receipt(child_id, sent[0])
        assert (receipt.status, receipt.parent_session) == ("pending", parent_id)
        assert rt.agents.get(parent_id) is None
    seen: list[tuple[Any, tuple[Any, ...]]] = []
    with Runtime(db, backend=backend) as rt:
        _watch(rt, seen)
        parent = rt.agents.resume(parent_id)
        assert parent.wait_idle(10)
        assert seen == []
        assert rt.subagents.report_receipt(child_id, sent[0]).status == "pending"
        parent.followup("next")
        parent.followup("later")
        assert parent.wait_idle(10)
        assert seen == [("next", ("quiet partial",)), ("later", ())]
        receipt = rt.subagents.report_receipt(child_id, sent[0])
        assert (receipt.status, receipt.turn) == ("delivered", 0)


def test_receipts_of_unknown_reports_and_bad_ids(backend: Backend, db: str) -> None:
    """Issue 13 point 5: a report the parent never accepted is ``unknown``; a
    top-level session has no parent (``UNAUTHORIZED``); an unknown session is
    ``SESSION_NOT_FOUND``."""
    with Runtime(db, backend=backend) as rt:
        parent = rt.spawn("echo")
        child = rt.subagents.start_continuable(
            ContinuableStartSpec(
                parent=parent, provider="local", prompt="hi", label="kid", model="echo"
            )
        ).child_id
        other = MessageId("ab" * 16)
        assert rt.subagents.report_receipt(child, other).status == "unknown"
        for target, code in (
            (parent.session_id, ErrorCode.UNAUTHORIZED),
            ("0" * 32, ErrorCode.SESSION_NOT_FOUND),
        ):
            with pytest.raises(SubagentError) as err:
                rt.subagents.report_receipt(target, other)
            assert err.value.code == code
        with pytest.raises(SubagentError) as err:
            rt.subagents.report_receipt(child, "nope")
        assert err.value.code == ErrorCode.INVALID_ARGUMENT


def test_a_report_to_a_live_parent_has_a_receipt_naming_its_turn(backend: Backend, db: str) -> None:
    """Issue 13 point 5: the common case -- a waking report to a live parent is
    delivered as the parent's next turn and its receipt names that turn."""
    with Runtime(db, backend=backend, keep_warm=float("inf")) as rt:
        parent = rt.spawn("echo")
        handle = rt.subagents.start_continuable(
            ContinuableStartSpec(
                parent=parent, provider="local", prompt="hi", label="kid", model="echo"
            )
        )
        assert rt.wait_idle(10)
        parent.followup("first")
        assert parent.wait_idle(10)
        child = rt.agents.get(handle.child_id)  # kept warm: resident
        assert child is not None
        mid = rt.subagents.report_from(child, "done", delivery="waking")
        assert rt.wait_idle(10)
        receipt = rt.subagents.report_receipt(child, mid)
        assert (receipt.status, receipt.turn) == ("delivered", 1)
