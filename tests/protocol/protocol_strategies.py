"""Hypothesis strategies for the protocol vocabulary, and a type-strict equality.

Shared by the protocol test modules (imported as a sibling module: pytest puts this
directory on ``sys.path`` because ``tests/protocol`` is not a package).

The vocabularies below (source kinds, stop reasons, authorities, origins) are
written out here on purpose instead of being read from the private modules, so a
change to the documented vocabulary makes a test fail.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import strategies as st
from subagents.protocol import (
    EVENT_TYPES,
    AgentOptionsEvent,
    DecodeError,
    Event,
    ExpectedEvent,
    InterruptEvent,
    MessageEvent,
    MessageId,
    MessageSource,
    ReportEvent,
    RunId,
    SessionHeader,
    SessionId,
    SubagentDescriptorEvent,
    TurnEnd,
    TurnStart,
    UnknownEvent,
)

T = TypeVar("T")

UTC = dt.UTC

SOURCE_KINDS = ("user", "parent", "child", "host", "self")
STOP_REASONS = ("completed", "cancelled", "failed")
DELIVERIES = ("quiet", "waking")
AUTHORITIES = ("user", "ancestor", "self")
ORIGINS = ("user", "subagent")

U64_MAX = 2**64 - 1
I64_MIN = -(2**63)

session_ids = st.binary(min_size=16, max_size=16).map(lambda b: SessionId(b.hex()))
message_ids = st.binary(min_size=16, max_size=16).map(lambda b: MessageId(b.hex()))
run_ids = st.binary(min_size=16, max_size=16).map(lambda b: RunId(b.hex()))
any_ids = st.one_of(session_ids, message_ids, run_ids)

#: Aware UTC datetimes over the whole ``datetime`` range, microsecond precision:
#: msgpack's Timestamp carries nanoseconds, so every one of them round-trips.
utc_datetimes = st.datetimes(
    min_value=dt.datetime(1, 1, 1), max_value=dt.datetime(9999, 12, 31, 23, 59, 59, 999999)
).map(lambda d: d.replace(tzinfo=UTC))

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=I64_MIN, max_value=U64_MAX),
    st.floats(allow_nan=False),
    st.text(max_size=20),
    st.binary(max_size=20),
)

#: JSON-like trees (plus bytes) that the codec round-trips exactly.
json_trees: st.SearchStrategy[Any] = st.recursive(
    scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(st.text(max_size=8), children, max_size=4),
    ),
    max_leaves=16,
)

short_text = st.text(max_size=30)
opt_text = st.none() | short_text
non_neg = st.integers(min_value=0, max_value=U64_MAX)

sources = st.builds(
    MessageSource,
    kind=st.sampled_from(SOURCE_KINDS),
    session_id=st.none() | session_ids,
    # A traced source's W3C traceparent (any short ASCII text is stored as is).
    trace=st.none() | st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=60),
)

message_events = st.builds(
    MessageEvent, message_id=message_ids, content=json_trees, source=st.none() | sources
)
report_events = st.builds(
    ReportEvent,
    message_id=message_ids,
    content=json_trees,
    source=st.none() | sources,
    delivery=st.sampled_from(DELIVERIES),
)
turn_starts = st.builds(
    TurnStart,
    turn=non_neg,
    at=utc_datetimes,
    message_ids=st.lists(message_ids, max_size=4).map(tuple),
)
turn_ends = st.builds(
    TurnEnd,
    turn=non_neg,
    at=utc_datetimes,
    stop_reason=st.sampled_from(STOP_REASONS),
    output=json_trees,
    structured=json_trees,
    error=opt_text,
)
interrupt_events = st.builds(
    InterruptEvent,
    at=utc_datetimes,
    cause=opt_text,
    authority=st.sampled_from(AUTHORITIES),
    by_session=st.none() | session_ids,
)
#: The descriptor event stores its payload raw (any str-keyed map), so the fold can
#: classify it later; the event itself round-trips whatever the payload is.
descriptor_events = st.builds(
    SubagentDescriptorEvent,
    payload=st.dictionaries(st.text(max_size=12), json_trees, max_size=6),
)
#: ``agent/options`` stores its payload raw too (issue 13 point 7, durable ownership).
agent_options_events = st.builds(
    AgentOptionsEvent,
    payload=st.dictionaries(st.text(max_size=12), json_trees, max_size=6),
)
expected_events = st.builds(
    ExpectedEvent,
    message_id=message_ids,
    content=json_trees,
    source=st.none() | sources,
)
unknown_events = st.builds(
    UnknownEvent,
    type_name=st.text(max_size=24).filter(lambda name: name not in EVENT_TYPES),
    data=st.dictionaries(
        st.text(max_size=12).filter(lambda key: key != "type"), json_trees, max_size=5
    ),
)

EVENT_STRATEGIES: dict[type[Event], st.SearchStrategy[Any]] = {
    MessageEvent: message_events,
    ReportEvent: report_events,
    TurnStart: turn_starts,
    TurnEnd: turn_ends,
    InterruptEvent: interrupt_events,
    SubagentDescriptorEvent: descriptor_events,
    AgentOptionsEvent: agent_options_events,
    ExpectedEvent: expected_events,
    UnknownEvent: unknown_events,
}

events: st.SearchStrategy[Event] = st.one_of(*EVENT_STRATEGIES.values())

headers = st.builds(
    SessionHeader,
    id=session_ids,
    parent_session=st.none() | session_ids,
    origin=st.sampled_from(ORIGINS),
    delegation_depth=non_neg,
    created_at=utc_datetimes,
    label=opt_text,
    seed_len=st.just(0) | non_neg,
)


def strict_eq(a: Any, b: Any) -> bool:
    """Equality that also demands equal types, all the way down.

    Plain ``==`` is too forgiving for a codec test: ``MessageId(x) == x``,
    ``1 == 1.0 == True`` and a tuple is never equal to a list, so a decoder that lost
    an id's type or turned a bool into an int would pass an ``==`` round trip.
    """
    if type(a) is not type(b):
        return False
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        return all(strict_eq(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(
            strict_eq(k, _key(b, k)) and strict_eq(a[k], b[k]) for k in a
        )
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(strict_eq(x, y) for x, y in zip(a, b))
    if isinstance(a, dt.datetime):
        return bool(a == b and a.utcoffset() == b.utcoffset())
    if isinstance(a, float) and a == 0.0:
        # -0.0 == 0.0; the sign must survive too.
        return str(a) == str(b)
    result: bool = a == b
    return result


def _key(mapping: dict[Any, Any], key: Any) -> Any:
    """The key object stored in ``mapping`` that equals ``key`` (to compare types)."""
    for k in mapping:
        if k == key:
            return k
    raise KeyError(key)


def assert_same_reading(
    inline: Callable[[Any], Any], table: Callable[[Any], Any], wire: dict[str, Any]
) -> None:
    """``inline(wire)`` and ``table(wire)`` read the same value (of the same types
    all the way down), or both refuse it with the same :class:`DecodeError` text."""
    seen = []
    for read in (inline, table):
        try:
            seen.append(("read", read(wire)))
        except DecodeError as exc:
            seen.append(("refused", str(exc)))
    (inline_kind, inline_value), (table_kind, table_value) = seen
    assert inline_kind == table_kind, (wire, seen)
    if inline_kind == "refused":
        assert inline_value == table_value, (wire, seen)
    else:
        assert strict_eq(inline_value, table_value), (wire, seen)


#: A change's value that drops the field (see :func:`changed`).
DROPPED: Any = object()


def changed(wire: dict[str, Any], change: dict[str, Any]) -> dict[str, Any]:
    """``wire`` with ``change`` applied in place: each field set to its value, or
    dropped where the value is :data:`DROPPED`."""
    for name, value in change.items():
        if value is DROPPED:
            wire.pop(name, None)
        else:
            wire[name] = value
    return wire
