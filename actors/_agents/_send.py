"""``AgentRegistry.send`` to a top-level session that is not live here."""

from __future__ import annotations

import logging
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
from ._live import LiveSession
from ._mail import wake_holder
from ._sessions import SessionService
from ._writer import unsure

__all__ = ["kept", "send_to", "send_unheld", "subagent_refused"]

logger = logging.getLogger("subagents")


def kept(
    sessions: SessionService,
    target: SessionId,
    message_id: MessageId,
    error: BaseException,
    accepted_at: float | None = None,
    live: LiveSession | None = None,
) -> bool:
    """After the delivery of a committed message failed with ``error``: True when it
    stays accepted (the call that committed it returns its id: it runs where its
    session is held, or at its next activation), else it is retracted (False).
    ``live``: the activation here that took it (whose epoch may take it back).

    The runtime closing (``RUNTIME_CLOSED``) keeps it: what a closing runtime
    accepted runs at the session's next activation. A retraction the store cannot
    make keeps it too: it is in the inbox, and will run. So does one another
    caller's acceptance of the same id answered for since (``accepted_at``, the
    caller's own acceptance time: see ``DurableInbox.retract``). Kept after a
    retraction, it is said in one warning (the caller is not told of ``error``).

    Raises:
        SubagentError: the store's, with ``hint["in_doubt"]``, when a retraction
            whose answer was lost cannot be settled: nobody can say whether the
            message is accepted (a retry with its id returns it, once).
    """
    if isinstance(error, SubagentError) and error.code == ErrorCode.LEASE_HELD:
        wake_holder(sessions, error, target)  # in the inbox of a child another process holds
        return True
    if isinstance(error, SubagentError) and error.code == ErrorCode.RUNTIME_CLOSED:
        return True
    try:
        if _retracted(sessions, target, message_id, accepted_at, live):
            return False
        why = "another acceptance of its id answered for it, or an activation took it"
    except SubagentError as again:
        if _in_doubt(again):
            raise
        why = f"the store could not take it back: {again}"
    logger.warning(
        "%s for %s was refused (%s) but stays accepted (%s): it runs where the session"
        " is held, or at its next activation",
        message_id, target, error, why,
    )  # fmt: skip
    return True


def _retracted(
    sessions: SessionService,
    target: SessionId,
    message_id: MessageId,
    accepted_at: float | None,
    live: LiveSession | None,
) -> bool:
    """Whether the retraction took the message back. One that raised may have
    committed all the same (``unsure``: its answer lost): it is asked again --
    on PostgreSQL a retraction the server is still committing holds the row, so
    the second waits for it -- and, when that finds nothing to take back, the
    inbox says whether the message is still there.

    Raises:
        SubagentError: the store's, when it could not take it back (it stays),
            or in doubt (``hint["in_doubt"]``: nobody can say).
    """

    def retract() -> bool:
        return sessions.retract(target, message_id, live, accepted_at=accepted_at)

    try:
        return retract()
    except SubagentError as exc:
        if not unsure(exc):
            raise
        lost = exc
    again: SubagentError | None = None
    try:
        if retract():
            return True
    except SubagentError as exc:
        again = exc  # (the store's error again, say: the inbox tells)
    try:
        there = any(e.message_id == message_id for e in sessions.pending(target))
    except SubagentError as exc:
        hint = lost.hint if isinstance(lost.hint, dict) else {}
        raise SubagentError(
            f"could not say whether {message_id} was taken back from {target}: {exc}",
            code=lost.code,
            hint={**hint, "message_id": str(message_id), "in_doubt": True},
        ) from exc
    if there and again is not None:
        raise again  # not taken back: it stays
    return not there


def _in_doubt(error: SubagentError) -> bool:
    return isinstance(error.hint, dict) and error.hint.get("in_doubt") is True


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
