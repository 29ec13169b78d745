"""Trusted constructors of the three events a turn appends, and of a decoded source
and session header."""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

from ._ids import MessageId
from ._vocabulary import Event, MessageEvent, MessageSource, SessionHeader, TurnEnd, TurnStart

__all__ = [
    "trusted_header",
    "trusted_message",
    "trusted_source",
    "trusted_turn_end",
    "trusted_turn_start",
]

## A frozen dataclass __init__ sets each field through object.__setattr__ (about
# 0.15 us a field). The turn loop builds three events per turn from values it
# made itself, and the decoder a turn's events and a session header from values
# it checked, so they use these positional constructors, which store through the
# slot descriptors directly: ~0.5 us less per turn, 6.6 -> 2.9 us a header read.
# They skip nothing but the keyword handling -- the values are the same, and
# equality, hashing, repr and encoding see an ordinary instance. Everyone else
# uses the dataclass constructors.

_new = object.__new__


def _slot_setters(cls: type[Event], *names: str) -> tuple[Callable[[Any, Any], None], ...]:
    return tuple(cls.__dict__[name].__set__ for name in names)


_TS = _slot_setters(TurnStart, "turn", "at", "message_ids", "redelivered")
_ME = _slot_setters(MessageEvent, "message_id", "content", "source")
_TE = _slot_setters(TurnEnd, "turn", "at", "stop_reason", "output", "structured", "error", "usage")
_MS = _slot_setters(MessageSource, "kind", "session_id", "trace")  # type: ignore[arg-type]
#: A header's setters in field order (``trusted_header``'s parameters).
_SH = _slot_setters(SessionHeader, *(f.name for f in fields(SessionHeader)))  # type: ignore[arg-type]


def trusted_source(kind: str, session_id: Any, trace: str | None) -> MessageSource:
    """A :class:`MessageSource` of checked values (the decoder's: every message read
    back from a log carries one)."""
    src = _new(MessageSource)
    _MS[0](src, kind)
    _MS[1](src, session_id)
    _MS[2](src, trace)
    return src


def trusted_turn_start(
    turn: int, at: _dt.datetime, message_ids: tuple[MessageId, ...], redelivered: bool = False
) -> TurnStart:
    ev = _new(TurnStart)
    _TS[0](ev, turn)
    _TS[1](ev, at)
    _TS[2](ev, message_ids)
    _TS[3](ev, redelivered)
    return ev


def trusted_message(
    message_id: MessageId, content: Any, source: MessageSource | None
) -> MessageEvent:
    ev = _new(MessageEvent)
    _ME[0](ev, message_id)
    _ME[1](ev, content)
    _ME[2](ev, source)
    return ev


def trusted_turn_end(
    turn: int,
    at: _dt.datetime,
    stop_reason: str,
    output: Any,
    structured: Any,
    error: str | None,
    usage: Mapping[str, int] | None = None,
) -> TurnEnd:
    ev = _new(TurnEnd)
    set_turn, set_at, set_stop, set_output, set_structured, set_error, set_usage = _TE
    set_turn(ev, turn)
    set_at(ev, at)
    set_stop(ev, stop_reason)
    set_output(ev, output)
    set_structured(ev, structured)
    set_error(ev, error)
    set_usage(ev, usage)
    return ev


def trusted_header(
    id: Any,
    parent_session: Any,
    origin: str,
    delegation_depth: int,
    created_at: _dt.datetime,
    label: str | None,
    seed_len: int,
    max_inbox: int | None,
) -> SessionHeader:
    """A :class:`SessionHeader` of checked values (the decoder's: a listing or
    ``subagents tree`` reads one per session)."""
    header = _new(SessionHeader)
    set_id, set_parent, set_origin, set_depth, set_created, set_label, set_seed, set_max = _SH
    set_id(header, id)
    set_parent(header, parent_session)
    set_origin(header, origin)
    set_depth(header, delegation_depth)
    set_created(header, created_at)
    set_label(header, label)
    set_seed(header, seed_len)
    set_max(header, max_inbox)
    return header
