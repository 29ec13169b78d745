"""Stored values read back, checked for their type.

SQLite keeps whatever a column was given: a file damaged or written by another
program may hold text where the store wrote an integer, a number where it wrote
bytes. A value of the wrong kind is a damaged record of its session
(:class:`CorruptRecordError`, seq -1 when it is no event's), never a
``TypeError`` or ``OverflowError`` out of a public call -- nor an allocation of a
number's worth of bytes (``bytes(10**9)``). PostgreSQL's typed columns always
pass these checks.
"""

from __future__ import annotations

from typing import Any, Final

from subagents.protocol import (
    DEFAULT_LIMITS,
    CorruptRecordError,
    DecodeError,
    ErrorCode,
    Limits,
    MessageEvent,
    ReportEvent,
    SessionId,
    SubagentError,
    decode_event,
)

__all__ = [
    "STORED_VALUE_ERRORS",
    "blob",
    "corrupt_cell",
    "inbox_event",
    "integer",
    "real",
    "stored_session_id",
    "stored_value_error",
    "text_or_none",
]

_INT64: Final = 2**63
#: What a statement meeting a stored value of the wrong kind raises (a next seq of
#: a text seq, an epoch past 64 bits, a comparison of text with a number).
STORED_VALUE_ERRORS: Final = (TypeError, ValueError, OverflowError)


def corrupt_cell(session: Any, what: str, value: Any, seq: int = -1) -> CorruptRecordError:
    """``CORRUPT_RECORD``: ``session``'s stored ``what`` is not of its kind."""
    shown = type(value).__name__
    return CorruptRecordError(
        f"session {session}: its stored {what} is not what the store wrote (a {shown})",
        session_id=str(session),
        seq=seq,
    )


def blob(value: Any, session: Any, what: str, seq: int = -1) -> bytes:
    """A stored ``BLOB`` / ``bytea`` as bytes."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise corrupt_cell(session, what, value, seq)


def stored_session_id(value: Any) -> SessionId | None:
    """A stored session key read by a query over many sessions (a sweep's), or None
    when it is not one (16 bytes): that row is left out, and the others answered --
    one damaged row must not stop the work of every other session."""
    if isinstance(value, (bytes, bytearray, memoryview)) and len(value) == 16:
        return SessionId.from_bytes(bytes(value))
    return None


def integer(value: Any, session: Any, what: str, seq: int = -1) -> int:
    """A stored 64-bit integer."""
    if type(value) is int and -_INT64 <= value < _INT64:
        return value
    raise corrupt_cell(session, what, value, seq)


def real(value: Any, session: Any, what: str) -> float:
    """A stored number (an integer or a float)."""
    if type(value) in (int, float):
        return float(value)
    raise corrupt_cell(session, what, value)


def text_or_none(value: Any, session: Any, what: str) -> str | None:
    """A stored text, or ``NULL``."""
    if value is None or type(value) is str:
        return value
    raise corrupt_cell(session, what, value)


def inbox_event(
    n: Any, body: Any, epoch: Any, limits: Limits = DEFAULT_LIMITS
) -> MessageEvent | ReportEvent:
    """The message of one stored inbox row (its ``n``, ``body`` and ``epoch``);
    :class:`DecodeError` for a damaged row, which ``pending(damaged=...)`` names
    and skips, and which no inbox bound counts (it is never done)."""
    if type(n) is not int or not (epoch is None or type(epoch) is int):
        raise DecodeError("an inbox entry's place or epoch is no integer")
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise DecodeError(f"an inbox body is bytes, got {type(body).__name__}")
    event = decode_event(bytes(body), limits=limits)
    if not isinstance(event, (MessageEvent, ReportEvent)):
        raise DecodeError(f"not a message: {event.type!r}")
    return event


def stored_value_error(exc: Exception) -> SubagentError:
    """A write that met a stored value of the wrong kind (one of
    :data:`STORED_VALUE_ERRORS`): ``CORRUPT_RECORD`` for that write alone."""
    err = SubagentError(
        f"a stored value is not what the store wrote: {exc}"[:300], code=ErrorCode.CORRUPT_RECORD
    )
    err.__cause__ = exc
    return err
