"""``AgentRegistry.send`` to a top-level session that is not live here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from subagents.actors._kernel._telemetry import Telemetry, stamp, traced
from subagents.protocol import (
    ErrorCode,
    MessageId,
    MessageSource,
    SessionId,
    SubagentError,
    check_value,
    trusted_message,
)

from ._agent import Agent
from ._followups import USER
from ._mail import wake_holder
from ._sessions import SessionService

__all__ = ["send_unheld", "subagent_refused"]


def send_unheld(
    sessions: SessionService,
    get: Callable[[SessionId], Agent | None],
    resume_top: Callable[[SessionId], Agent],
    sid: SessionId,
    content: Any,
    source: MessageSource | None,
    mid: MessageId,
    telemetry: Telemetry | None = None,
) -> MessageId:
    """Send ``content`` to ``sid``, a session not live here (or leaving): see
    ``AgentRegistry.send``; ``get`` and ``resume_top`` are the registry's. Traced
    as a follow-up where the message is committed here (it carries the span to
    whichever process runs it); otherwise the resumed agent's follow-up traces it."""
    header = sessions.header(sid)
    if header is None:
        raise SubagentError(f"no session {sid}", code=ErrorCode.SESSION_NOT_FOUND)
    if header.parent_session is not None:
        raise subagent_refused(sid)
    if not sessions.strict or sessions.leases is None:
        try:
            agent = resume_top(sid)
        except SubagentError as exc:
            found = get(sid)
            if exc.code != ErrorCode.SESSION_EXISTS or found is None:
                raise
            agent = found
        return agent.followup(content, source=source, message_id=mid)
    check_value(content)  # refuse what the log cannot hold before anything is accepted

    def commit(src: MessageSource | None) -> MessageId:
        (accepted,) = sessions.accept(sid, [trusted_message(mid, content, src)])
        if accepted.duplicate:
            return mid
        try:
            resume_top(sid)  # its replay runs the message
        except SubagentError as exc:
            if exc.code == ErrorCode.LEASE_HELD:
                wake_holder(sessions, exc, sid)
            elif exc.code == ErrorCode.SESSION_EXISTS:
                # Live here since we looked: its pickup takes what nobody took.
                sessions.wake_pickup(sid)
            elif sessions.retract(sid, mid, accepted_at=accepted.at):
                raise
            # Not ours to take back (a duplicate acceptance answered for it, or it
            # was taken meanwhile): it stays accepted.
        return mid

    if telemetry is None:
        return commit(source)
    src = USER if source is None else source
    return traced(
        telemetry, "subagents.followup", {"session_id": sid}, lambda: commit(stamp(telemetry, src))
    )


def subagent_refused(sid: SessionId) -> SubagentError:
    """``UNAUTHORIZED``: a subagent's session is messaged through its parent."""
    return SubagentError(
        f"session {sid} is a subagent: follow it up through its parent",
        code=ErrorCode.UNAUTHORIZED,
    )
