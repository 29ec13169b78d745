"""The codec's edges: what packing refuses, the error types, and ``Limits``.

Packing refuses with :class:`EncodeError` (a ``SubagentError`` and a
``TypeError``) anything it cannot represent -- and anything the decoder would
refuse, because a durable log must never hold a record that cannot be read back.
Decoding honours every :class:`Limits` bound exactly: a value at the bound passes,
one past it fails with :class:`DecodeError`.
"""

from __future__ import annotations

import datetime as dt
import enum
import pickle
from typing import Any

import msgpack
import pytest
from subagents.protocol import (
    DEFAULT_LIMITS,
    EXT_CODES,
    CorruptRecordError,
    DecodeError,
    DescriptorCorruptError,
    DescriptorInvalidError,
    DescriptorUnsupportedError,
    EncodeError,
    ErrorCode,
    Event,
    InterruptEvent,
    Limits,
    MessageEvent,
    MessageId,
    MessageSource,
    ReportEvent,
    RunId,
    SessionHeader,
    SessionId,
    SubagentDescriptorEvent,
    SubagentError,
    TurnEnd,
    TurnStart,
    UnknownEvent,
    decode_event,
    encode_event,
    encode_header,
    event_to_wire,
    header_to_wire,
    packb,
    unpackb,
)

UTC = dt.UTC
AT = dt.datetime(2024, 1, 1, tzinfo=UTC)
MID = MessageId("0123456789abcdef0123456789abcdef")
SID = SessionId("00112233445566778899aabbccddeeff")


class Colour(enum.IntEnum):
    RED = 1


# -- error types and codes -------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "stdlib", "code"),
    [
        (EncodeError, TypeError, "ENCODE_ERROR"),
        (DecodeError, ValueError, "DECODE_ERROR"),
        (DescriptorInvalidError, ValueError, "DESCRIPTOR_INVALID"),
        (DescriptorCorruptError, ValueError, "DESCRIPTOR_CORRUPT"),
        (DescriptorUnsupportedError, ValueError, "DESCRIPTOR_UNSUPPORTED"),
    ],
)
def test_leaf_errors_are_subagent_errors_and_stdlib_errors(
    cls: type[SubagentError], stdlib: type[Exception], code: str
) -> None:
    err = cls("boom")
    assert isinstance(err, SubagentError)
    assert isinstance(err, stdlib)
    assert err.code == code
    assert str(err) == f"[{code}] boom"
    # The two families stay apart: an encode error is not a ValueError.
    assert isinstance(err, ValueError) != (cls is EncodeError)


def test_corrupt_record_error_is_a_decode_error_naming_session_and_seq() -> None:
    err = CorruptRecordError("bad row", session_id=SID, seq=7)
    assert isinstance(err, DecodeError)
    assert err.code == "CORRUPT_RECORD"
    assert (err.session_id, err.seq) == (SID, 7)
    assert err.hint == {"session_id": SID, "seq": 7}


def test_seed_error_codes_are_verbatim() -> None:
    assert ErrorCode.UNAUTHORIZED == "UNAUTHORIZED"
    assert ErrorCode.CANCELLED == "CANCELLED"
    assert ErrorCode.PROJECTIONS_UNAVAILABLE == "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE"
    assert ErrorCode.SESSION_STORE_UNAVAILABLE == "SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE"


def test_error_codes_are_distinct_strings() -> None:
    codes = {k: v for k, v in vars(ErrorCode).items() if k.isupper()}
    assert all(isinstance(v, str) and v for v in codes.values())
    assert len(set(codes.values())) == len(codes)


def test_explicit_code_overrides_the_default() -> None:
    err = DecodeError("x", code=ErrorCode.INTERNAL, hint=[1])
    assert (err.code, err.hint) == ("INTERNAL", [1])


@pytest.mark.parametrize(
    "err",
    [
        SubagentError("nope", code=ErrorCode.UNAUTHORIZED, hint={"who": "x"}),
        DecodeError("bad"),
        EncodeError("bad"),
        DescriptorCorruptError("bad"),
        CorruptRecordError("bad row", session_id=SID, seq=3),
    ],
    ids=lambda e: type(e).__name__,
)
def test_errors_survive_pickling(err: SubagentError) -> None:
    """Errors cross process boundaries: type, message, code, hint and extras survive."""
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err)
    assert (str(back), back.code, back.hint) == (str(err), err.code, err.hint)
    assert vars(back) == vars(err)


# -- packing refuses what it cannot represent -------------------------------------


class _Thing:
    """An object msgpack cannot pack, with a repr that names no address (test ids
    must be the same in every collecting process)."""

    def __repr__(self) -> str:
        return "<thing>"


@pytest.mark.parametrize(
    "value",
    [
        {1, 2},
        frozenset({1}),
        _Thing(),
        dt.datetime(2024, 1, 1),  # naive
        [dt.datetime(2024, 1, 1)],
        {"at": dt.datetime(2024, 1, 1)},
        2**64,
        -(2**63) - 1,
        [2**100],
        Colour.RED,  # int subclasses are not silently flattened
        dt.date(2024, 1, 1),
        dt.timedelta(seconds=1),
        complex(1, 2),
        "\ud800",  # a lone surrogate is not UTF-8
    ],
    ids=repr,
)
def test_packing_refuses_with_encode_error(value: Any) -> None:
    with pytest.raises(EncodeError) as info:
        packb(value)
    assert isinstance(info.value, TypeError)
    assert isinstance(info.value, SubagentError)
    assert info.value.code == "ENCODE_ERROR"


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, {"n": [2**70]}], ids=repr)
def test_an_int_out_of_range_is_refused_by_its_range(value: Any) -> None:
    """R-ERR-1: an int msgpack cannot hold (a JSON client's big number, sent on as
    content) is refused naming msgpack's range -- not "a value of type int", which
    reads as if ints could not be sent at all."""
    with pytest.raises(EncodeError) as info:
        packb(value)
    message = str(info.value)
    assert "type int" not in message
    assert "-2**63 to 2**64 - 1" in message and "bits" in message


def test_packing_refuses_a_cycle() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    with pytest.raises(EncodeError):
        packb(cycle)


@pytest.mark.parametrize(
    "value",
    [2**64 - 1, -(2**63), 0, -1, 1.5, True, None, b"", "", [], {}, (1, 2)],
    ids=repr,
)
def test_packing_accepts_the_edges_of_the_representable(value: Any) -> None:
    expected = list(value) if isinstance(value, tuple) else value
    assert unpackb(packb(value)) == expected


def test_str_subclasses_other_than_ids_pack_as_plain_str() -> None:
    class Name(str):
        pass

    decoded = unpackb(packb(Name("x")))
    assert (decoded, type(decoded)) == ("x", str)


@pytest.mark.parametrize(
    "value", [_Thing(), {"type": "message"}, "message", None, Event()], ids=repr
)
def test_encode_event_refuses_non_events(value: Any) -> None:
    with pytest.raises(EncodeError):
        encode_event(value)


@pytest.mark.parametrize(
    "event",
    [
        MessageEvent(message_id=MID, content={1, 2}),
        TurnEnd(turn=1, at=dt.datetime(2024, 1, 1), stop_reason="completed"),
        TurnStart(turn=2**70, at=AT),
        UnknownEvent(type_name="x", data={"k": object()}),
    ],
    ids=lambda e: type(e).__name__,
)
def test_encode_event_refuses_unrepresentable_content(event: Event) -> None:
    with pytest.raises(EncodeError):
        encode_event(event)


def _bad_events() -> dict[str, Event]:
    """Events that pack fine but that ``decode_event`` would reject."""
    return {
        "plain str message_id": MessageEvent(message_id=str(MID), content=1),  # type: ignore[arg-type]
        "session id as message_id": MessageEvent(message_id=SID, content=1),  # type: ignore[arg-type]
        "unknown source kind": MessageEvent(
            message_id=MID, content=1, source=MessageSource(kind="stranger")
        ),
        "plain str source session": MessageEvent(
            message_id=MID,
            content=1,
            source=MessageSource(kind="user", session_id="x"),  # type: ignore[arg-type]
        ),
        "bad delivery": ReportEvent(message_id=MID, content=1, delivery="loud"),
        "negative turn": TurnStart(turn=-1, at=AT),
        "bool turn": TurnStart(turn=True, at=AT),
        "str in message_ids": TurnStart(turn=1, at=AT, message_ids=("x",)),  # type: ignore[arg-type]
        "bad stop reason": TurnEnd(turn=1, at=AT, stop_reason="exploded"),
        "non-str error": TurnEnd(turn=1, at=AT, stop_reason="failed", error=3),  # type: ignore[arg-type]
        "bad authority": InterruptEvent(at=AT, authority="admin"),
        "plain str by_session": InterruptEvent(at=AT, by_session=str(SID)),  # type: ignore[arg-type]
        "payload not a map": SubagentDescriptorEvent(payload=[1]),  # type: ignore[arg-type]
        "unknown event with a known type": UnknownEvent(type_name="message", data={}),
        "unknown event with a type key": UnknownEvent(type_name="x/y", data={"type": "z"}),
        "unknown event with a non-str name": UnknownEvent(type_name=3, data={}),  # type: ignore[arg-type]
    }


@pytest.mark.parametrize("name", list(_bad_events()))
def test_encode_event_refuses_what_decode_event_would_reject(name: str) -> None:
    """A durable log must never receive a record that cannot be read back."""
    event = _bad_events()[name]
    with pytest.raises(EncodeError):
        encode_event(event)
    with pytest.raises(EncodeError):
        event_to_wire(event)


def _header(**overrides: Any) -> SessionHeader:
    fields: dict[str, Any] = {
        "id": SID,
        "parent_session": None,
        "origin": "user",
        "delegation_depth": 0,
        "created_at": AT,
    }
    return SessionHeader(**{**fields, **overrides})


@pytest.mark.parametrize(
    "header",
    [
        _header(id=str(SID)),
        _header(parent_session=str(SID)),
        _header(origin="robot"),
        _header(delegation_depth=-1),
        _header(delegation_depth=True),
        _header(created_at=dt.datetime(2024, 1, 1)),
        _header(label=5),
    ],
    ids=["plain id", "plain parent", "origin", "negative depth", "bool depth", "naive", "label"],
)
def test_encode_header_refuses_what_decode_header_would_reject(header: SessionHeader) -> None:
    with pytest.raises(EncodeError):
        encode_header(header)
    with pytest.raises(EncodeError):
        header_to_wire(header)


# -- decode-side type checks -----------------------------------------------------------


def _wire(**fields: Any) -> bytes:
    return packb(fields)


@pytest.mark.parametrize(
    "data",
    [
        packb([1]),
        packb("message"),
        _wire(),
        _wire(type=1),
        _wire(type="message", content=1),  # missing message_id
        _wire(type="message", message_id=str(MID), content=1),
        _wire(type="message", message_id=RunId(MID), content=1),
        _wire(type="message", message_id=MID, content=1, source="user"),
        _wire(type="message", message_id=MID, content=1, source={"kind": "nobody"}),
        _wire(type="report", message_id=MID, content=1, delivery="loud"),
        _wire(type="turn/start", turn=True, at=AT),
        _wire(type="turn/start", turn=1.0, at=AT),
        _wire(type="turn/start", turn=1, at=AT.timestamp()),
        _wire(type="turn/start", turn=1, at=AT, message_ids=MID),
        _wire(type="turn/end", turn=1, at=AT, stop_reason="weird"),
        _wire(type="turn/end", turn=1, at=AT, stop_reason="failed", error=b"x"),
        _wire(type="interrupt", at=AT, authority="admin"),
        _wire(type="subagent/descriptor", payload=[1]),
        _wire(type="subagent/descriptor"),
    ],
)
def test_decode_event_rejects_ill_typed_fields(data: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_event(data)


def test_decode_event_ignores_unknown_fields_of_known_types() -> None:
    """Room for more: a newer writer may add fields to a known event."""
    event = decode_event(_wire(type="message", message_id=MID, content=1, added_later=True))
    assert event == MessageEvent(message_id=MID, content=1)


def test_unknown_types_decode_to_unknown_event_verbatim() -> None:
    event = decode_event(_wire(type="x/new", a=1, b=[MID]))
    assert event == UnknownEvent(type_name="x/new", data={"a": 1, "b": [MID]})
    assert unpackb(encode_event(event)) == {"type": "x/new", "a": 1, "b": [MID]}


def test_unknown_ext_codes_are_decode_errors() -> None:
    assert set(EXT_CODES) == {1, 2, 3}
    for code in (0, 4, 127, -2, -128):  # fixext16 with an unregistered code
        with pytest.raises(DecodeError):
            unpackb(bytes([0xD8, code & 0xFF]) + b"\x00" * 16)
    for code in EXT_CODES:  # registered code, wrong length (fixext8)
        with pytest.raises(DecodeError):
            unpackb(bytes([0xD7, code]) + b"\x00" * 8)


# -- Limits ----------------------------------------------------------------------------


def _nested(depth: int) -> Any:
    """``depth`` levels of containers, alternating lists and maps."""
    value: Any = None
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


@pytest.mark.parametrize(
    ("field", "at_limit", "past_limit"),
    [
        ("max_str_len", "x" * 10, "x" * 11),
        ("max_str_len", "é" * 5, "é" * 5 + "x"),  # the bound is in UTF-8 bytes
        ("max_bin_len", b"x" * 10, b"x" * 11),
        ("max_array_len", [0] * 10, [0] * 11),
        ("max_map_len", {str(i): 0 for i in range(10)}, {str(i): 0 for i in range(11)}),
        ("max_depth", _nested(10), _nested(11)),
    ],
)
def test_limits_are_exact(field: str, at_limit: Any, past_limit: Any) -> None:
    limits = Limits(**{field: 10})
    assert unpackb(packb(at_limit), limits=limits) == at_limit
    with pytest.raises(DecodeError):
        unpackb(packb(past_limit), limits=limits)


def test_max_ext_len_bounds_ids_and_timestamps() -> None:
    assert unpackb(packb(SID), limits=Limits(max_ext_len=16)) == SID
    with pytest.raises(DecodeError):
        unpackb(packb(SID), limits=Limits(max_ext_len=15))
    with pytest.raises(DecodeError):
        unpackb(packb(AT.replace(microsecond=1)), limits=Limits(max_ext_len=4))


def test_max_buffer_size_bounds_one_frame() -> None:
    data = packb("x" * 100)
    assert unpackb(data, limits=Limits(max_buffer_size=len(data))) == "x" * 100
    with pytest.raises(DecodeError):
        unpackb(data, limits=Limits(max_buffer_size=len(data) - 1))


def test_default_depth_limit_applies_to_events() -> None:
    deep = _nested(DEFAULT_LIMITS.max_depth)  # the event map itself is one more level
    # Built with msgpack itself: packb would refuse to write it.
    wire = msgpack.packb(
        {"type": "message", "message_id": msgpack.ExtType(2, MID.to_bytes()), "content": deep}
    )
    with pytest.raises(DecodeError):
        decode_event(wire)
    shallow = _nested(DEFAULT_LIMITS.max_depth - 1)
    ok = packb({"type": "message", "message_id": MID, "content": shallow})
    assert decode_event(ok) == MessageEvent(message_id=MID, content=shallow)


@pytest.mark.parametrize(
    ("field", "at_limit", "past_limit"),
    [
        ("max_str_len", "x" * 10, "x" * 11),
        ("max_str_len", "é" * 5, "é" * 5 + "x"),
        ("max_bin_len", b"x" * 10, b"x" * 11),
        ("max_array_len", [0] * 10, [0] * 11),
        ("max_array_len", (0,) * 10, (0,) * 11),
        ("max_map_len", {str(i): 0 for i in range(10)}, {str(i): 0 for i in range(11)}),
        ("max_depth", _nested(10), _nested(11)),
        ("max_depth", [[((((((((),),),),),),),)]], [[(((((((((),),),),),),),),)]]),
    ],
)
def test_packing_refuses_what_the_same_limits_would_not_decode(
    field: str, at_limit: Any, past_limit: Any
) -> None:
    limits = Limits(**{field: 10})
    unpackb(packb(at_limit, limits=limits), limits=limits)
    with pytest.raises(EncodeError):
        packb(past_limit, limits=limits)


def test_packing_refuses_a_frame_past_max_buffer_size() -> None:
    limits = Limits(max_buffer_size=102)
    assert unpackb(packb("x" * 100, limits=limits), limits=limits) == "x" * 100
    with pytest.raises(EncodeError):
        packb("x" * 101, limits=limits)


def test_packing_refuses_container_map_keys() -> None:
    """A tuple key packs as an array, which no decoder can use as a key again."""
    with pytest.raises(EncodeError):
        packb({(1, 2): "x"})


def test_encode_event_refuses_content_nested_past_the_default_depth() -> None:
    deep = _nested(DEFAULT_LIMITS.max_depth)
    with pytest.raises(EncodeError):
        encode_event(MessageEvent(message_id=MID, content=deep))
    shallow = _nested(DEFAULT_LIMITS.max_depth - 1)
    event = MessageEvent(message_id=MID, content=shallow)
    assert decode_event(encode_event(event)) == event
