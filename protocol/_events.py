"""Session events and headers on disk and on the wire.

A session's log is a sequence of events (:mod:`._vocabulary`). On disk and on the wire each event
is one msgpack map whose ``"type"`` key names the class (``"turn/start"``,
``"subagent/descriptor"``, ``"agent/options"``, ...) and whose other keys are the class's fields.
:func:`event_from_wire` validates every field's type and raises
:class:`DecodeError` for anything malformed. A map whose ``type`` this runtime does
not know decodes to :class:`UnknownEvent`, so a log written by a newer runtime
stays readable ("room for more").

The session header is not a log event: a store keeps it beside the log, but it
uses the same codec and the same kind of checks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any, Final

from . import _fields as field
from ._codec import LEAVES, check_shape, pack_shaped, packb, unpackb
from ._errors import DecodeError, EncodeError, ErrorCode, SubagentError
from ._hot_read import HOT_READ, hot_header
from ._hot_wire import HOT_WIRE
from ._limits import DEFAULT_LIMITS, Limits
from ._vocabulary import (
    ORIGINS,
    STOP_REASONS,
    AgentOptionsEvent,
    Checker,
    Event,
    ExpectedEvent,
    InterruptEvent,
    MessageEvent,
    MessageSource,
    ReportEvent,
    SessionHeader,
    SubagentDescriptorEvent,
    TurnEnd,
    TurnStart,
    UnknownEvent,
)

__all__ = [
    "ENVELOPE",
    "EVENT_TYPES",
    "MAX_ERROR_LEN",
    "MAX_NAME_LEN",
    "check_name",
    "check_source",
    "check_value",
    "decode_event",
    "decode_header",
    "encode_event",
    "encode_header",
    "error_text",
    "event_from_wire",
    "event_to_wire",
    "header_from_wire",
    "header_to_wire",
]


def _usage(v: Any) -> Mapping[str, int] | None:
    """A turn's token counters: ``None``, or a map of str to non-negative int."""
    if v is None:
        return None
    if not isinstance(v, dict) or not all(
        type(k) is str and type(n) is int and n >= 0 for k, n in v.items()
    ):
        raise DecodeError("expected a map of str to non-negative int (token usage)")
    return v


_CHECKERS: Final[dict[type[Event], tuple[tuple[str, Checker, bool], ...]]] = {
    MessageEvent: (
        ("message_id", field.message_id, True),
        ("content", field.anything, True),
        ("source", field.source, False),
    ),
    ReportEvent: (
        ("message_id", field.message_id, True),
        ("content", field.anything, True),
        ("source", field.source, False),
        ("delivery", field.one_of(frozenset({"quiet", "waking"})), False),
    ),
    TurnStart: (
        ("turn", field.nonneg_integer, True),
        ("at", field.utc_datetime, True),
        ("message_ids", field.message_ids, False),
        ("redelivered", field.boolean, False),
    ),
    TurnEnd: (
        ("turn", field.nonneg_integer, True),
        ("at", field.utc_datetime, True),
        ("stop_reason", field.one_of(STOP_REASONS), True),
        ("output", field.anything, False),
        ("structured", field.anything, False),
        ("error", field.opt_text, False),
        ("usage", _usage, False),
    ),
    InterruptEvent: (
        ("at", field.utc_datetime, True),
        ("cause", field.opt_text, False),
        ("authority", field.one_of(frozenset({"user", "ancestor", "self"})), False),
        ("by_session", field.opt_session_id, False),
    ),
    SubagentDescriptorEvent: (("payload", field.mapping, True),),
    AgentOptionsEvent: (("payload", field.mapping, True),),
    ExpectedEvent: (
        ("message_id", field.message_id, True),
        ("content", field.anything, True),
        ("source", field.source, False),
    ),
}
EVENT_TYPES: Final[dict[str, type[Event]]] = {cls.type: cls for cls in _CHECKERS}
_FIELD_NAMES: Final = {cls: tuple(f.name for f in fields(cls)) for cls in _CHECKERS}


_HEADER_CHECKERS: Final = (
    ("id", field.session_id, True),
    ("parent_session", field.opt_session_id, True),
    ("origin", field.one_of(ORIGINS), True),
    ("delegation_depth", field.nonneg_integer, True),
    ("created_at", field.utc_datetime, True),
    ("label", field.opt_text, False),
    ("seed_len", field.nonneg_integer, False),
    ("max_inbox", field.opt_positive_integer, False),
)


def _wire_value(v: Any) -> Any:
    return v.to_wire() if isinstance(v, MessageSource) else v


def _encode_checks(
    checkers: tuple[tuple[str, Checker, bool], ...],
) -> tuple[tuple[str, Checker], ...]:
    # Free-form fields accept anything (their shape is checked when packing), and a
    # source is checked without building the MessageSource the decoder would.
    return tuple(
        (name, field.source_ok if check is field.source else check)
        for name, check, _ in checkers
        if check is not field.anything
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
#: Fields added after logs were written, left off the wire at their default: the
#: bytes of every event that does not use them stay what they were.
_OMIT_WHEN_DEFAULT: Final[dict[type[Event], dict[str, Any]]] = {
    TurnStart: {"redelivered": False},
    TurnEnd: {"usage": None},
}
_HEADER_ENCODE_CHECKS: Final = _encode_checks(_HEADER_CHECKERS)


#: The longest name a log stores for a label, a model or a persona (characters).
MAX_NAME_LEN: Final = 4096


def check_name(value: object, what: str) -> None:
    """Refuse a label, model or persona name the log cannot hold: not a ``str``, longer
    than :data:`MAX_NAME_LEN`, or not encodable as UTF-8 (a lone surrogate) --
    ``INVALID_ARGUMENT``, before anything is created. ``None`` passes."""
    if value is None:
        return
    ok = isinstance(value, str) and type(value) is str and len(value) <= MAX_NAME_LEN
    if ok and isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            ok = False
    if not ok:
        # Only a plain str is shown: another object's repr is its own code (it may raise).
        plain = type(value) is str and len(value) < 70
        shown = repr(value) if plain else f"a {type(value).__name__}"
        raise SubagentError(
            f"{what} must be a str of at most {MAX_NAME_LEN} characters that UTF-8 can"
            f" encode, or None; got {shown}",
            code=ErrorCode.INVALID_ARGUMENT,
        )


def check_source(source: MessageSource) -> None:
    """Refuse a :class:`MessageSource` the log cannot hold (an unknown kind, a
    malformed session id) as its encoder would: ``ENCODE_ERROR``, before anything is
    accepted -- also where nothing is encoded at acceptance (a memory store)."""
    try:
        field.source_ok(source.to_wire())
    except DecodeError as exc:
        raise EncodeError(f"message source: {exc.args[0]}") from None


#: Bytes left for an event's own map around the one free-form value it carries (its
#: type, ids, source, delivery; a turn's number, time and stop reason).
ENVELOPE: Final = 512
_VALUE_LIMITS: Final = Limits(max_buffer_size=DEFAULT_LIMITS.max_buffer_size - ENVELOPE)


def check_value(value: Any, within: int = 1) -> None:
    """Refuse a free-form value -- a message's or a report's content, a prompt -- that
    the event carrying it could not hold, by the rules :func:`encode_event` applies:
    it sits ``within`` levels inside its record (1: an event's map), and the frame
    keeps :data:`ENVELOPE` bytes for the rest of the record. ``ENCODE_ERROR``, before
    anything is accepted; also where nothing is encoded yet (a memory store,
    relaxed durability)."""
    if type(value) not in LEAVES:  # a container, a time (check_shape says which)
        check_shape(value, DEFAULT_LIMITS.max_depth - within)
    pack_shaped(value, _VALUE_LIMITS)


#: The longest error text a turn's end records (characters).
MAX_ERROR_LEN: Final = 4096


def error_text(exc: BaseException, prefix: str = "") -> str:
    """``prefix`` and ``"Type: message"`` of ``exc`` as a turn's end records it: at most
    :data:`MAX_ERROR_LEN` characters, lone surrogates escaped, and a message whose
    ``str()`` raises named as such -- text the log always holds."""
    try:
        text = f"{prefix}{type(exc).__name__}: {exc}"
    except Exception:
        text = f"{prefix}{type(exc).__name__} (its message cannot be shown)"
    if len(text) > MAX_ERROR_LEN:
        text = text[: MAX_ERROR_LEN - 3] + "..."
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def event_to_wire(event: Event) -> dict[str, Any]:
    """The msgpack-ready map of ``event`` (``{"type": ..., field: value}``).

    Raises:
        EncodeError: ``event`` is not a session event, or a field holds a value
            :func:`event_from_wire` would reject (a log must never receive a record
            that cannot be read back). An :class:`UnknownEvent` must keep a
            ``type_name`` this runtime does not know and no ``"type"`` key in its
            data, or it would not decode as itself.
    """
    hot = HOT_WIRE.get(type(event))
    if hot is not None:  # a turn's events: built inline (see _hot_wire)
        wire = hot(event)
        if wire is not None:
            return wire
    return table_wire(event)


def table_wire(event: Event) -> dict[str, Any]:
    """:func:`event_to_wire` by the checker table alone: every rule and its message."""
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
    omit = _OMIT_WHEN_DEFAULT.get(cls)
    for name in names:
        value = getattr(event, name)
        if omit is not None and name in omit and value == omit[name]:
            continue
        wire[name] = _wire_value(value)
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
    hot = HOT_READ.get(type_name)
    if hot is not None:  # a turn's events: read inline (see _hot_read)
        event = hot(wire)
        if event is not None:
            return event
    return table_event(type_name, wire)


def table_event(type_name: str, wire: dict[str, Any]) -> Event:
    """:func:`event_from_wire` of a map of type ``type_name`` by the checker table
    alone: every rule and its message."""
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
        if type(value) not in LEAVES:  # a container, a time (check_shape says which)
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
    if wire["max_inbox"] is None:
        del wire["max_inbox"]  # absent means unbounded (and older headers keep their bytes)
    _validate("SessionHeader", _HEADER_ENCODE_CHECKS, wire)
    return wire


def header_from_wire(wire: Any) -> SessionHeader:
    if not isinstance(wire, dict):
        raise DecodeError(f"a session header is a map, got {type(wire).__name__}")
    header = hot_header(wire)  # the common case, read inline (see _hot_read)
    return header if header is not None else table_header(wire)


def table_header(wire: dict[str, Any]) -> SessionHeader:
    """:func:`header_from_wire` of a map by the checker table alone: every rule and
    its message."""
    header: SessionHeader = _build(SessionHeader, _HEADER_CHECKERS, wire)
    return header


def encode_header(header: SessionHeader) -> bytes:
    """Pack a session header (:class:`EncodeError` as :func:`encode_event`)."""
    return packb(header_to_wire(header))


def decode_header(data: bytes, *, limits: Limits = DEFAULT_LIMITS) -> SessionHeader:
    """Decode a session header from untrusted bytes; raises :class:`DecodeError` only."""
    return header_from_wire(unpackb(data, limits=limits))
