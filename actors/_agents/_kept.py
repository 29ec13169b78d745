"""Whether a message committed and then refused stays accepted: the one decision
every take-back makes (:func:`kept`) -- a ``send``, a follow-up (a top-level
agent's own, a child's: resident, steered, by id or routed), a report to a live
parent.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from subagents.protocol import ErrorCode, MessageId, SessionId, SubagentError

from ._write_faults import doubted, in_doubt, unsure

if TYPE_CHECKING:
    from ._live import LiveSession
    from ._sessions import SessionService

__all__ = ["kept", "wake_holder"]

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
        if in_doubt(again):
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
        text = f"could not say whether {message_id} was taken back from {target}: {exc}"
        raise doubted(text, lost, message_id) from exc
    if there and again is not None:
        raise again  # not taken back: it stays
    return not there


def wake_holder(sessions: SessionService, error: BaseException, session_id: SessionId) -> None:
    """After ``LEASE_HELD``: ring the holder named in the error's hint."""
    hint: Any = getattr(error, "hint", None)
    if isinstance(hint, dict):
        sessions.ring(hint.get("wake"), session_id.to_bytes())
