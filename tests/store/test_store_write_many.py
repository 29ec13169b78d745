"""``write_many``: several writes as one batch (one transaction on SQLite), failures per op."""

from __future__ import annotations

from subagents.protocol import ErrorCode, SubagentError, new_session_id
from subagents.store import SessionStore, SqliteStore


def test_write_many_applies_in_order_and_isolates_failures(
    store: SessionStore, make_header, make_events
) -> None:  # type: ignore[no-untyped-def]
    a, b = make_header(), make_header()
    unknown = new_session_id()
    results = store.write_many(
        [
            ("create", a, make_events(2)),
            ("append", a.id, make_events(3)),
            ("append", unknown, make_events(1)),  # fails alone
            ("create", b, []),
            ("append", b.id, make_events(1)),
            ("checkpoint", a.id, 4, b"state"),
            ("projection", a.id, "subagent", 0, b"\xc0"),
        ]
    )
    assert results[0] == 1
    assert results[1] == [2, 3, 4]
    assert isinstance(results[2], SubagentError)
    assert results[2].code == ErrorCode.SESSION_NOT_FOUND
    assert results[4] == [0]
    assert [r.seq for r in store.read(a.id)] == [0, 1, 2, 3, 4]
    assert store.get_checkpoint(a.id) == (4, b"state")
    assert store.get_projection(a.id, "subagent") == (0, b"\xc0")
    later = store.write_many([("delete", b.id), ("bogus", a.id)])
    assert later[0] is None
    assert isinstance(later[1], SubagentError)
    assert store.header(b.id) is None


def test_write_many_is_one_transaction(sqlite_store: SqliteStore, make_header, make_events) -> None:  # type: ignore[no-untyped-def]
    headers = [make_header() for _ in range(50)]
    before = sqlite_store.statistics().transactions
    results = sqlite_store.write_many([("create", h, make_events(3)) for h in headers])
    assert results == [2] * 50
    assert sqlite_store.statistics().transactions - before == 1
