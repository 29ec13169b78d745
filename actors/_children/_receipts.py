"""Durable reports (L-9) and their read receipts (L-10).

Under strict durability a report is committed to the parent's durable inbox.
When the parent is live it is delivered at once; when it is not -- it is leaving
residency, or lives in no process right now -- it stays there and is delivered
when the parent is next live (its resume replays it: a quiet report as context
of the next turn, a waking one as a turn of its own), exactly once.

A receipt is read from the parent's log and inbox: a report is *delivered* once
a parent turn consumed it -- the turn whose ``turn/start`` its ``report`` event
follows in the parent's log -- and no longer waits in the inbox; *pending* while
it waits; *unknown* when the parent never accepted it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from subagents.actors._agents import SessionService
from subagents.actors._kernel import ring
from subagents.protocol import (
    ErrorCode,
    MessageId,
    ReportEvent,
    SessionId,
    SubagentError,
    TurnStart,
)

__all__ = ["ReportReceipt", "keep_report", "report_receipt"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportReceipt:
    """What became of one report: ``status`` is ``"delivered"`` (``turn`` is the
    parent turn that consumed it), ``"pending"`` (accepted, waiting for the
    parent) or ``"unknown"`` (the parent never accepted it)."""

    message_id: MessageId
    parent_session: SessionId
    status: Literal["delivered", "pending", "unknown"]
    turn: int | None = None


def keep_report(sessions: SessionService, parent_id: SessionId, event: ReportEvent) -> None:
    """Commit a report for a parent that is not live here, taken by nobody, and ring:
    the parent's holder if another process has it live (its pickup delivers it),
    else this runtime's own mail pickup, which activates the parent for a waking
    report (a quiet one waits for the parent's next turn, wherever it runs)."""
    sessions.accept(parent_id, (event,))
    if sessions.leases is not None:
        ring(sessions.wake_address(parent_id) or sessions.leases.wake, parent_id.to_bytes())


def report_receipt(
    sessions: SessionService, child_id: SessionId, message_id: MessageId
) -> ReportReceipt:
    """The receipt of ``child_id``'s report ``message_id`` (see the module docstring).

    Raises:
        SubagentError: ``SESSION_NOT_FOUND``; ``UNAUTHORIZED`` when ``child_id``
            is not a subagent (it has no parent to report to).
    """
    header = sessions.header(child_id)
    if header is None:
        raise SubagentError(f"no session {child_id}", code=ErrorCode.SESSION_NOT_FOUND)
    parent = header.parent_session
    if parent is None:
        raise SubagentError(
            f"session {child_id} has no parent to report to", code=ErrorCode.UNAUTHORIZED
        )
    if sessions.strict and sessions.live(parent) is not None:
        sessions.flush(parent)  # a turn's end (and its "done") is written behind
    turn: int | None = None
    consumed = False
    current: int | None = None
    for record in sessions.read(parent):
        event = record.event
        if isinstance(event, TurnStart):
            current = event.turn
        elif (
            isinstance(event, ReportEvent)
            and event.message_id == message_id
            and event.source is not None
            and event.source.session_id == child_id
        ):
            consumed, turn = True, current
    waiting = sessions.strict and any(e.message_id == message_id for e in sessions.pending(parent))
    if waiting:
        return ReportReceipt(message_id=message_id, parent_session=parent, status="pending")
    if consumed:
        return ReportReceipt(
            message_id=message_id, parent_session=parent, status="delivered", turn=turn
        )
    return ReportReceipt(message_id=message_id, parent_session=parent, status="unknown")
