"""The wire maps of the four events every turn writes, built in straight-line code.

A turn writes ``turn/start``, a ``message`` (or a waking ``report``) and
``turn/end``; a write-behind store encodes each of them on its writer, where the
table-driven :func:`~._events.event_to_wire` (a getattr, an omission test and a
checker call per field) was most of a turn's durable cost. These builders make
the same map -- same keys, same order, same values, so the same bytes -- from an
event whose fields pass the same checks, written out inline. An event that fails
any check is handed back (``None``) to the table-driven path, which raises its
precise :class:`~._errors.EncodeError`: the rules and their messages live there
once, and here only the test that nothing needs saying.

Each builder takes its event untyped: its fields may hold anything a careless
caller put there, which is what the checks are for.
``tests/protocol/test_protocol_hot_wire.py`` checks the two paths agree on every
event hypothesis makes, valid or not.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from typing import Any, Final

from ._fields import MAX_TRACE_LEN
from ._ids import MessageId, SessionId
from ._time import storable_datetime
from ._vocabulary import (
    SOURCE_KINDS,
    STOP_REASONS,
    Event,
    MessageEvent,
    MessageSource,
    ReportEvent,
    TurnEnd,
    TurnStart,
)

__all__ = ["HOT_WIRE"]

_UTC = _dt.UTC
_datetime = _dt.datetime
_DELIVERIES: Final = frozenset({"quiet", "waking"})
_STOPS: Final = frozenset(STOP_REASONS)


def _at_ok(at: Any) -> bool:
    return isinstance(at, _datetime) and (at.tzinfo is _UTC or storable_datetime(at))


def _source_wire(src: Any) -> Any:
    """``src.to_wire()`` when every field passes the decoder's checks, else a
    sentinel (``False``): the caller falls back."""
    if src is None:
        return None
    if type(src) is not MessageSource:
        return False
    kind = src.kind
    if type(kind) is not str or kind not in SOURCE_KINDS:
        return False
    sid = src.session_id
    if sid is not None and type(sid) is not SessionId:
        return False
    trace = src.trace
    if trace is None:
        return {"kind": kind, "session_id": sid}
    if type(trace) is not str or len(trace) > MAX_TRACE_LEN or not trace.isascii():
        return False
    return {"kind": kind, "session_id": sid, "trace": trace}


def _message(e: Any) -> dict[str, Any] | None:
    mid, content = e.message_id, e.content
    source = _source_wire(e.source)
    if type(mid) is not MessageId or source is False or isinstance(content, MessageSource):
        return None
    return {"type": "message", "message_id": mid, "content": content, "source": source}


def _report(e: Any) -> dict[str, Any] | None:
    mid, content, delivery = e.message_id, e.content, e.delivery
    source = _source_wire(e.source)
    if type(mid) is not MessageId or source is False or isinstance(content, MessageSource):
        return None
    if type(delivery) is not str or delivery not in _DELIVERIES:
        return None
    return {
        "type": "report",
        "message_id": mid,
        "content": content,
        "source": source,
        "delivery": delivery,
    }


def _turn_start(e: Any) -> dict[str, Any] | None:
    turn, at, ids, redelivered = e.turn, e.at, e.message_ids, e.redelivered
    if type(turn) is not int or turn < 0 or not _at_ok(at):
        return None
    if not isinstance(ids, (list, tuple)):
        return None
    for mid in ids:
        if type(mid) is not MessageId:
            return None
    if redelivered == False:  # noqa: E712 (the omission test the table uses: ==)
        return {"type": "turn/start", "turn": turn, "at": at, "message_ids": ids}
    if type(redelivered) is not bool:
        return None
    return {
        "type": "turn/start",
        "turn": turn,
        "at": at,
        "message_ids": ids,
        "redelivered": redelivered,
    }


def _turn_end(e: Any) -> dict[str, Any] | None:
    turn, at, stop, error, usage = e.turn, e.at, e.stop_reason, e.error, e.usage
    output, structured = e.output, e.structured
    if type(turn) is not int or turn < 0 or not _at_ok(at):
        return None
    if type(stop) is not str or stop not in _STOPS:
        return None
    if error is not None and type(error) is not str:
        return None
    if isinstance(output, MessageSource) or isinstance(structured, MessageSource):
        return None  # the table turns a source into its map wherever it is
    wire = {
        "type": "turn/end",
        "turn": turn,
        "at": at,
        "stop_reason": stop,
        "output": output,
        "structured": structured,
        "error": error,
    }
    if usage == None:  # noqa: E711 (the omission test the table uses: ==)
        return wire
    if type(usage) is not dict:
        return None
    for name, count in usage.items():
        if type(name) is not str or type(count) is not int or count < 0:
            return None
    wire["usage"] = usage
    return wire


#: Event class -> its inline wire builder (``None`` from one: use the table).
HOT_WIRE: Final[dict[type[Event], Callable[[Any], dict[str, Any] | None]]] = {
    MessageEvent: _message,
    ReportEvent: _report,
    TurnStart: _turn_start,
    TurnEnd: _turn_end,
}
