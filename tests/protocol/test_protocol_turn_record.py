"""A turn held as one compact record (``protocol.TurnRecord``) stands for exactly the
events the turn loop appended before it existed: the same values, the same
encoding, byte for byte (issue 20 point 2: "encoded identically on disk").

R-TURN-1 (a turn's events: turn/start, the delivered message, turn/end), R-LOG-2
(the log's wire format is stable: the golden vectors are unchanged).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from protocol_strategies import (
    STOP_REASONS,
    json_trees,
    message_ids,
    non_neg,
    opt_text,
    report_events,
    sources,
    strict_eq,
    utc_datetimes,
)
from subagents.protocol import (
    Event,
    MessageEvent,
    MessageSource,
    ReportEvent,
    TurnEnd,
    TurnRecord,
    TurnStart,
    encode_event,
    materialise,
    new_message_id,
)


@dataclasses.dataclass
class Envelope:
    """What the turn loop hands a record (the inbox's ``Deliver``)."""

    message_id: Any
    content: Any
    source: MessageSource | None = None
    kind: str = "message"
    extra: tuple[Event, ...] = ()
    redelivered: Any = False


@dataclasses.dataclass
class Quiet:
    message_id: Any
    content: Any
    source: MessageSource | None = None


usages = st.none() | st.dictionaries(
    st.text(max_size=8), st.integers(min_value=0, max_value=2**40), max_size=3
)


def _expected(
    turn: int, at: dt.datetime, d: Envelope, context: list[Quiet], end: tuple[Any, ...]
) -> list[Event]:
    """The events as the loop built them one by one, before the record."""
    stop, output, structured, error, usage, end_at = end
    events: list[Event] = [
        TurnStart(turn=turn, at=at, message_ids=(d.message_id,), redelivered=d.redelivered is True),
        *d.extra,
        *(
            ReportEvent(message_id=q.message_id, content=q.content, source=q.source)
            for q in context
        ),
    ]
    if d.kind == "report":
        events.append(
            ReportEvent(
                message_id=d.message_id, content=d.content, source=d.source, delivery="waking"
            )
        )
    else:
        events.append(MessageEvent(message_id=d.message_id, content=d.content, source=d.source))
    events.append(
        TurnEnd(
            turn=turn,
            at=end_at,
            stop_reason=stop,
            output=output,
            structured=structured,
            error=error,
            usage=usage,
        )
    )
    return events


@settings(max_examples=200, deadline=None)
@given(
    turn=non_neg,
    at=st.datetimes(min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(9000, 1, 1)).map(
        lambda d: d.replace(tzinfo=dt.UTC)
    ),
    mid=message_ids,
    content=json_trees,
    source=st.none() | sources,
    kind=st.sampled_from(("message", "report")),
    extra=st.lists(report_events, max_size=2).map(tuple),
    context=st.lists(
        st.builds(Quiet, message_id=message_ids, content=json_trees, source=st.none() | sources),
        max_size=3,
    ),
    redelivered=st.sampled_from((False, True, 2)),
    stop=st.sampled_from(STOP_REASONS),
    output=json_trees,
    structured=json_trees,
    error=opt_text,
    usage=usages,
    elapsed=st.floats(min_value=0, max_value=1e6),
    end_at=st.none() | utc_datetimes,
    between=st.integers(min_value=0, max_value=3),
)
def test_a_record_is_the_events_it_stands_for(
    turn: int,
    at: dt.datetime,
    mid: Any,
    content: Any,
    source: MessageSource | None,
    kind: str,
    extra: tuple[Event, ...],
    context: list[Quiet],
    redelivered: Any,
    stop: str,
    output: Any,
    structured: Any,
    error: str | None,
    usage: Any,
    elapsed: float,
    end_at: dt.datetime | None,
    between: int,
) -> None:
    """Every slot of a record materialises to the event the loop would have built,
    equal in value and type and encoded to the same bytes; other events may lie
    between its head and its end (an interrupt, a steered message); the end's time
    is the start's plus the elapsed time unless one was given."""
    d = Envelope(mid, content, source, kind, extra, redelivered)
    record = TurnRecord(turn, at, d, tuple(context))
    first = 7
    record.seq = first
    others = [MessageEvent(message_id=mid, content=i) for i in range(between)]
    record.end_seq = first + record.size + between
    record.elapsed = elapsed
    record.end = (stop, output, structured, error, usage, end_at)
    slots: list[Any] = [record] * record.size + others + [record]
    got = materialise(first, slots)
    when = end_at if end_at is not None else at + dt.timedelta(seconds=elapsed)
    want = _expected(turn, at, d, context, (stop, output, structured, error, usage, when))
    want[-1:-1] = others
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert strict_eq(a, b)
        assert encode_event(a) == encode_event(b)
    # Built once: a second read hands out the same objects.
    assert all(a is b for a, b in zip(got, materialise(first, slots), strict=True))


def test_a_slice_from_inside_a_record_materialises_by_seq() -> None:
    """A read that starts in the middle of a turn (``from_seq``) gets the events of
    those seqs, not the record's first ones."""
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    record = TurnRecord(3, at, Envelope("m" * 32, "hi"), (Quiet("q" * 32, "ctx"),))
    record.seq, record.end_seq = 10, 13
    record.end = ("completed", "out", None, None, None, None)
    got = materialise(11, [record, record, record])
    assert [type(e) for e in got] == [ReportEvent, MessageEvent, TurnEnd]
    assert got[2].at == at


def test_an_end_not_yet_set_is_refused_and_can_be_replaced_before_it_is_read() -> None:
    """``end_event`` before the turn ended is a ``ValueError`` (never a half event);
    ``ended`` replaces an end that could not be recorded (the loop's fallback)."""
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    record = TurnRecord(0, at, Envelope("m" * 32, "hi"))
    with pytest.raises(ValueError, match="has not ended"):
        record.end_event()
    record.end = ("completed", object(), None, None, None, None)
    first = record.end_event()
    record.ended("failed", None, None, "output cannot be recorded", None)
    second = record.end_event()
    assert first.stop_reason == "completed"
    assert (second.stop_reason, second.output, second.error) == (
        "failed",
        None,
        "output cannot be recorded",
    )
    assert "turn=0" in repr(record)


@given(
    seconds=st.floats(min_value=0, max_value=4_000_000_000, allow_nan=False),
    elapsed=st.floats(min_value=0, max_value=1e6, allow_nan=False),
)
@settings(max_examples=200, deadline=None)
def test_a_start_given_as_posix_seconds_is_dated_when_read(seconds: float, elapsed: float) -> None:
    """Issue 20 point 2 (time taken once per turn, converted when read): a record
    given the system clock's seconds (what the turn loop passes) dates its start
    as ``datetime.fromtimestamp(seconds, UTC)``; its ``turn/start`` and its end
    (start plus elapsed) carry that date, encoded as a datetime would be."""
    d = Envelope(new_message_id(), "hi")
    record = TurnRecord(0, float(seconds), d)
    record.seq, record.end_seq = 0, 2
    record.elapsed = elapsed
    record.end = ("completed", None, None, None, None, None)
    at = dt.datetime.fromtimestamp(seconds, dt.UTC)
    assert record.at == at
    assert record.at is record.at  # dated once
    start, _message, end = materialise(0, [record, record, record])
    assert isinstance(start, TurnStart)
    assert start.at == at
    assert end.at == at + dt.timedelta(seconds=elapsed)
    twin = TurnRecord(0, at, d)
    assert encode_event(start) == encode_event(twin.head()[0])
