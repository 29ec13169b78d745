"""Reading many sessions' leases at once (``get_leases``), one contract for every
store: what a renewal asks when many sessions it created are not seen yet.

L-8: a session has at most one lease; the batched read answers exactly what
``get_lease`` answers for each session, in one read (chunked under SQLite's
bound-variable limit).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from conftest import MakeHeader
from subagents.protocol import (
    CorruptRecordError,
    ErrorCode,
    SessionId,
    SubagentError,
    new_session_id,
)
from subagents.store import SessionStore, SqliteStore

NOW = 1_000.0


def test_many_leases_read_at_once_answer_as_one_by_one(
    store: SessionStore, make_header: MakeHeader
) -> None:
    """R-DUR-3: more sessions than one ``IN`` list holds, leased, re-leased, never
    leased, released, and unknown: each answered as ``get_lease`` does."""
    ids: list[SessionId] = []
    for i in range(1_100):
        h = make_header()
        ids.append(h.id)
        store.create_session(h, lease=("me", NOW + 30, None) if i % 3 else None)
    store.acquire_lease(ids[1], "other", now=NOW + 31, expires=NOW + 60, wake="w")
    assert store.release_lease(ids[2], ("me", 1))
    unknown = new_session_id()
    asked: list[SessionId | str] = [*ids, unknown, str(ids[4])]  # a str id too
    found = store.get_leases(asked)
    one_by_one = {s: lease for s in ids if (lease := store.get_lease(s)) is not None}
    assert found == one_by_one
    assert len(found) == 733  # two thirds leased
    assert (found[ids[1]].holder, found[ids[1]].epoch) == ("other", 2)
    assert found[ids[2]].holder is None  # released: the epoch stays
    assert unknown not in found and ids[0] not in found
    assert store.get_leases([]) == {}


def test_bad_arguments_and_a_closed_store(store: SessionStore) -> None:
    for bad in ("not a list", [object()], None):
        with pytest.raises(SubagentError) as err:
            store.get_leases(bad)  # type: ignore[arg-type]
        assert err.value.code == ErrorCode.INVALID_ARGUMENT
    store.close()
    with pytest.raises(SubagentError) as err:
        store.get_leases([new_session_id()])
    assert err.value.code == ErrorCode.STORE_CLOSED


def test_a_damaged_lease_cell_is_named(tmp_path: Path, make_header: MakeHeader) -> None:
    """Bytes from disk: a lease row whose epoch is no integer is ``CORRUPT_RECORD``."""
    path = tmp_path / "c.db"
    h = make_header()
    with SqliteStore(path) as store:
        store.create_session(h, lease=("me", NOW + 30, None))
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("UPDATE leases SET epoch = 'one'")
        conn.close()
        with pytest.raises(CorruptRecordError) as err:
            store.get_leases([h.id])
        assert err.value.code == ErrorCode.CORRUPT_RECORD and "lease epoch" in str(err.value)
