"""The inline wire builders of a turn's events (``protocol._hot_wire``) agree with the
checker table on every event, valid or not: the same map (keys, order, values and
their types), or the same ``EncodeError`` -- so the bytes a log holds do not
depend on which path made them, and the golden vectors stay as they are.

R-REG-9 (values are stored as given), the log's wire format (tests/vectors).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from protocol_strategies import (
    json_trees,
    message_ids,
    session_ids,
    strict_eq,
    utc_datetimes,
)
from subagents.protocol import (
    EncodeError,
    Event,
    MessageEvent,
    MessageSource,
    ReportEvent,
    TurnEnd,
    TurnStart,
    encode_event,
    event_to_wire,
    new_message_id,
    pack_shaped,
)
from subagents.protocol._events import table_wire
from subagents.protocol._hot_wire import HOT_WIRE

_new = object.__new__

junk = st.sampled_from(
    [None, -1, 0, 1, True, False, "", "x", "quiet", [], ["x"], {}, 0.5, dt.datetime(2026, 1, 1)]
)
maybe_ids = st.one_of(message_ids, message_ids.map(str), session_ids, junk)
valid_sources = st.none() | st.builds(
    MessageSource,
    kind=st.sampled_from(("user", "parent", "child", "host", "self")),
    session_id=st.none() | session_ids,
)
sources = st.one_of(
    st.none(),
    st.builds(
        MessageSource,
        kind=st.sampled_from(("user", "parent", "child", "host", "self")),
        session_id=st.none() | session_ids,
        trace=st.none() | st.text(max_size=60) | st.just("00-" + "a" * 300),
    ),
    st.builds(
        MessageSource,
        kind=st.one_of(st.text(max_size=6), junk),
        session_id=st.one_of(st.none(), session_ids, message_ids, junk),
        trace=st.none() | junk,
    ),
    st.just({"kind": "user", "session_id": None}),  # a map, not a MessageSource
    st.just(MessageSource(kind="user")),
    junk,
)
times = st.one_of(
    utc_datetimes,
    st.datetimes(timezones=st.just(dt.timezone(dt.timedelta(hours=5)))),
    junk,
)
contents = st.one_of(json_trees, st.just(MessageSource(kind="user")), junk)


def _raw(cls: type[Event], **values: Any) -> Event:
    """An event whose fields hold anything (as a careless caller could make one)."""
    event = _new(cls)
    for f in dataclasses.fields(cls):
        cls.__dict__[f.name].__set__(event, values[f.name])
    return event


#: Per event class: a strategy of valid values for each field, and of anything.
_FIELDS: dict[type[Event], dict[str, tuple[Any, Any]]] = {
    MessageEvent: {
        "message_id": (message_ids, maybe_ids),
        "content": (json_trees, contents),
        "source": (valid_sources, sources),
    },
    ReportEvent: {
        "message_id": (message_ids, maybe_ids),
        "content": (json_trees, contents),
        "source": (valid_sources, sources),
        "delivery": (st.sampled_from(("quiet", "waking")), junk),
    },
    TurnStart: {
        "turn": (st.integers(min_value=0, max_value=2**64 - 1), junk),
        "at": (utc_datetimes, times),
        "message_ids": (
            st.lists(message_ids, max_size=3).map(tuple),
            st.one_of(st.lists(maybe_ids, max_size=3).map(tuple), st.lists(message_ids), junk),
        ),
        "redelivered": (st.booleans(), junk),
    },
    TurnEnd: {
        "turn": (st.integers(min_value=0, max_value=2**64 - 1), junk),
        "at": (utc_datetimes, times),
        "stop_reason": (st.sampled_from(("completed", "cancelled", "failed")), junk),
        "output": (json_trees, contents),
        "structured": (json_trees, contents),
        "error": (st.none() | st.text(max_size=10), junk),
        "usage": (
            st.none() | st.dictionaries(st.text(max_size=5), st.integers(0, 9), max_size=3),
            st.one_of(
                st.dictionaries(st.one_of(st.text(max_size=3), st.integers()), junk, max_size=2),
                junk,
            ),
        ),
    },
}


@st.composite
def events(draw: st.DrawFn) -> Event:
    """A valid event with at most one field (or two) replaced by anything: each check
    is met on its own, not masked by another field's failure."""
    cls = draw(st.sampled_from(list(_FIELDS)))
    spec = _FIELDS[cls]
    spoiled = draw(st.lists(st.sampled_from(list(spec)), max_size=2, unique=True))
    values = {name: draw(spec[name][1] if name in spoiled else spec[name][0]) for name in spec}
    return _raw(cls, **values)


def _outcome(fn: Any, event: Event) -> tuple[str, Any]:
    try:
        return "ok", fn(event)
    except EncodeError as exc:
        return "refused", str(exc)


@settings(max_examples=1500, deadline=None)
@given(event=events())
def test_the_inline_builders_agree_with_the_table(event: Event) -> None:
    """Same map (key order and value types included) or the same refusal; and
    where the map packs, the same bytes as encoding through the table."""
    hot = _outcome(event_to_wire, event)
    table = _outcome(table_wire, event)
    assert hot[0] == table[0]
    if hot[0] == "refused":
        assert hot[1] == table[1]
        return
    assert list(hot[1]) == list(table[1])
    assert strict_eq(hot[1], table[1])
    try:
        data = encode_event(event)
    except EncodeError:
        return
    # The table's map, packed the way encode_event packs it.
    assert data == pack_shaped(table[1])


def test_a_turn_s_ordinary_events_take_the_inline_path() -> None:
    """The events a turn writes every time build inline (not through the table): a
    regression to the table would be invisible in values but not in speed."""
    mid = new_message_id()
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for event in (
        TurnStart(turn=1, at=at, message_ids=(mid,)),
        MessageEvent(message_id=mid, content={"a": [1]}, source=MessageSource(kind="user")),
        ReportEvent(message_id=mid, content="r", delivery="waking"),
        TurnEnd(turn=1, at=at, stop_reason="completed", output="x", usage={"t": 3}),
    ):
        assert HOT_WIRE[type(event)](event) == table_wire(event)
