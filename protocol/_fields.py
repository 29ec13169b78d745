"""Field checkers: a decoded wire value in, the field's value out.

Each raises :class:`DecodeError` for a value the field cannot take. They are plain
functions, chosen once per event class, to keep decoding a short loop over a
precomputed table.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Mapping
from typing import Any, Final

from ._errors import DecodeError
from ._ids import MessageId, SessionId
from ._time import storable_datetime
from ._trusted import trusted_source
from ._vocabulary import SOURCE_KINDS, Checker, MessageSource

__all__ = [
    "anything",
    "boolean",
    "fail",
    "integer",
    "mapping",
    "message_id",
    "message_ids",
    "nonneg_integer",
    "one_of",
    "opt_positive_integer",
    "opt_session_id",
    "opt_text",
    "session_id",
    "source",
    "source_ok",
    "text",
    "utc_datetime",
]

# Each checker takes a decoded wire value and returns the field value, raising
# DecodeError. They are plain functions, chosen once per class, to keep decoding
# a short loop over a precomputed table.


def fail(what: str, value: Any) -> DecodeError:
    return DecodeError(f"expected {what}, got {type(value).__name__}")


def text(v: Any) -> str:
    if type(v) is not str:
        raise fail("str", v)
    return v


def opt_text(v: Any) -> str | None:
    return None if v is None else text(v)


def integer(v: Any) -> int:
    if type(v) is not int:
        raise fail("int", v)
    return v


def nonneg_integer(v: Any) -> int:
    if type(v) is not int or v < 0:
        raise fail("non-negative int", v)
    return v


def opt_positive_integer(v: Any) -> int | None:
    if v is None:
        return None
    if type(v) is not int or v < 1:
        raise fail("positive int or nil", v)
    return v


def utc_datetime(v: Any) -> _dt.datetime:
    if not isinstance(v, _dt.datetime) or not storable_datetime(v):
        raise fail("aware datetime within the UTC range", v)
    return v


def session_id(v: Any) -> SessionId:
    if type(v) is not SessionId:
        raise fail("SessionId", v)
    return v


def opt_session_id(v: Any) -> SessionId | None:
    return None if v is None else session_id(v)


def message_id(v: Any) -> MessageId:
    if type(v) is not MessageId:
        raise fail("MessageId", v)
    return v


def message_ids(v: Any) -> tuple[MessageId, ...]:
    if not isinstance(v, (list, tuple)):
        raise fail("array of MessageId", v)
    return tuple(message_id(x) for x in v)


def anything(v: Any) -> Any:
    return v


def one_of(allowed: frozenset[str]) -> Checker:
    def check(v: Any) -> str:
        if type(v) is not str or v not in allowed:
            shown = repr(v) if type(v) is str else type(v).__name__  # another repr may raise
            raise DecodeError(f"expected one of {sorted(allowed)}, got {shown}"[:200])
        return v

    return check


_source_kind = one_of(SOURCE_KINDS)


def source(v: Any) -> MessageSource | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise fail("source map", v)
    trace = v.get("trace")  # most messages are untraced: no call for them
    return trusted_source(
        _source_kind(v.get("kind")),
        opt_session_id(v.get("session_id")),
        None if trace is None else _trace(trace),
    )


def source_ok(v: Any) -> None:
    """Encode-side twin of :func:`source`: the same checks, no object built."""
    if v is None:
        return
    if not isinstance(v, dict):
        raise fail("source map", v)
    _source_kind(v.get("kind"))
    opt_session_id(v.get("session_id"))
    _trace(v.get("trace"))


#: The longest ``trace`` a source may carry (a W3C traceparent is 55 characters).
MAX_TRACE_LEN: Final = 256


def _trace(v: Any) -> str | None:
    if v is None:
        return None
    if type(v) is not str or len(v) > MAX_TRACE_LEN or not v.isascii():
        raise fail(f"ASCII str of at most {MAX_TRACE_LEN} characters (a trace)", v)
    return v


def mapping(v: Any) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise fail("map", v)
    return v


def boolean(v: Any) -> bool:
    if type(v) is not bool:
        raise fail("a bool", v)
    return v
