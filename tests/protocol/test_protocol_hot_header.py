"""The inline reader of a session header (``protocol._hot_read.hot_header``) agrees
with the checker table on every map, valid or not: the same header (field values
and their types), or the same ``DecodeError`` -- so what a listing or ``subagents
tree`` reads does not depend on which path read it.

R-REG-9 (values are read back as stored), the store's header rows (tests/vectors).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from protocol_strategies import (
    DROPPED,
    assert_same_reading,
    changed,
    message_ids,
    session_ids,
    strict_eq,
    utc_datetimes,
)
from subagents.protocol import (
    SessionHeader,
    decode_header,
    encode_header,
    new_session_id,
    unpackb,
)
from subagents.protocol._events import header_from_wire, table_header
from subagents.protocol._hot_read import hot_header

valid_headers = st.builds(
    SessionHeader,
    id=session_ids,
    parent_session=st.none() | session_ids,
    origin=st.sampled_from(("user", "subagent")),
    delegation_depth=st.integers(min_value=0, max_value=2**63 - 1),
    created_at=utc_datetimes,
    label=st.none() | st.text(max_size=8),
    seed_len=st.integers(min_value=0, max_value=2**63 - 1),
    max_inbox=st.none() | st.integers(min_value=1, max_value=2**63 - 1),
)
#: What a spoiled field may hold instead: nil, numbers at the edges, a bool, text,
#: an id of the other kind or as a plain str, datetimes naive or of another zone.
spoils = st.one_of(
    st.sampled_from([None, -1, 0, 1, True, False, "", "user", "agent", [], {}, 0.5]),
    session_ids,
    session_ids.map(str),
    message_ids,
    st.just(dt.datetime(2026, 1, 1)),
    st.datetimes(timezones=st.just(dt.timezone(dt.timedelta(hours=5)))),
)
_FIELDS = tuple(f.name for f in dataclasses.fields(SessionHeader))


@st.composite
def header_maps(draw: st.DrawFn) -> dict[str, Any]:
    """A stored header's map as the decoder sees it (through msgpack), with up to
    two fields spoiled or dropped, and maybe a key no header has."""
    wire: dict[str, Any] = unpackb(encode_header(draw(valid_headers)))
    count = draw(st.integers(0, 2))
    for name in set(draw(st.lists(st.sampled_from(_FIELDS), min_size=count, max_size=count))):
        changed(wire, {name: draw(st.one_of(st.just(DROPPED), spoils))})
    if draw(st.booleans()):
        wire["extra"] = draw(spoils)
    return wire


def _assert_agree(wire: dict[str, Any]) -> None:
    assert_same_reading(header_from_wire, table_header, wire)


@settings(max_examples=1500, deadline=None)
@given(wire=header_maps())
def test_the_inline_header_reader_agrees_with_the_table(wire: dict[str, Any]) -> None:
    """The same header, its field values of the same types, or the same refusal."""
    _assert_agree(wire)


def test_each_check_of_the_inline_header_reader() -> None:
    """Each rule the inline reader tests, broken on its own in an otherwise valid
    map, gives what the table gives: the value it accepts, or its refusal."""
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    header = SessionHeader(
        id=new_session_id(),
        parent_session=new_session_id(),
        origin="subagent",
        delegation_depth=2,
        created_at=at,
        label="l",
        seed_len=3,
        max_inbox=4,
    )
    for change in (
        {"id": str(header.id)},
        {"id": DROPPED},
        {"parent_session": None},
        {"parent_session": DROPPED},
        {"parent_session": "x"},
        {"origin": "agent"},
        {"origin": 1},
        {"delegation_depth": -1},
        {"delegation_depth": True},
        {"created_at": dt.datetime(2026, 1, 1)},
        {"created_at": at.astimezone(dt.timezone(dt.timedelta(hours=5)))},
        {"created_at": "2026-01-01"},
        {"label": None},
        {"label": DROPPED},
        {"label": 5},
        {"seed_len": DROPPED},
        {"seed_len": -1},
        {"seed_len": 1.0},
        {"max_inbox": None},
        {"max_inbox": DROPPED},
        {"max_inbox": 0},
        {"max_inbox": False},
    ):
        _assert_agree(changed(unpackb(encode_header(header)), change))


def test_an_ordinary_header_takes_the_inline_path() -> None:
    """A header as the runtime writes it reads inline (not through the table): a
    regression to the table would be invisible in values but not in speed."""
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    for header in (
        SessionHeader(
            id=new_session_id(),
            parent_session=None,
            origin="user",
            delegation_depth=0,
            created_at=at,
        ),
        SessionHeader(
            id=new_session_id(),
            parent_session=new_session_id(),
            origin="subagent",
            delegation_depth=1,
            created_at=at,
            label="c",
            seed_len=2,
            max_inbox=5,
        ),
    ):
        wire = unpackb(encode_header(header))
        read = hot_header(wire)
        assert read is not None and strict_eq(read, header) and read == header
        assert hash(read) == hash(header) and repr(read) == repr(header)
        assert strict_eq(decode_header(encode_header(header)), header)
