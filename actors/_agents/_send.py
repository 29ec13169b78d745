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
    new_message_id,
    trusted_message,
)

from ._agent import Agent
from ._followups import USER
from ._kept import kept
from ._sessions import SessionService

__all__ = ["send_to", "send_unheld", "subagent_refused"]


def send_to(
    host: Any,
    get: Callable[[SessionId], Agent | None],
    resume_top: Callable[[SessionId], Agent],
    session_id: Any,
    content: Any,
    source: MessageSource | None,
    message_id: MessageId | str | None,
    adopt: Callable[[Agent], object] = lambda _agent: None,
) -> MessageId:
    """``AgentRegistry.send`` (see there): a follow-up of the agent when it is live
    here, else :func:`send_unheld`; ``host`` is the registry's :class:`AgentHost`;
    ``adopt``: what becomes of an agent the send resumed (see there)."""
    sid = session_id if type(session_id) is SessionId else SessionId(session_id)
    if source is not None and not isinstance(source, MessageSource):
        raise SubagentError("source must be a MessageSource", code=ErrorCode.INVALID_ARGUMENT)
    mid = new_message_id() if message_id is None else MessageId(message_id)
    agent = get(sid)
    if agent is not None:
        if agent.parent_session is not None:  # resident or not, the same answer
            raise subagent_refused(sid)
        try:
            return agent.followup(content, source=source, message_id=mid)
        except SubagentError as exc:
            if exc.code not in (ErrorCode.AGENT_DISPOSED, ErrorCode.LEASE_LOST):
                raise
            # Let go (an adoption that was quiet, say), or taken over unnoticed
            # (nothing accepted): as if not live here.
    sessions = host.sessions
    return send_unheld(sessions, get, resume_top, sid, content, source, mid, host.telemetry, adopt)


def send_unheld(
    sessions: SessionService,
    get: Callable[[SessionId], Agent | None],
    resume_top: Callable[[SessionId], Agent],
    sid: SessionId,
    content: Any,
    source: MessageSource | None,
    mid: MessageId,
    telemetry: Telemetry | None = None,
    adopt: Callable[[Agent], object] = lambda _agent: None,
) -> MessageId:
    """Send ``content`` to ``sid``, a session not live here (or leaving): see
    ``AgentRegistry.send``; ``get`` and ``resume_top`` are the registry's. Traced
    as a follow-up where the message is committed here (it carries the span to
    whichever process runs it); otherwise the resumed agent's follow-up traces it.
    An agent this resumed is handed to ``adopt`` once its message is queued: it
    was resumed for the message, for no user here (the registry lets it go once
    quiet, as the sweep's adoptions)."""
    header = sessions.header(sid)
    if header is None:
        raise SubagentError(f"no session {sid}", code=ErrorCode.SESSION_NOT_FOUND)
    if header.parent_session is not None:
        raise subagent_refused(sid)
    if not sessions.strict or sessions.leases is None:
        try:
            agent, resumed = resume_top(sid), True
        except SubagentError as exc:
            found = get(sid)
            if exc.code != ErrorCode.SESSION_EXISTS or found is None:
                raise
            agent, resumed = found, False
        queued = agent.followup(content, source=source, message_id=mid)
        if resumed:
            adopt(agent)
        return queued
    check_value(content)  # refuse what the log cannot hold before anything is accepted

    def commit(src: MessageSource | None) -> MessageId:
        (accepted,) = sessions.accept(sid, [trusted_message(mid, content, src)])
        if accepted.duplicate:
            return mid
        try:
            adopt(resume_top(sid))  # its replay runs the message
        except SubagentError as exc:
            if exc.code == ErrorCode.SESSION_EXISTS:
                # Live here since we looked: its pickup takes what nobody took.
                sessions.wake_pickup(sid)
            elif not kept(sessions, sid, mid, exc, accepted.at):
                raise
            # Not ours to take back (a duplicate acceptance answered for it, it was
            # taken meanwhile, the runtime closes, the store could not take it
            # back): it stays accepted, and runs at the session's next activation.
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
