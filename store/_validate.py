"""Argument checks shared by every store.

Each check returns the normalised value or raises :class:`SubagentError` with code
``INVALID_ARGUMENT``. They sit on the append hot path, so the common case (the
right type already) is one ``type() is`` test.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
from collections.abc import Iterable, Sequence
from typing import Any

from subagents.protocol import (
    ORIGINS,
    ErrorCode,
    Event,
    MessageEvent,
    MessageId,
    ReportEvent,
    SessionHeader,
    SessionId,
    SubagentError,
)

__all__ = [
    "check_blob",
    "check_events",
    "check_header",
    "check_int",
    "check_message_ids",
    "check_messages",
    "check_new_lease",
    "check_seconds",
    "check_session_id",
    "check_token",
    "invalid",
]


def invalid(message: str, **hint: Any) -> SubagentError:
    """A ``SubagentError(INVALID_ARGUMENT)`` carrying ``hint`` as a dict."""
    return SubagentError(message[:300], code=ErrorCode.INVALID_ARGUMENT, hint=hint or None)


def check_session_id(value: object) -> SessionId:
    """Accept a :class:`SessionId` or a plain ``str`` of 32 lowercase hex digits."""
    if type(value) is SessionId:
        return value
    if not isinstance(value, str):
        raise invalid(f"a session id is a str, got {type(value).__name__}")
    return SessionId(value)  # raises INVALID_ARGUMENT for a malformed id


def check_session_ids(values: object) -> set[SessionId]:
    """Session ids from any iterable of them (a list, a tuple, a set...), not one ``str``."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise invalid(f"expected a list of session ids, got {type(values).__name__}")
    return {check_session_id(v) for v in values}


def check_unit(unit: object, max_len: int | None = None) -> str:
    """A projection unit's name: a non-empty ``str`` (of at most ``max_len``)."""
    if type(unit) is not str or not unit or (max_len is not None and len(unit) > max_len):
        raise invalid(f"a projection unit is a non-empty str, got {unit!r}"[:200])
    if not unit.isascii():
        try:
            unit.encode()
        except UnicodeEncodeError:  # a lone surrogate: no store can keep it
            raise invalid(f"a projection unit is text a store keeps, got {unit!r}"[:200]) from None
    return unit


#: SQLite integers are signed 64-bit.
MAX_INT = 2**63 - 1


def check_int(value: object, name: str, *, minimum: int = 0) -> int:
    """An ``int`` (not ``bool``) from ``minimum`` to :data:`MAX_INT`."""
    if type(value) is not int:
        raise invalid(f"{name} must be an int, got {type(value).__name__}", name=name)
    if not minimum <= value <= MAX_INT:
        raise invalid(f"{name} must be in [{minimum}, 2**63 - 1], got {value}", name=name)
    return value


def check_limit(value: object) -> int | None:
    """An inbox bound: ``None`` or an ``int`` of at least 1."""
    if value is None:
        return None
    return check_int(value, "limit", minimum=1)


def check_events(events: object) -> Sequence[Event]:
    """A list or tuple of :class:`Event` (any other sequence is copied to a list)."""
    if type(events) is not list and type(events) is not tuple:
        if isinstance(events, (Event, str, bytes)) or not isinstance(events, Sequence):
            raise invalid(f"events must be a sequence of Event, got {type(events).__name__}")
        events = list(events)
    for event in events:
        if not isinstance(event, Event):
            raise invalid(f"not an Event: {type(event).__name__}")
    return events


def check_header(header: object) -> SessionHeader:
    """A :class:`SessionHeader` whose fields have the declared types.

    Dataclasses do not check types on construction, and a store orders and indexes
    by these fields, so they are checked here: ids are :class:`SessionId` (plain
    ``str`` ids are converted), ``created_at`` is an aware datetime, the depth a
    non-negative int, ``origin`` one of :data:`ORIGINS`.
    """
    if type(header) is not SessionHeader:
        raise invalid(f"header must be a SessionHeader, got {type(header).__name__}")
    session_id = check_session_id(header.id)
    parent = None if header.parent_session is None else check_session_id(header.parent_session)
    check_int(header.delegation_depth, "delegation_depth")
    if type(header.origin) is not str or header.origin not in ORIGINS:
        raise invalid(f"origin must be one of {sorted(ORIGINS)}, got {header.origin!r}")
    created_at = header.created_at
    if not isinstance(created_at, _dt.datetime) or created_at.utcoffset() is None:
        raise invalid("created_at must be an aware datetime")
    if header.label is not None and not isinstance(header.label, str):
        raise invalid(f"label must be a str or None, got {type(header.label).__name__}")
    if session_id is not header.id or parent is not header.parent_session:
        header = dataclasses.replace(header, id=session_id, parent_session=parent)
    return header


def check_blob(data: object) -> bytes:
    """``bytes`` (a ``bytearray`` or ``memoryview`` is copied to ``bytes``)."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise invalid(f"data must be bytes, got {type(data).__name__}")


def check_messages(events: object) -> Sequence[MessageEvent | ReportEvent]:
    """Inbox events: a sequence of ``MessageEvent`` / ``ReportEvent`` (each has an id)."""
    checked = check_events(events)
    for event in checked:
        if type(event) is not MessageEvent and type(event) is not ReportEvent:
            raise invalid(f"an inbox takes messages and reports, not {type(event).__name__}")
    return checked  # type: ignore[return-value]


def check_message_ids(ids: object) -> list[MessageId]:
    """A sequence of message ids (plain ``str`` ids are converted)."""
    if isinstance(ids, (str, bytes, MessageId)) or not isinstance(ids, Sequence):
        raise invalid(f"message ids must be a sequence, got {type(ids).__name__}")
    try:
        return [i if type(i) is MessageId else MessageId(i) for i in ids]
    except SubagentError as exc:
        raise invalid(f"not a message id: {exc}") from exc


def check_token(token: object) -> tuple[str, int] | None:
    """A lease token ``(holder, epoch)`` or None."""
    if token is None:
        return None
    if (
        type(token) is not tuple
        or len(token) != 2
        or type(token[0]) is not str
        or not token[0]
        or type(token[1]) is not int
    ):
        raise invalid(f"a lease token is (holder: str, epoch: int), got {token!r}")
    return token


def check_seconds(value: object, name: str) -> float:
    """A finite number of (wall-clock) seconds."""
    if type(value) is not int and type(value) is not float:
        raise invalid(f"{name} must be a number of seconds, got {type(value).__name__}")
    seconds = float(value)
    if not math.isfinite(seconds):
        raise invalid(f"{name} must be a finite number of seconds, got {value!r}")
    return seconds


def check_acquire(
    session_id: object, holder: object, now: object, expires: object, wake: object
) -> tuple[SessionId, float, float]:
    """The arguments of ``acquire_lease``: ``(session id, now, expires)``."""
    sid = check_session_id(session_id)
    if type(holder) is not str or not holder:
        raise invalid("holder must be a non-empty str")
    at = check_seconds(now, "now")
    until = check_seconds(expires, "expires")
    if wake is not None and type(wake) is not str:
        raise invalid("wake must be a str or None")
    return sid, at, until


def check_new_lease(lease: object) -> tuple[str, float, str | None] | None:
    """The lease a session is created with: ``(holder, expires, wake)`` or None."""
    if lease is None:
        return None
    if type(lease) is not tuple or len(lease) != 3:
        raise invalid(f"a new lease is (holder, expires, wake), got {lease!r}")
    holder, expires, wake = lease
    if type(holder) is not str or not holder:
        raise invalid("a lease holder is a non-empty str")
    if wake is not None and type(wake) is not str:
        raise invalid("a lease's wake address is a str or None")
    return (holder, check_seconds(expires, "expires"), wake)
