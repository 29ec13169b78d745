"""The inline readers of a turn's events (``protocol._hot_read``) agree with the
checker table on every map, valid or not: the same event (field values and their
types), or the same ``DecodeError`` -- so what a log reads back does not depend
on which path read it.

R-REG-9 (values are read back as stored), the log's wire format (tests/vectors).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from protocol_strategies import (
    DROPPED,
    assert_same_reading,
    changed,
    json_trees,
    message_ids,
    session_ids,
    strict_eq,
    utc_datetimes,
)
from subagents.protocol import (
    Event,
    MessageEvent,
    MessageSource,
    TurnEnd,
    TurnStart,
    decode_event,
    encode_event,
    event_from_wire,
    new_message_id,
    new_session_id,
    unpackb,
)
from subagents.protocol._events import table_event
from subagents.protocol._hot_read import HOT_READ

junk = st.sampled_from(
    [None, -1, 0, 1, True, False, "", "x", "quiet", [], ["x"], {}, 0.5, dt.datetime(2026, 1, 1)]
)
sources = st.none() | st.builds(
    MessageSource,
    kind=st.sampled_from(("user", "parent", "child", "host", "self")),
    session_id=st.none() | session_ids,
    trace=st.none() | st.just("00-" + "a" * 52),
)
valid_events = st.one_of(
    st.builds(MessageEvent, message_id=message_ids, content=json_trees, source=sources),
    st.builds(
        TurnStart,
        turn=st.integers(min_value=0, max_value=2**63 - 1),
        at=utc_datetimes,
        message_ids=st.lists(message_ids, max_size=3).map(tuple),
        redelivered=st.booleans(),
    ),
    st.builds(
        TurnEnd,
        turn=st.integers(min_value=0, max_value=2**63 - 1),
        at=utc_datetimes,
        stop_reason=st.sampled_from(("completed", "cancelled", "failed")),
        output=json_trees,
        structured=st.none() | json_trees,
        error=st.none() | st.text(max_size=10),
        usage=st.none() | st.dictionaries(st.text(max_size=5), st.integers(0, 9), max_size=3),
    ),
)
#: What a spoiled field may hold instead: junk, an id of the other kind, an id as
#: a plain str, a datetime of another zone, a source map of the wrong shape.
anything = st.one_of(
    junk,
    session_ids,
    message_ids,
    message_ids.map(str),
    st.datetimes(timezones=st.just(dt.timezone(dt.timedelta(hours=5)))),
    st.lists(st.one_of(message_ids, junk), max_size=2),
)
#: A source map of any shape: a kind no source has, an id of the other kind...
source_maps = st.fixed_dictionaries(
    {"kind": st.one_of(st.sampled_from(("user", "child", "nobody")), junk)},
    optional={
        "session_id": st.one_of(session_ids, message_ids, junk),
        "trace": st.one_of(st.just("00-" + "b" * 52), junk),
    },
)


@st.composite
def wire_maps(draw: st.DrawFn) -> dict[str, Any]:
    """A stored event's map as the decoder sees it (through msgpack), with up to two
    fields spoiled or dropped, and maybe a key no event has."""
    wire: dict[str, Any] = unpackb(encode_event(draw(valid_events)))
    fields = sorted(set(wire) - {"type"} | {"source", "message_ids", "redelivered", "usage"})
    if wire["type"] == "message":
        fields += ["source", "source"]  # the map with the most ways to be wrong
    count = draw(st.integers(0, 2))  # as often two spoiled fields as none
    for name in set(draw(st.lists(st.sampled_from(fields), min_size=count, max_size=count))):
        spoiled = st.one_of(source_maps, source_maps, anything) if name == "source" else anything
        changed(wire, {name: draw(st.one_of(st.just(DROPPED), spoiled))})
    if draw(st.booleans()):
        wire[draw(st.sampled_from(("extra", "kind", "at")))] = draw(junk)
    return wire


@settings(max_examples=2000, deadline=None)
@given(wire=wire_maps())
def test_the_inline_readers_agree_with_the_table(wire: dict[str, Any]) -> None:
    """The same event, its field values of the same types, or the same refusal."""
    _assert_agree(wire)


def _assert_agree(wire: dict[str, Any]) -> None:
    assert_same_reading(event_from_wire, lambda w: table_event(w["type"], w), wire)


def test_a_turn_s_ordinary_events_take_the_inline_path() -> None:
    """The events a turn writes every time read inline (not through the table): a
    regression to the table would be invisible in values but not in speed."""
    mid = new_message_id()
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    events: list[Event] = [
        TurnStart(turn=1, at=at, message_ids=(mid,)),
        MessageEvent(message_id=mid, content={"a": [1]}, source=MessageSource(kind="user")),
        TurnEnd(turn=1, at=at, stop_reason="completed", output="x"),
    ]
    for event in events:
        wire = unpackb(encode_event(event))
        read = HOT_READ[event.type](wire)
        assert read is not None and strict_eq(read, event)
        assert strict_eq(decode_event(encode_event(event)), event)


_AT = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
_MID = new_message_id()
_SID = new_session_id()
_CASES: list[tuple[Event, dict[str, Any]]] = (
    [
        (MessageEvent(message_id=_MID, content="c", source=MessageSource(kind="child")), change)
        for change in (
            {"source": {"kind": "nobody"}},
            {"source": {"kind": 3}},
            {"source": {"kind": "user", "session_id": _MID}},
            {"source": {"kind": "user", "session_id": str(_SID)}},
            {"source": {"kind": "user", "session_id": _SID, "trace": "00-" + "c" * 52}},
            {"source": {"kind": "user", "trace": 5}},
            {"source": ["user"]},
            {"message_id": str(_MID)},
            {"message_id": _SID},
            {"content": DROPPED},
        )
    ]
    + [
        (TurnStart(turn=2, at=_AT, message_ids=(_MID,)), change)
        for change in (
            {"turn": -1},
            {"turn": True},
            {"turn": 2.0},
            {"at": dt.datetime(2026, 1, 1)},
            {"at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5)))},
            {"at": "2026-01-01"},
            {"message_ids": None},
            {"message_ids": [str(_MID)]},
            {"message_ids": (_MID,)},
            {"redelivered": 1},
            {"redelivered": None},
        )
    ]
    + [
        (TurnEnd(turn=2, at=_AT, stop_reason="completed", output=[1]), change)
        for change in (
            {"stop_reason": "done"},
            {"stop_reason": 1},
            {"error": "boom"},
            {"error": 3},
            {"usage": {"tokens": 1}},
            {"usage": {"tokens": -1}},
            {"turn": DROPPED},
            {"at": DROPPED},
        )
    ]
)


def test_each_check_of_the_inline_readers() -> None:
    """Each rule the inline readers test, broken on its own in an otherwise valid
    map, gives what the table gives: the value it accepts, or its refusal."""
    for event, change in _CASES:
        _assert_agree(changed(unpackb(encode_event(event)), change))
