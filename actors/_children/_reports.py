"""Reports from a continuable child to its parent: delivery, durability, receipts.

``report_from`` checks that the caller is the exact live continuable child (the
registry publishes its Activation and phase) and delivers to the direct parent:
a quiet report becomes context of the parent's next turn, a waking one a turn of
its own.

Under strict durability (L-9) a report is committed to the parent's durable inbox
first. When the parent is live it is delivered at once; when it is not -- it is
leaving residency, or lives in no process right now -- it stays there and is
delivered when the parent is next live (its resume replays it), exactly once.
Relaxed, the parent must be live (``UNAUTHORIZED``).

By id (``report_from(child_id, ...)``) the caller vouches for the child, as a
follow-up by the parent's id vouches for the parent: a server relaying a report
for a child that settled, or lives in no process. The session must be a
continuable subagent (its descriptor says so); it need not be live, and the
report is delivered to its direct parent as above.

A receipt (L-10) is read from the parent's log and inbox: a report is
*delivered* once a parent turn consumed it -- the turn whose ``turn/start`` its
``report`` event follows in the parent's log -- and no longer waits in the inbox;
*pending* while it waits; *unknown* when the parent never accepted it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from subagents.actors._agents import Agent, SessionService, committed_at, kept
from subagents.actors._kernel import AbortSignal, Telemetry, stamp
from subagents.protocol import (
    ErrorCode,
    MessageId,
    MessageSource,
    ReportEvent,
    SessionId,
    SubagentError,
    TurnStart,
    check_value,
    new_message_id,
    try_fold_subagent_descriptor,
)
from subagents.supervision import MAY_REPORT, Activation

from ._validate import bad, check_signal

__all__ = ["ReportReceipt", "report_from", "report_receipt"]

logger = logging.getLogger("subagents")

_NEVER = AbortSignal.never()


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportReceipt:
    """What became of one report: ``status`` is ``"delivered"`` (``turn`` is the
    parent turn that consumed it), ``"pending"`` (accepted, waiting for the
    parent) or ``"unknown"`` (the parent never accepted it)."""

    message_id: MessageId
    parent_session: SessionId
    status: Literal["delivered", "pending", "unknown"]
    turn: int | None = None


def report_from(
    sessions: SessionService,
    index: Mapping[SessionId, Activation],
    live: Callable[[SessionId], Agent | None],
    is_live: Callable[[object], bool],
    child: Any,
    content: Any,
    *,
    hosted: Mapping[SessionId, Agent] | None = None,
    delivery: str = "quiet",
    signal: Any = None,
    message_id: Any = None,
    telemetry: Telemetry | None = None,
) -> MessageId:
    """Deliver a report from ``child`` -- the live child's Agent, or a continuable
    child's session id -- (see the module docstring); its message id.

    ``index`` is the registry's published Activation index; ``live`` and
    ``is_live`` are the agent registry's ``get`` and exact-liveness check;
    ``hosted``: the children this runtime hosts for parents elsewhere.
    """
    if not isinstance(child, (Agent, str)):
        raise bad("child must be an Agent or a session id")
    if type(delivery) is not str or delivery not in ("quiet", "waking"):
        raise bad("delivery is 'quiet' or 'waking'")
    check_signal(signal)
    # Refuse what the log cannot hold before anything is accepted; a quiet report may
    # wait for the parent's next turn in its checkpoint (map, context list, entry).
    check_value(content, 3 if delivery == "quiet" else 1)
    (signal or _NEVER).raise_if_aborted()
    if isinstance(child, Agent) and hosted and hosted.get(child.session_id) is child:
        # Placed here by a parent elsewhere (no Activation here; resumed as a
        # continuable child, so its header names its durable parent).
        above = child.parent_session
        if above is None or not is_live(child):
            raise _unauthorized("only an exact live continuable child may report")
        child_id, parent_id = child.session_id, above
    elif isinstance(child, Agent):
        act = index.get(child.session_id)
        exact = act is not None and act.agent is child and act.phase in MAY_REPORT
        if act is None or not exact or not is_live(child):
            raise _unauthorized("only an exact live continuable child may report")
        child_id, parent_id = child.session_id, act.parent_session
    else:
        child_id = SessionId(child)
        parent_id = _vouched_parent(sessions, index, child_id)
    source = stamp(telemetry, MessageSource(kind="child", session_id=child_id))
    mid = new_message_id() if message_id is None else MessageId(message_id)
    event = ReportEvent(message_id=mid, content=content, source=source, delivery=delivery)
    return _deliver(
        sessions, live(parent_id), is_live, parent_id, event, message_id is not None,
        signal or _NEVER,
    )  # fmt: skip


def _vouched_parent(
    sessions: SessionService, index: Mapping[SessionId, Activation], child_id: SessionId
) -> SessionId:
    """The direct parent of the continuable child ``child_id`` (a report by id).

    Resident, its Activation says so; otherwise its header and descriptor (read
    from where the descriptor is appended, after any fork seed).
    """
    act = index.get(child_id)
    if act is not None and act.phase in MAY_REPORT:
        return act.parent_session
    header = sessions.header(child_id)
    if header is None:
        raise SubagentError(f"no session {child_id}", code=ErrorCode.SESSION_NOT_FOUND)
    if header.origin != "subagent" or header.parent_session is None:
        raise _unauthorized(f"session {child_id} is not a subagent")
    records = sessions.read(child_id, header.seed_len)
    fold = try_fold_subagent_descriptor(r.event for r in records)
    if fold.verdict != "ok" or getattr(fold.descriptor, "mode", None) != "continuable":
        raise _unauthorized(f"session {child_id} is not a continuable child")
    return header.parent_session


def _deliver(
    sessions: SessionService,
    parent: Agent | None,
    is_live: Callable[[object], bool],
    parent_id: SessionId,
    event: ReportEvent,
    deduplicate: bool,
    signal: AbortSignal,
) -> MessageId:
    """Deliver ``event`` to the parent (live here, or kept in its durable inbox);
    ``deduplicate``: a caller's ``message_id``, deduplicated (relaxed: a repeat
    while its report is under way waits for its outcome, ``signal`` aborting
    the wait)."""
    mid = event.message_id
    if parent is not None and sessions.strict and parent.session.replay_due:
        # Resumed, its replay not queued yet: queued now, this report would run
        # ahead of what the parent accepted before it (the report that woke it,
        # say). Kept, the pickup queues it after the replay (see _agents._ahead).
        parent = None
    if parent is None or not is_live(parent):
        if not sessions.strict:
            raise _unauthorized("the direct parent is not live")
        _keep(sessions, parent_id, event)
        return mid
    if sessions.strict:  # (an answer lost: in doubt, settled from the store)
        accepted = parent._commit_event(event)
        if accepted.duplicate:
            return mid
        # What was committed before it that nobody took yet runs first (FIFO), as
        # for a follow-up; and the next follow-up finds no gap to look behind.
        with committed_at(sessions, parent, accepted):
            return _offer(sessions, parent, event, accepted.at)
    if deduplicate:
        # A repeat of an id under way waits for its outcome (the parent leaving
        # meanwhile accepts nothing): see SessionService.once.
        live = parent
        return sessions.once(
            parent.session_id,
            mid,
            lambda: _offer(sessions, live, event),
            lambda: mid,
            signal,
        )
    return _offer(sessions, parent, event)


def _offer(
    sessions: SessionService, parent: Agent, event: ReportEvent, accepted_at: float | None = None
) -> MessageId:
    """Hand ``event`` to its live ``parent``. Under strict durability it was committed
    first (at ``accepted_at``): refused, it is taken back and the refusal raised --
    unless it stays accepted (the parent leaving, a retraction the store could not
    make, another acceptance of its id answered for since: see ``kept``); then it
    runs where the parent is next held, and its id is returned."""
    mid = event.message_id
    try:
        if event.delivery == "quiet":
            parent.inject_quiet(event.content, event.source, mid)
        else:
            parent.deliver(event.content, event.source, kind="report", message_id=mid)
    except BaseException as exc:
        leaving = isinstance(exc, SubagentError) and exc.code == ErrorCode.AGENT_DISPOSED
        if sessions.strict and leaving:
            _give_back(sessions, parent, mid)  # kept, untaken again: the next activation's
            return mid
        if sessions.strict and kept(
            sessions, parent.session_id, mid, exc, accepted_at, parent.session
        ):
            # In the inbox, taken by an activation that will not run it: given back
            # to nobody, for the pickup or the parent's next activation (which
            # would run it anyway, as one that may have run before).
            _give_back(sessions, parent, mid, quiet=True)
            if isinstance(exc, Exception):  # (an interrupt of the caller still is one)
                return mid
        if leaving:
            raise _unauthorized("the direct parent is leaving residency") from None
        raise
    return mid


def _unauthorized(message: str) -> SubagentError:
    return SubagentError(message, code=ErrorCode.UNAUTHORIZED)


def _give_back(
    sessions: SessionService, parent: Agent, message_id: MessageId, quiet: bool = False
) -> None:
    """Give a report ``parent``'s activation took and will not run back to nobody; a
    failure is logged (``quiet``: at debug level -- what kept it said so already)."""
    token = parent.session.token
    if token is None:
        return
    try:
        sessions.give_back(parent.session_id, [message_id], token[1])
    except SubagentError:
        log = logger.debug if quiet else logger.warning
        log("could not keep %s for %s", message_id, parent.session_id, exc_info=True)


def _keep(sessions: SessionService, parent_id: SessionId, event: ReportEvent) -> None:
    """Commit a report for a parent that is not live here, taken by nobody, and ring:
    the parent's holder if another process has it live (its pickup delivers it),
    else this runtime's own mail pickup, which activates the parent for a waking
    report (a quiet one waits for the parent's next turn, wherever it runs)."""
    sessions.accept(parent_id, (event,))
    if sessions.leases is None:
        return
    other = sessions.wake_address(parent_id)
    if other is not None:
        sessions.ring(other, parent_id.to_bytes())  # a doorbell, or NOTIFY through the store
    else:
        sessions.wake_pickup(parent_id)


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
