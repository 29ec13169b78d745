"""What a failed write says: whether its lease was lost, whether it may have
committed all the same, and the error that leaves a message's acceptance in doubt."""

from __future__ import annotations

from typing import Any

from subagents.protocol import ErrorCode, SubagentError

__all__ = ["detached", "doubted", "in_doubt", "lost_lease", "unsure"]


def detached(exc: BaseException) -> BaseException:
    """``exc`` with no traceback, nor its cause's or context's: a failure kept for
    good (a session's, until it is activated here again) would otherwise keep the
    frames of the failed batch alive, and every event the batch held."""
    stack, seen = [exc], set()
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        e.__traceback__ = None
        stack.extend(x for x in (e.__cause__, e.__context__) if x is not None)
    return exc


def lost_lease(exc: BaseException) -> bool:
    """Whether ``exc`` is a write refused because its lease was taken over."""
    return isinstance(exc, SubagentError) and exc.code == ErrorCode.LEASE_LOST


def unsure(exc: BaseException) -> bool:
    """Whether a write that raised ``exc`` may have committed all the same: its
    connection was lost (``PERSISTENCE_UNAVAILABLE``), perhaps after the server
    committed, before the answer came back. Only the store can say (see
    ``docs/postgres.md``)."""
    return isinstance(exc, SubagentError) and exc.code == ErrorCode.PERSISTENCE_UNAVAILABLE


def in_doubt(exc: BaseException) -> bool:
    """Whether ``exc`` says nobody can tell if its message was accepted
    (``hint["in_doubt"]``, made by :func:`doubted`)."""
    hint = getattr(exc, "hint", None)
    return isinstance(hint, dict) and hint.get("in_doubt") is True


def doubted(text: str, like: SubagentError, message_id: Any) -> SubagentError:
    """``text`` as an error of ``like``'s code and hint, in doubt for ``message_id``:
    nobody can say whether it was accepted; a retry with that id settles it."""
    hint = like.hint if isinstance(like.hint, dict) else {}
    return SubagentError(
        text, code=like.code, hint={**hint, "message_id": str(message_id), "in_doubt": True}
    )
