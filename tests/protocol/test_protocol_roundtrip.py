"""Hypothesis round trips: ``decode(encode(x))`` gives ``x`` back, types included.

One test per event class (so a failure names the class), one for any event, one for
the session header, and the plain codec over JSON-like trees, ids and timestamps.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from protocol_strategies import (
    EVENT_STRATEGIES,
    any_ids,
    events,
    headers,
    json_trees,
    strict_eq,
    utc_datetimes,
)
from subagents.protocol import (
    EVENT_TYPES,
    Event,
    SessionHeader,
    SessionId,
    decode_event,
    decode_header,
    encode_event,
    encode_header,
    event_from_wire,
    event_to_wire,
    header_from_wire,
    header_to_wire,
    packb,
    unpackb,
)

ROUND_TRIP = settings(max_examples=60, deadline=None)


def test_every_event_class_has_a_strategy() -> None:
    """A new event class without a round-trip strategy fails here."""
    assert set(EVENT_TYPES.values()) <= set(EVENT_STRATEGIES)


@pytest.mark.parametrize("cls", list(EVENT_STRATEGIES), ids=lambda c: c.__name__)
@ROUND_TRIP
@given(data=st.data())
def test_event_round_trip(cls: type[Event], data: st.DataObject) -> None:
    event = data.draw(EVENT_STRATEGIES[cls])
    assert type(event) is cls
    decoded = decode_event(encode_event(event))
    assert decoded == event
    assert strict_eq(decoded, event), (decoded, event)
    source = getattr(event, "source", None)
    if source is not None:  # a decoded source is built by the trusted constructor
        assert hash(decoded.source) == hash(source)  # type: ignore[attr-defined]
        assert repr(decoded.source) == repr(source)  # type: ignore[attr-defined]


@ROUND_TRIP
@given(event=events)
def test_event_wire_map_round_trip(event: Event) -> None:
    """The msgpack-ready map round-trips without going through bytes."""
    wire = event_to_wire(event)
    assert isinstance(wire, dict)
    assert isinstance(wire["type"], str)
    assert strict_eq(event_from_wire(wire), event)


@ROUND_TRIP
@given(event=events)
def test_event_encoding_is_deterministic(event: Event) -> None:
    assert encode_event(event) == encode_event(event)
    assert encode_event(decode_event(encode_event(event))) == encode_event(event)


@ROUND_TRIP
@given(header=headers)
def test_header_round_trip(header: SessionHeader) -> None:
    data = encode_header(header)
    assert strict_eq(decode_header(data), header)
    assert strict_eq(header_from_wire(header_to_wire(header)), header)
    assert encode_header(decode_header(data)) == data


@settings(max_examples=150, deadline=None)
@given(value=json_trees)
def test_json_like_trees_round_trip(value: Any) -> None:
    assert strict_eq(unpackb(packb(value)), value)


@ROUND_TRIP
@given(value=any_ids)
def test_ids_round_trip_as_their_own_type(value: Any) -> None:
    decoded = unpackb(packb(value))
    assert type(decoded) is type(value)
    assert decoded == value


@settings(max_examples=200, deadline=None)
@given(value=utc_datetimes)
def test_utc_datetimes_round_trip_with_microseconds(value: dt.datetime) -> None:
    decoded = unpackb(packb(value))
    assert strict_eq(decoded, value)
    assert decoded.microsecond == value.microsecond


@ROUND_TRIP
@given(
    value=utc_datetimes.filter(lambda d: d.year > 1 and d.year < 9999),
    offset_minutes=st.integers(min_value=-23 * 60, max_value=23 * 60),
)
def test_other_aware_timezones_decode_to_the_same_instant_in_utc(
    value: dt.datetime, offset_minutes: int
) -> None:
    local = value.astimezone(dt.timezone(dt.timedelta(minutes=offset_minutes)))
    decoded = unpackb(packb(local))
    assert decoded == local
    assert decoded.utcoffset() == dt.timedelta(0)


def test_tuples_pack_as_arrays_and_decode_as_lists() -> None:
    """Documented asymmetry: msgpack has one array type; decoding gives lists."""
    assert unpackb(packb((1, (2, 3)))) == [1, [2, 3]]


def test_header_omits_a_zero_seed_len_from_the_wire() -> None:
    """Headers without a fork seed keep the bytes they had before ``seed_len`` existed."""
    base: dict[str, Any] = {
        "id": SessionId("00112233445566778899aabbccddeeff"),
        "parent_session": None,
        "origin": "user",
        "delegation_depth": 0,
        "created_at": dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    }
    assert "seed_len" not in header_to_wire(SessionHeader(**base))
    assert header_to_wire(SessionHeader(**base, seed_len=3))["seed_len"] == 3
    assert decode_header(packb({**base, "label": None})).seed_len == 0
