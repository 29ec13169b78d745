"""Arguments of the wrong kind at the store's public calls are ``INVALID_ARGUMENT``
(R-ERR-*: a typed error at every boundary), on every store.

An unhashable ``origin`` raised ``TypeError`` from the origin check; a projection
unit holding a lone surrogate raised ``UnicodeEncodeError`` from an SQL store's
read.
"""

from __future__ import annotations

import datetime as dt

import pytest
from conftest import MakeHeader
from subagents.protocol import ErrorCode, SessionHeader, SubagentError, new_session_id
from subagents.store import SessionStore


def _code(fn: object, *args: object) -> str:
    with pytest.raises(SubagentError) as info:
        fn(*args)  # type: ignore[operator]
    return info.value.code


def test_an_unhashable_origin_is_an_invalid_argument(store: SessionStore) -> None:
    header = SessionHeader(
        id=new_session_id(),
        parent_session=None,
        origin=[],  # type: ignore[arg-type]
        delegation_depth=0,
        created_at=dt.datetime.now(dt.UTC),
    )
    assert _code(store.create_session, header) == ErrorCode.INVALID_ARGUMENT
    assert store.header(header.id) is None


def test_a_unit_no_store_can_keep_is_an_invalid_argument(
    store: SessionStore, make_header: MakeHeader
) -> None:
    header = make_header()
    store.create_session(header)
    unit = "a\ud800"
    assert _code(store.put_projection, header.id, unit, 0, b"x") == ErrorCode.INVALID_ARGUMENT
    for read in (
        lambda: store.get_projection(header.id, unit),
        lambda: store.get_projections(unit),
    ):
        try:
            assert not read()  # nothing kept under it
        except SubagentError as exc:
            assert exc.code == ErrorCode.INVALID_ARGUMENT
