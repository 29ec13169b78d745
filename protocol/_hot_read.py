"""The three events every turn writes, read back in straight-line code.

The reading twin of :mod:`._hot_wire`. Every log read -- a resume, a replay, a
listing's fold, ``subagents tree`` -- decodes mostly ``turn/start``, ``message``
and ``turn/end`` maps, and the table-driven builder (a checker call per field,
keyword construction of a frozen dataclass) was half of a ``decode_event``.
These readers build the same event from a map whose fields pass the same
checks, written out inline, through the trusted constructors. A map with
anything unusual -- a field missing or of another type, a traced source, a turn's
error or usage -- is handed back (``None``) to the table-driven path, which
accepts it or raises its precise :class:`~._errors.DecodeError`: the rules and
their messages live there once, and here only the test that nothing needs
saying. Keys the table does not know are ignored, as it ignores them.

:func:`hot_header` does the same for a session header (a listing and
``subagents tree`` read one per session).

``tests/protocol/test_protocol_hot_read.py`` (and ``test_protocol_hot_header.py``)
check the two paths agree on every map hypothesis makes, valid or not.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from typing import Any, Final

from ._ids import MessageId, SessionId
from ._time import storable_datetime
from ._trusted import (
    trusted_header,
    trusted_message,
    trusted_source,
    trusted_turn_end,
    trusted_turn_start,
)
from ._vocabulary import ORIGINS, SOURCE_KINDS, STOP_REASONS, Event, SessionHeader

__all__ = ["HOT_READ", "hot_header"]

_UTC = _dt.UTC
_datetime = _dt.datetime
_STOPS: Final = frozenset(STOP_REASONS)
_ABSENT: Final = object()


def _at(wire: dict[str, Any]) -> Any:
    """The map's ``at`` when it is a storable datetime, else None."""
    return _at_of(wire.get("at"))


def _turn(wire: dict[str, Any]) -> Any:
    turn = wire.get("turn")
    return turn if type(turn) is int and turn >= 0 else None


def _message(wire: dict[str, Any]) -> Event | None:
    message_id = wire.get("message_id")
    if type(message_id) is not MessageId or "content" not in wire:
        return None
    src = wire.get("source")
    if src is not None:
        if type(src) is not dict or src.get("trace") is not None:
            return None
        kind = src.get("kind")
        session_id = src.get("session_id")
        if type(kind) is not str or kind not in SOURCE_KINDS:
            return None
        if session_id is not None and type(session_id) is not SessionId:
            return None
        src = trusted_source(kind, session_id, None)
    return trusted_message(message_id, wire["content"], src)


def _turn_start(wire: dict[str, Any]) -> Event | None:
    turn = _turn(wire)
    at = _at(wire)
    if turn is None or at is None:
        return None
    ids = wire.get("message_ids", ())
    if type(ids) is not list and type(ids) is not tuple:
        return None
    for message_id in ids:
        if type(message_id) is not MessageId:
            return None
    redelivered = wire.get("redelivered", False)
    if type(redelivered) is not bool:
        return None
    return trusted_turn_start(turn, at, tuple(ids), redelivered)


def _turn_end(wire: dict[str, Any]) -> Event | None:
    turn = _turn(wire)
    at = _at(wire)
    stop = wire.get("stop_reason")
    if turn is None or at is None or type(stop) is not str or stop not in _STOPS:
        return None
    if wire.get("error") is not None or wire.get("usage") is not None:
        return None
    return trusted_turn_end(turn, at, stop, wire.get("output"), wire.get("structured"), None)


#: Readers by wire ``type``; each returns the event, or None for the table's path.
HOT_READ: Final[dict[Any, Callable[[dict[str, Any]], Event | None]]] = {
    "message": _message,
    "turn/start": _turn_start,
    "turn/end": _turn_end,
}


def hot_header(wire: dict[str, Any]) -> SessionHeader | None:
    """The header of a map whose fields pass the table's checks, else None (the
    table's path: it accepts the map or words its refusal)."""
    sid = wire.get("id")
    parent = wire.get("parent_session", _ABSENT)  # required, if nil
    origin = wire.get("origin")
    depth = wire.get("delegation_depth")
    created = _at_of(wire.get("created_at"))
    label = wire.get("label")
    seed_len = wire.get("seed_len", 0)
    max_inbox = wire.get("max_inbox")
    if (
        type(sid) is not SessionId
        or (parent is not None and type(parent) is not SessionId)
        or type(origin) is not str
        or origin not in ORIGINS
        or type(depth) is not int
        or depth < 0
        or created is None
        or (label is not None and type(label) is not str)
        or type(seed_len) is not int
        or seed_len < 0
        or (max_inbox is not None and (type(max_inbox) is not int or max_inbox < 1))
    ):
        return None
    return trusted_header(sid, parent, origin, depth, created, label, seed_len, max_inbox)


def _at_of(at: Any) -> Any:
    """``at`` when it is a storable datetime, else None."""
    if type(at) is _datetime and (at.tzinfo is _UTC or storable_datetime(at)):
        return at
    return None
