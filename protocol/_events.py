"""The session-event vocabulary: frozen, slotted, keyword-only dataclasses.

A session's log is a sequence of these events. On disk and on the wire each event
is one msgpack map whose ``"type"`` key names the class (``"turn/start"``,
``"subagent/descriptor"``, ...) and whose other keys are the class's fields.
:func:`event_from_wire` validates every field's type and raises
:class:`DecodeError` for anything malformed. A map whose ``type`` this runtime does
not know decodes to :class:`UnknownEvent`, so a log written by a newer runtime
stays readable ("room for more").

The session header is not a log event: a store keeps it beside the log, but it
uses the same codec.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Final, Literal

from ._codec import DEFAULT_LIMITS, Limits, check_shape, pack_shaped, packb, unpackb
from ._errors import DecodeError, EncodeError
from ._ids import MessageId, SessionId

__all__ = [
    "EVENT_TYPES",
    "ORIGINS",
    "STOP_REASONS",
    "Event",
    "InterruptEvent",
    "MessageEvent",
    "MessageSource",
    "ReportEvent",
    "SessionHeader",
    "SubagentDescriptorEvent",
    "TurnEnd",
    "TurnStart",
    "UnknownEvent",
    "decode_event",
    "decode_header",
    "encode_event",
    "encode_header",
    "event_from_wire",
    "event_to_wire",
    "header_from_wire",
    "header_to_wire",
]

StopReason = Literal["completed", "cancelled", "failed"]
STOP_REASONS: Final = frozenset({"completed", "cancelled", "failed"})
Delivery = Literal["quiet", "waking"]
#: ``"user"`` for top-level agents, ``"subagent"`` for delegated children.
ORIGINS: Final = frozenset({"user", "subagent"})
SOURCE_KINDS: Final = frozenset({"user", "parent", "child", "host", "self"})


# -- field checkers -------------------------------------------------------------
# Each checker takes a decoded wire value and returns the field value, raising
# DecodeError. They are plain functions, chosen once per class, to keep decoding
# a short loop over a precomputed table.

Checker = Callable[[Any], Any]


def _fail(what: str, value: Any) -> DecodeError:
    return DecodeError(f"expected {what}, got {type(value).__name__}")


def _str(v: Any) -> str:
    if type(v) is not str:
        raise _fail("str", v)
    return v


def _opt_str(v: Any) -> str | None:
    return None if v is None else _str(v)


def _int(v: Any) -> int:
    if type(v) is not int:
        raise _fail("int", v)
    return v


def _nonneg_int(v: Any) -> int:
    if type(v) is not int or v < 0:
        raise _fail("non-negative int", v)
    return v


def _dt_utc(v: Any) -> _dt.datetime:
    if not isinstance(v, _dt.datetime) or v.tzinfo is None:
        raise _fail("aware datetime", v)
    return v


def _session_id(v: Any) -> SessionId:
    if type(v) is not SessionId:
        raise _fail("SessionId", v)
    return v


def _opt_session_id(v: Any) -> SessionId | None:
    return None if v is None else _session_id(v)


def _message_id(v: Any) -> MessageId:
    if type(v) is not MessageId:
        raise _fail("MessageId", v)
    return v


def _message_ids(v: Any) -> tuple[MessageId, ...]:
    if not isinstance(v, (list, tuple)):
        raise _fail("array of MessageId", v)
    return tuple(_message_id(x) for x in v)


def _any(v: Any) -> Any:
    return v


def _one_of(allowed: frozenset[str]) -> Checker:
    def check(v: Any) -> str:
        if type(v) is not str or v not in allowed:
            raise DecodeError(f"expected one of {sorted(allowed)}, got {v!r}"[:200])
        return v

    return check


_source_kind = _one_of(SOURCE_KINDS)


def _source(v: Any) -> MessageSource | None:
    if v is None:
        return None
    if not isinstance(v, dict):
        raise _fail("source map", v)
    return MessageSource(
        kind=_source_kind(v.get("kind")), session_id=_opt_session_id(v.get("session_id"))
    )


def _source_ok(v: Any) -> None:
    """Encode-side twin of :func:`_source`: the same checks, no object built."""
    if v is None:
        return
    if not isinstance(v, dict):
        raise _fail("source map", v)
    _source_kind(v.get("kind"))
    _opt_session_id(v.get("session_id"))


def _mapping(v: Any) -> Mapping[str, Any]:
    if not isinstance(v, dict):
        raise _fail("map", v)
    return v


# -- the vocabulary -------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageSource:
    """Who supplied a message. It records the sender and grants no authority."""

    kind: str
    session_id: SessionId | None = None

    def to_wire(self) -> dict[str, Any]:
        return {"kind": self.kind, "session_id": self.session_id}


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionHeader:
    """The durable identity of a session, stored beside its log.

    ``delegation_depth`` is the persisted floor of the agent's delegation depth:
    runtime options may raise it, never lower it.
    """

    id: SessionId
    parent_session: SessionId | None
    origin: str
    delegation_depth: int
    created_at: _dt.datetime
    label: str | None = None
    seed_len: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every log event; ``type`` is the wire name of the subclass."""

    type: ClassVar[str] = ""
    _checkers: ClassVar[tuple[tuple[str, Checker, bool], ...]] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageEvent(Event):
    """One delivered message (prompt, follow-up or waking report) of a turn."""

    type: ClassVar[str] = "message"
    message_id: MessageId
    content: Any
    source: MessageSource | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportEvent(Event):
    """A child's report as the parent received it (quiet context or waking turn)."""

    type: ClassVar[str] = "report"
    message_id: MessageId
    content: Any
    source: MessageSource | None = None
    delivery: str = "quiet"


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnStart(Event):
    """A turn began; ``message_ids`` are the messages it claimed."""

    type: ClassVar[str] = "turn/start"
    turn: int
    at: _dt.datetime
    message_ids: tuple[MessageId, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnEnd(Event):
    """A turn ended with a stop reason (completed / cancelled / failed)."""

    type: ClassVar[str] = "turn/end"
    turn: int
    at: _dt.datetime
    stop_reason: str
    output: Any = None
    structured: Any = None
    error: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InterruptEvent(Event):
    """An admitted interrupt (cancel with the inbox kept)."""

    type: ClassVar[str] = "interrupt"
    at: _dt.datetime
    cause: str | None = None
    authority: str = "self"
    by_session: SessionId | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SubagentDescriptorEvent(Event):
    """The durable ``subagent/descriptor``; ``payload`` is folded, not trusted.

    The payload stays a raw map so a malformed or future-version descriptor can be
    stored and later classified (corrupt vs unsupported) by the fold.
    """

    type: ClassVar[str] = "subagent/descriptor"
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class UnknownEvent(Event):
    """An event of a type this runtime does not know, kept verbatim."""

    type_name: str
    data: Mapping[str, Any] = field(default_factory=dict)


_CHECKERS: Final[dict[type[Event], tuple[tuple[str, Checker, bool], ...]]] = {
    MessageEvent: (
        ("message_id", _message_id, True),
        ("content", _any, True),
        ("source", _source, False),
    ),
    ReportEvent: (
        ("message_id", _message_id, True),
        ("content", _any, True),
        ("source", _source, False),
        ("delivery", _one_of(frozenset({"quiet", "waking"})), False),
    ),
    TurnStart: (
        ("turn", _nonneg_int, True),
        ("at", _dt_utc, True),
        ("message_ids", _message_ids, False),
    ),
    TurnEnd: (
        ("turn", _nonneg_int, True),
        ("at", _dt_utc, True),
        ("stop_reason", _one_of(STOP_REASONS), True),
        ("output", _any, False),
        ("structured", _any, False),
        ("error", _opt_str, False),
    ),
    InterruptEvent: (
        ("at", _dt_utc, True),
        ("cause", _opt_str, False),
        ("authority", _one_of(frozenset({"user", "ancestor", "self"})), False),
        ("by_session", _opt_session_id, False),
    ),
    SubagentDescriptorEvent: (("payload", _mapping, True),),
}
EVENT_TYPES: Final[dict[str, type[Event]]] = {cls.type: cls for cls in _CHECKERS}
_FIELD_NAMES: Final = {cls: tuple(f.name for f in fields(cls)) for cls in _CHECKERS}


# -- trusted constructors (the runtime's turn loop) ------------------------------
#
# A frozen dataclass __init__ sets each field through object.__setattr__ (about
# 0.15 us a field). The turn loop builds three events per turn from values it
# made itself, so it uses these positional constructors, which store through the
# slot descriptors directly: ~0.5 us less per turn. They skip nothing but the
# keyword handling -- the values are the same, and equality, hashing, repr and
# encoding see an ordinary instance. Not public: callers outside the runtime use
# the dataclass constructors.

_new = object.__new__


def _slot_setters(cls: type[Event], *names: str) -> tuple[Callable[[Any, Any], None], ...]:
    return tuple(cls.__dict__[name].__set__ for name in names)


_TS = _slot_setters(TurnStart, "turn", "at", "message_ids")
_ME = _slot_setters(MessageEvent, "message_id", "content", "source")
_TE = _slot_setters(TurnEnd, "turn", "at", "stop_reason", "output", "structured", "error")


def _turn_start(turn: int, at: _dt.datetime, message_ids: tuple[MessageId, ...]) -> TurnStart:
    ev = _new(TurnStart)
    _TS[0](ev, turn)
    _TS[1](ev, at)
    _TS[2](ev, message_ids)
    return ev


def _message_event(
    message_id: MessageId, content: Any, source: MessageSource | None
) -> MessageEvent:
    ev = _new(MessageEvent)
    _ME[0](ev, message_id)
    _ME[1](ev, content)
    _ME[2](ev, source)
    return ev


def _turn_end(
    turn: int,
    at: _dt.datetime,
    stop_reason: str,
    output: Any,
    structured: Any,
    error: str | None,
) -> TurnEnd:
    ev = _new(TurnEnd)
    set_turn, set_at, set_stop, set_output, set_structured, set_error = _TE
    set_turn(ev, turn)
    set_at(ev, at)
    set_stop(ev, stop_reason)
    set_output(ev, output)
    set_structured(ev, structured)
    set_error(ev, error)
    return ev


_HEADER_CHECKERS: Final = (
    ("id", _session_id, True),
    ("parent_session", _opt_session_id, True),
    ("origin", _one_of(ORIGINS), True),
    ("delegation_depth", _nonneg_int, True),
    ("created_at", _dt_utc, True),
    ("label", _opt_str, False),
    ("seed_len", _nonneg_int, False),
)


def _wire_value(v: Any) -> Any:
    return v.to_wire() if isinstance(v, MessageSource) else v


def _encode_checks(
    checkers: tuple[tuple[str, Checker, bool], ...],
) -> tuple[tuple[str, Checker], ...]:
    # Free-form fields accept anything (their shape is checked when packing), and a
    # source is checked without building the MessageSource the decoder would.
    return tuple(
        (name, _source_ok if check is _source else check)
        for name, check, _ in checkers
        if check is not _any
    )


def _validate(owner: str, checks: tuple[tuple[str, Checker], ...], wire: dict[str, Any]) -> None:
    """Run the decode-side checks on an outgoing map: refuse what reading refuses."""
    for name, check in checks:
        if name not in wire:
            continue  # an optional field left out of the wire form
        try:
            check(wire[name])
        except DecodeError as exc:
            raise EncodeError(f"{owner}.{name}: {exc.args[0]}") from None


_ENCODE_CHECKS: Final = {cls: _encode_checks(checks) for cls, checks in _CHECKERS.items()}
_HEADER_ENCODE_CHECKS: Final = _encode_checks(_HEADER_CHECKERS)


def event_to_wire(event: Event) -> dict[str, Any]:
    """The msgpack-ready map of ``event`` (``{"type": ..., field: value}``).

    Raises:
        EncodeError: ``event`` is not a session event, or a field holds a value
            :func:`event_from_wire` would reject (a log must never receive a record
            that cannot be read back). An :class:`UnknownEvent` must keep a
            ``type_name`` this runtime does not know and no ``"type"`` key in its
            data, or it would not decode as itself.
    """
    if isinstance(event, UnknownEvent):
        if type(event.type_name) is not str or event.type_name in EVENT_TYPES:
            raise EncodeError(
                f"an UnknownEvent needs a str type_name this runtime does not know, "
                f"got {event.type_name!r}"[:200]
            )
        if not isinstance(event.data, Mapping) or "type" in event.data:
            raise EncodeError("an UnknownEvent's data is a mapping without a 'type' key")
        return {"type": event.type_name, **event.data}
    cls = type(event)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        raise EncodeError(f"not a session event: {cls.__name__}")
    wire = {"type": event.type}
    for name in names:
        wire[name] = _wire_value(getattr(event, name))
    _validate(cls.__name__, _ENCODE_CHECKS[cls], wire)
    return wire


def _build(
    cls: type[Any], checkers: tuple[tuple[str, Checker, bool], ...], wire: dict[str, Any]
) -> Any:
    kwargs: dict[str, Any] = {}
    for name, check, required in checkers:
        if name in wire:
            kwargs[name] = check(wire[name])
        elif required:
            raise DecodeError(f"{cls.__name__} is missing field {name!r}")
    return cls(**kwargs)


def event_from_wire(wire: Any) -> Event:
    """Validate a decoded map and build its event; raises :class:`DecodeError`."""
    if not isinstance(wire, dict):
        raise DecodeError(f"an event is a map, got {type(wire).__name__}")
    type_name = wire.get("type")
    if type(type_name) is not str:
        raise DecodeError("an event needs a str 'type'")
    cls = EVENT_TYPES.get(type_name)
    if cls is None:
        return UnknownEvent(
            type_name=type_name, data={k: v for k, v in wire.items() if k != "type"}
        )
    result: Event = _build(cls, _CHECKERS[cls], wire)
    return result


#: Fields holding caller values of any shape; the rest of an event map is shallow.
_FREE_FORM: Final = ("content", "output", "structured", "payload")


def encode_event(event: Event) -> bytes:
    """Pack one event to bytes (:class:`EncodeError` for unrepresentable content)."""
    wire = event_to_wire(event)
    if type(event) is UnknownEvent:
        return packb(wire)
    depth = DEFAULT_LIMITS.max_depth - 1  # free-form values sit one level inside the map
    for name in _FREE_FORM:
        value = wire.get(name)
        if value is not None and type(value) in (dict, list, tuple):
            check_shape(value, depth)
    return pack_shaped(wire)


def decode_event(data: bytes, *, limits: Limits = DEFAULT_LIMITS) -> Event:
    """Decode one event from untrusted bytes; raises :class:`DecodeError` only."""
    return event_from_wire(unpackb(data, limits=limits))


def header_to_wire(header: SessionHeader) -> dict[str, Any]:
    """The msgpack-ready map of ``header``; :class:`EncodeError` as :func:`event_to_wire`."""
    if not isinstance(header, SessionHeader):
        raise EncodeError(f"not a SessionHeader: {type(header).__name__}")
    wire = {name: getattr(header, name) for name, _, _ in _HEADER_CHECKERS}
    if not wire["seed_len"]:
        del wire["seed_len"]  # absent means 0: headers without a fork seed keep their bytes
    _validate("SessionHeader", _HEADER_ENCODE_CHECKS, wire)
    return wire


def header_from_wire(wire: Any) -> SessionHeader:
    if not isinstance(wire, dict):
        raise DecodeError(f"a session header is a map, got {type(wire).__name__}")
    header: SessionHeader = _build(SessionHeader, _HEADER_CHECKERS, wire)
    return header


def encode_header(header: SessionHeader) -> bytes:
    """Pack a session header (:class:`EncodeError` as :func:`encode_event`)."""
    return packb(header_to_wire(header))


def decode_header(data: bytes, *, limits: Limits = DEFAULT_LIMITS) -> SessionHeader:
    """Decode a session header from untrusted bytes; raises :class:`DecodeError` only."""
    return header_from_wire(unpackb(data, limits=limits))
