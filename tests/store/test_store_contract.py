"""The SessionStore contract, run against MemoryStore and SqliteStore."""

from __future__ import annotations

import dataclasses
import datetime as dt
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from subagents.protocol import (
    CorruptRecordError,
    ErrorCode,
    MessageEvent,
    SessionHeader,
    SubagentError,
    TurnStart,
    new_message_id,
    new_session_id,
)
from subagents.store import LogRecord, MemoryStore, SessionStore, SqliteStore

MakeHeader = Callable[..., SessionHeader]
MakeEvents = Callable[..., list[MessageEvent]]
T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)


def _code(exc_info: pytest.ExceptionInfo[SubagentError]) -> str:
    return exc_info.value.code


# -- create / append / read -----------------------------------------------------


def test_create_returns_last_seq_and_reads_back(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    empty, full = make_header(), make_header()
    events = make_events(3)
    assert store.create_session(empty) == -1
    assert store.create_session(full, events) == 2
    assert store.read(empty.id) == []
    assert store.read(full.id) == [LogRecord(i, e) for i, e in enumerate(events)]
    assert store.header(full.id) == full
    assert store.exists(full.id)
    assert store.last_seq(empty.id) == -1
    assert store.last_seq(full.id) == 2


def test_append_continues_seqs_and_read_from_seq(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    h = make_header()
    first, second = make_events(2, "a"), make_events(3, "b")
    store.create_session(h, first)
    assert store.append(h.id, second) == [2, 3, 4]
    assert store.append(h.id, []) == []
    assert store.last_seq(h.id) == 4
    records = store.read(h.id, 3)
    assert [r.seq for r in records] == [3, 4]
    assert [r.event for r in records] == second[1:]
    assert store.read(h.id, 5) == []
    assert store.read(h.id, 1000) == []
    assert [r.event for r in store.read(h.id)] == first + second


def test_plain_str_ids_are_accepted(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    h = make_header()
    store.create_session(h)
    plain = str.__str__(h.id)
    assert type(plain) is str
    assert store.append(plain, make_events(1)) == [0]
    assert store.last_seq(plain) == 0
    assert store.header(plain) == h
    assert store.exists(plain)


def test_events_of_every_kind_round_trip(store: SessionStore, make_header: MakeHeader) -> None:
    h = make_header()
    events = [
        TurnStart(turn=0, at=T0, message_ids=(new_message_id(),)),
        MessageEvent(message_id=new_message_id(), content={"nested": [1, 2.5, None, "x"]}),
    ]
    store.create_session(h, events)
    assert [r.event for r in store.read(h.id)] == events


def test_memory_store_borrows_event_objects(
    make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """R-REG-9: same-process values are borrowed, not copied."""
    with MemoryStore() as store:
        h = make_header()
        (event,) = make_events(1)
        store.create_session(h)
        store.append(h.id, [event])
        assert store.read(h.id)[0].event is event


def test_create_existing_id_fails_and_keeps_the_original(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    h = make_header()
    events = make_events(2)
    store.create_session(h, events)
    clash = dataclasses.replace(h, label="other")
    with pytest.raises(SubagentError) as exc_info:
        store.create_session(clash, make_events(5))
    assert exc_info.value.code == ErrorCode.SESSION_EXISTS
    assert store.header(h.id) == h
    assert [r.event for r in store.read(h.id)] == events


def test_unknown_session(store: SessionStore) -> None:
    sid = new_session_id()
    calls: list[Callable[[], Any]] = [
        lambda: store.append(sid, []),
        lambda: store.append(sid, [MessageEvent(message_id=new_message_id(), content=1)]),
        lambda: store.read(sid),
        lambda: store.scan(sid),
        lambda: store.last_seq(sid),
        lambda: store.raise_delegation_depth(sid, 1),
        lambda: store.put_checkpoint(sid, 0, b""),
    ]
    for call in calls:
        with pytest.raises(SubagentError) as exc_info:
            call()
        assert exc_info.value.code == ErrorCode.SESSION_NOT_FOUND
    assert store.header(sid) is None
    assert not store.exists(sid)
    assert store.get_checkpoint(sid) is None
    store.delete_session(sid)  # absent: no error


def test_batches_are_atomic(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    h = make_header()
    store.create_session(h, make_events(1))
    bad_batch: list[Any] = [*make_events(2), "not an event"]
    with pytest.raises(SubagentError) as exc_info:
        store.append(h.id, bad_batch)
    assert exc_info.value.code == ErrorCode.INVALID_ARGUMENT
    assert store.last_seq(h.id) == 0
    other = make_header()
    with pytest.raises(SubagentError):
        store.create_session(other, bad_batch)
    assert not store.exists(other.id)
    assert store.all_headers() == [h]


def test_sqlite_refuses_unencodable_content_atomically(
    sqlite_store: SqliteStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    h = make_header()
    sqlite_store.create_session(h)
    batch = [*make_events(2), MessageEvent(message_id=new_message_id(), content=object())]
    with pytest.raises(SubagentError) as exc_info:
        sqlite_store.append(h.id, batch)
    assert exc_info.value.code == ErrorCode.ENCODE_ERROR
    assert sqlite_store.last_seq(h.id) == -1


# -- scan -----------------------------------------------------------------------


def test_scan_is_lazy_and_checks_the_session_at_call(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    h = make_header()
    events = make_events(1200)  # more than one SqliteStore scan chunk
    store.create_session(h, events)
    records = list(store.scan(h.id, 5))
    assert all(isinstance(r, LogRecord) for r in records)
    assert [r.seq for r in records if isinstance(r, LogRecord)] == list(range(5, 1200))
    assert [r.event for r in records if isinstance(r, LogRecord)] == events[5:]
    assert list(store.scan(h.id, 1200)) == []
    assert not any(isinstance(r, CorruptRecordError) for r in records)


# -- headers --------------------------------------------------------------------


def test_raise_delegation_depth_only_rises(store: SessionStore, make_header: MakeHeader) -> None:
    """R-DEPTH-2: the persisted delegation depth is a floor that only rises."""
    h = make_header(depth=2)
    store.create_session(h)
    assert store.raise_delegation_depth(h.id, 1).delegation_depth == 2
    assert store.raise_delegation_depth(h.id, 2).delegation_depth == 2
    raised = store.raise_delegation_depth(h.id, 5)
    assert raised == dataclasses.replace(h, delegation_depth=5)
    assert store.header(h.id) == raised
    assert store.raise_delegation_depth(h.id, 0).delegation_depth == 5
    assert store.header(h.id) == raised


def test_list_headers_orders_by_created_at_then_id(
    store: SessionStore, make_header: MakeHeader
) -> None:
    root = make_header(created_at=T0)
    other_root = make_header(created_at=T0)
    later = T0 + dt.timedelta(microseconds=1)
    # Two creation times, three sessions each: ties are broken by id.
    children = [make_header(parent=root.id, created_at=t) for t in (later, T0) for _ in range(3)]
    grandchild = make_header(parent=children[0].id, created_at=T0 - dt.timedelta(days=1))
    everything = [root, other_root, *children, grandchild]
    shuffled = everything[:]
    random.Random(7).shuffle(shuffled)
    for h in shuffled:
        store.create_session(h)

    def order(headers: list[SessionHeader]) -> list[SessionHeader]:
        return sorted(headers, key=lambda h: (h.created_at, str(h.id)))

    assert store.list_headers(root.id) == order(children)
    assert store.list_headers(None) == order([root, other_root])
    assert store.list_headers(children[0].id) == [grandchild]
    assert store.list_headers(grandchild.id) == []
    assert store.list_headers(new_session_id()) == []
    assert store.all_headers() == order(everything)
    assert store.all_headers()[0] == grandchild


def test_header_and_created_at_survive_exactly(
    store: SessionStore, make_header: MakeHeader
) -> None:
    h = make_header(
        created_at=dt.datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC), label="a label"
    )
    store.create_session(h)
    assert store.header(h.id) == h
    assert store.list_headers(None) == [h]


# -- delete ---------------------------------------------------------------------


def test_delete_session_removes_everything(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    parent = make_header()
    h = make_header(parent=parent.id)
    store.create_session(parent)
    store.create_session(h, make_events(3))
    store.put_checkpoint(h.id, 1, b"state")
    store.delete_session(h.id)
    assert not store.exists(h.id)
    assert store.header(h.id) is None
    assert store.get_checkpoint(h.id) is None
    assert store.list_headers(parent.id) == []
    assert store.all_headers() == [parent]
    store.delete_session(h.id)  # again: no error
    # The id can be created again and its log starts over at seq 0.
    assert store.create_session(h, make_events(1)) == 0
    assert store.append(h.id, make_events(1)) == [1]
    assert store.get_checkpoint(h.id) is None


# -- checkpoints ----------------------------------------------------------------


def test_checkpoints_latest_wins(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    h = make_header()
    store.create_session(h, make_events(4))
    assert store.get_checkpoint(h.id) is None
    store.put_checkpoint(h.id, 1, b"one")
    assert store.get_checkpoint(h.id) == (1, b"one")
    store.put_checkpoint(h.id, 3, bytearray(b"three"))  # type: ignore[arg-type]
    assert store.get_checkpoint(h.id) == (3, b"three")
    store.put_checkpoint(h.id, 0, b"")  # latest write wins, even for a lower seq
    assert store.get_checkpoint(h.id) == (0, b"")


def test_checkpoint_argument_checks(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    h = make_header()
    store.create_session(h, make_events(2))
    bad: list[tuple[Any, Any]] = [(2, b"past the end"), (-1, b""), (True, b""), (0, "text")]
    for seq, data in bad:
        with pytest.raises(SubagentError) as exc_info:
            store.put_checkpoint(h.id, seq, data)
        assert exc_info.value.code == ErrorCode.INVALID_ARGUMENT
    assert store.get_checkpoint(h.id) is None


# -- arguments ------------------------------------------------------------------


def test_bad_arguments_raise_invalid_argument(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    h = make_header()
    store.create_session(h)
    (event,) = make_events(1)
    naive = dataclasses.replace(make_header(), created_at=dt.datetime(2026, 1, 1))
    calls: list[Callable[[], Any]] = [
        lambda: store.append("not-an-id", [event]),
        lambda: store.append(h.id.upper(), [event]),
        lambda: store.append(123, [event]),  # type: ignore[arg-type]
        lambda: store.append(h.id, event),  # type: ignore[arg-type]
        lambda: store.append(h.id, "abc"),  # type: ignore[arg-type]
        lambda: store.append(h.id, None),  # type: ignore[arg-type]
        lambda: store.read(h.id, -1),
        lambda: store.read(h.id, 2**63),
        lambda: store.raise_delegation_depth(h.id, 2**64),
        lambda: store.read(h.id, True),
        lambda: store.read(h.id, "0"),  # type: ignore[arg-type]
        lambda: store.scan(h.id, -1),
        lambda: store.header(b"\x00" * 16),  # type: ignore[arg-type]
        lambda: store.exists(None),  # type: ignore[arg-type]
        lambda: store.last_seq(""),
        lambda: store.raise_delegation_depth(h.id, -1),
        lambda: store.raise_delegation_depth(h.id, 1.0),  # type: ignore[arg-type]
        lambda: store.list_headers("x"),
        lambda: store.delete_session(42),  # type: ignore[arg-type]
        lambda: store.get_checkpoint("zz"),
        lambda: store.flush("nope"),
        lambda: store.create_session({"id": h.id}),  # type: ignore[arg-type]
        lambda: store.create_session(naive),
        lambda: store.create_session(dataclasses.replace(make_header(), delegation_depth=-1)),
        lambda: store.create_session(dataclasses.replace(make_header(), origin="robot")),
        lambda: store.create_session(dataclasses.replace(make_header(), id="short")),  # type: ignore[arg-type]
    ]
    for i, call in enumerate(calls):
        with pytest.raises(SubagentError) as exc_info:
            call()
        assert exc_info.value.code == ErrorCode.INVALID_ARGUMENT, i
    assert store.all_headers() == [h]
    assert store.last_seq(h.id) == -1


def test_header_with_str_ids_is_normalised(store: SessionStore, make_header: MakeHeader) -> None:
    parent = make_header()
    store.create_session(parent)
    child = make_header(parent=parent.id)
    plain_ids: dict[str, Any] = {"id": str(child.id), "parent_session": str(parent.id)}
    plain = dataclasses.replace(child, **plain_ids)
    assert type(plain.id) is str
    store.create_session(plain)
    assert store.header(child.id) == child
    assert store.list_headers(parent.id) == [child]


# -- flags, flush, close ---------------------------------------------------------


def test_class_flags() -> None:
    assert MemoryStore.durable is False
    assert MemoryStore.blocking is False
    assert SqliteStore.durable is True
    assert SqliteStore.blocking is True


def test_flush_keeps_every_write_and_checks_its_argument(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents, tmp_path: Path
) -> None:
    """``flush()`` and ``flush(session)`` leave what was written readable, in order
    (for SQLite: from another connection too, as a restarted process would read it);
    a malformed id is ``INVALID_ARGUMENT``, a closed store ``STORE_CLOSED``."""
    h, other = make_header(), make_header()
    events = make_events(3)
    store.create_session(h, events[:1])
    store.append(h.id, events[1:])
    store.create_session(other, make_events(2, "o"))
    assert store.flush() is None
    assert store.flush(h.id) is None
    assert store.read(h.id) == [LogRecord(i, e) for i, e in enumerate(events)]
    assert store.last_seq(other.id) == 1
    if isinstance(store, SqliteStore):
        with SqliteStore(tmp_path / "s.db") as again:
            assert again.read(h.id) == store.read(h.id)
    with pytest.raises(SubagentError) as err:
        store.flush("not a session id")
    assert _code(err) == ErrorCode.INVALID_ARGUMENT
    store.close()
    with pytest.raises(SubagentError) as err:
        store.flush()
    assert _code(err) == ErrorCode.STORE_CLOSED


def test_close_is_idempotent_and_later_calls_fail(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    h = make_header()
    store.create_session(h, make_events(1))
    store.close()
    store.close()
    calls: list[Callable[[], Any]] = [
        lambda: store.create_session(make_header()),
        lambda: store.append(h.id, make_events(1)),
        lambda: store.read(h.id),
        lambda: store.scan(h.id),
        lambda: store.header(h.id),
        lambda: store.exists(h.id),
        lambda: store.last_seq(h.id),
        lambda: store.raise_delegation_depth(h.id, 1),
        lambda: store.list_headers(None),
        lambda: store.all_headers(),
        lambda: store.delete_session(h.id),
        lambda: store.put_checkpoint(h.id, 0, b""),
        lambda: store.get_checkpoint(h.id),
        lambda: store.flush(),
        lambda: store.put_projection(h.id, "u", 0, b""),
        lambda: store.get_projection(h.id, "u"),
        lambda: store.get_projections("u"),
        lambda: store.get_projections_of("u", [h.id]),
        lambda: store.scan_children([h.id]),
        lambda: store.drop_projections(),
    ]
    for i, call in enumerate(calls):
        with pytest.raises(SubagentError) as exc_info:
            call()
        assert exc_info.value.code == ErrorCode.STORE_CLOSED, i


def test_context_manager_closes(store: SessionStore) -> None:
    with store as same:
        assert same is store
        assert store.all_headers() == []
    with pytest.raises(SubagentError) as exc_info:
        store.all_headers()
    assert exc_info.value.code == ErrorCode.STORE_CLOSED


def test_public_names() -> None:
    import subagents.store as store_module

    assert sorted(store_module.__all__) == sorted(set(store_module.__all__))
    for name in store_module.__all__:
        assert getattr(store_module, name) is not None, name


# -- projection cache (schema v2) ---------------------------------------------------


def test_projection_cache(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    a, b = make_header(), make_header()
    store.create_session(a, make_events(2))
    store.create_session(b)
    assert store.get_projection(a.id, "subagent") is None
    store.put_projection(a.id, "subagent", 1, b"one")
    store.put_projection(a.id, "subagent", 0, b"latest wins")
    store.put_projection(b.id, "subagent", -1, b"")  # folded from an empty log
    store.put_projection(a.id, "subagent_timing", 1, b"t")
    assert store.get_projection(a.id, "subagent") == (0, b"latest wins")
    assert store.get_projections("subagent") == {a.id: (0, b"latest wins"), b.id: (-1, b"")}
    assert store.get_projections("nothing") == {}
    store.delete_session(b.id)
    assert store.get_projections("subagent") == {a.id: (0, b"latest wins")}
    store.drop_projections()
    assert store.get_projection(a.id, "subagent") is None
    assert store.get_projections("subagent_timing") == {}
    with pytest.raises(SubagentError) as exc_info:
        store.put_projection(new_session_id(), "subagent", 0, b"")
    assert exc_info.value.code == ErrorCode.SESSION_NOT_FOUND
    for unit in ("", 3, None):
        with pytest.raises(SubagentError) as exc_info:
            store.put_projection(a.id, unit, 0, b"")  # type: ignore[arg-type]
        assert exc_info.value.code == ErrorCode.INVALID_ARGUMENT


def test_scan_children_reads_the_given_parents_only_in_order(
    store: SessionStore, make_header: MakeHeader
) -> None:
    """``scan_children``: the sessions whose parent is one of the given ones, ordered
    by ``(created_at, id)`` across parents; the same list for a repeated parent;
    nothing for none or an unknown one; a bare id or a non-id is INVALID_ARGUMENT."""
    root, other = make_header(created_at=T0), make_header(created_at=T0)
    later = T0 + dt.timedelta(microseconds=1)
    kids = [make_header(parent=root.id, created_at=t) for t in (later, T0) for _ in range(3)]
    others = [make_header(parent=other.id, created_at=t) for t in (T0, later)]
    grandchild = make_header(parent=kids[0].id, created_at=T0 - dt.timedelta(days=1))
    everything = [root, other, *kids, *others, grandchild]
    random.Random(11).shuffle(everything)
    for h in everything:
        store.create_session(h)

    def order(headers: list[SessionHeader]) -> list[SessionHeader]:
        return sorted(headers, key=lambda h: (h.created_at, str(h.id)))

    assert store.scan_children([root.id]) == order(kids)
    assert store.scan_children([str(root.id), other.id]) == order([*kids, *others])
    assert store.scan_children([root.id, root.id]) == order(kids)
    assert store.scan_children(iter([root.id])) == order(kids)  # type: ignore[arg-type]
    assert store.scan_children([kids[0].id, grandchild.id]) == [grandchild]
    assert store.scan_children([]) == []
    assert store.scan_children([new_session_id()]) == []
    for bad in (root.id, [42], None):
        with pytest.raises(SubagentError) as info:
            store.scan_children(bad)  # type: ignore[arg-type]
        assert info.value.code == ErrorCode.INVALID_ARGUMENT


def test_scan_children_of_more_parents_than_one_query_binds(
    store: SessionStore, make_header: MakeHeader
) -> None:
    """1,200 parents (SQLite reads them in chunks of 500): one list, still in order."""
    parents = [make_header(created_at=T0) for _ in range(1200)]
    kids = [
        make_header(parent=p.id, created_at=T0 + dt.timedelta(seconds=i % 7))
        for i, p in enumerate(parents)
    ]
    store.write_many([("create", h, []) for h in [*parents, *kids]])
    expected = sorted(kids, key=lambda h: (h.created_at, str(h.id)))
    assert store.scan_children([p.id for p in reversed(parents)]) == expected


def test_get_projections_of_reads_the_given_sessions_only(
    store: SessionStore, make_header: MakeHeader
) -> None:
    """``get_projections_of``: the rows of the given sessions that have one (in
    chunks past 500 on SQLite); bad arguments are INVALID_ARGUMENT."""
    headers = [make_header() for _ in range(1100)]
    store.write_many([("create", h, []) for h in headers])
    with_rows = headers[::2]
    for i, h in enumerate(with_rows):
        store.put_projection(h.id, "subagent", i, f"row {i}".encode())
    store.put_projection(headers[1].id, "subagent_timing", 0, b"other unit")
    asked = [h.id for h in headers[:1050]] + [new_session_id()]
    expected = {h.id: (i, f"row {i}".encode()) for i, h in enumerate(with_rows) if i < 525}
    assert store.get_projections_of("subagent", asked) == expected
    assert store.get_projections_of("subagent", []) == {}
    assert store.get_projections_of("subagent_timing", [headers[1].id, headers[0].id]) == {
        headers[1].id: (0, b"other unit")
    }
    for unit, sessions in (("", [headers[0].id]), ("subagent", headers[0].id), ("subagent", [7])):
        with pytest.raises(SubagentError) as info:
            store.get_projections_of(unit, sessions)  # type: ignore[arg-type]
        assert info.value.code == ErrorCode.INVALID_ARGUMENT


def test_read_many_and_pending_many_read_the_given_sessions(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """``read_many`` / ``pending_many``: what ``read`` / ``pending`` give, for each of
    many sessions (in chunks past 500 on the SQL stores), an unknown id absent; an
    empty log and an empty inbox are empty lists; bad arguments are INVALID_ARGUMENT."""
    headers = [make_header() for _ in range(1100)]
    store.write_many([("create", h, []) for h in headers])
    with_log = headers[::3]
    for i, h in enumerate(with_log):
        store.append(h.id, make_events(1 + i % 3, str(i)))
    with_mail = headers[1::5]
    for i, h in enumerate(with_mail):
        store.accept(h.id, make_events(1 + i % 2, f"m{i}"))
    unknown = new_session_id()
    asked = [h.id for h in reversed(headers[:1050])] + [unknown, headers[0].id]
    logs = store.read_many(asked)
    assert set(logs) == {h.id for h in headers[:1050]}
    assert all(logs[h.id] == store.read(h.id) for h in headers[:1050:5])
    assert logs[headers[1].id] == []
    assert len(logs[headers[3].id]) == 2  # type: ignore[arg-type]
    inboxes = store.pending_many(asked)
    assert set(inboxes) == set(logs)
    assert all(inboxes[h.id] == store.pending(h.id) for h in headers[:1050:5])
    assert inboxes[headers[0].id] == [] and len(inboxes[headers[6].id]) == 2
    damaged: dict[Any, list[int]] = {}
    assert store.pending_many(asked, damaged=damaged) == inboxes
    assert damaged == {}
    assert store.read_many([]) == {} and store.pending_many([]) == {}
    for bad in (headers[0].id, [7], None):
        for method in (store.read_many, store.pending_many):
            with pytest.raises(SubagentError) as info:
                method(bad)  # type: ignore[operator]
            assert info.value.code == ErrorCode.INVALID_ARGUMENT


def test_sole_root(store: SessionStore, make_header: MakeHeader) -> None:
    """``sole_root()``: the id of the only session stored with no parent, else None
    (none or several); children do not count (the SQL stores: a listing of that
    root reads the store in one scan)."""
    if isinstance(store, MemoryStore):
        pytest.skip("a memory store lists every tree level by level")
    sole = store.sole_root  # type: ignore[attr-defined]
    assert sole() is None
    root = make_header(created_at=T0)
    store.create_session(root)
    for _ in range(3):
        store.create_session(make_header(parent=root.id, created_at=T0))
    assert sole() == root.id
    store.create_session(make_header(created_at=T0))
    assert sole() is None


def test_scan_children_with_their_cached_rows(store: SessionStore, make_header: MakeHeader) -> None:
    """``scan_children_with(parents, unit)``: what ``scan_children`` gives, the ``unit``
    rows of those children that have one -- not another unit's, not a grandchild's, not
    the parent's -- and the children that have stored children themselves (the catalog
    reads a tree's levels so, where a store offers it: the SQL stores). Each parent's
    children in ``(created_at, id)`` order, one parent's after another's."""
    if isinstance(store, MemoryStore):
        pytest.skip("a memory store has no joined read: the catalog reads the two apart")
    root = make_header(created_at=T0)
    kids = [make_header(parent=root.id, created_at=T0) for _ in range(5)]
    grandchild = make_header(parent=kids[0].id, created_at=T0)
    other = make_header(created_at=T0)
    # Created between root's children: a read ordered by time alone would interleave.
    cousins = [
        make_header(parent=other.id, created_at=T0 + dt.timedelta(seconds=s)) for s in (-1, 1)
    ]
    for h in [root, *kids, grandchild, other, *cousins]:
        store.create_session(h)
    store.create_session(make_header(parent=cousins[1].id, created_at=T0))
    store.put_projection(root.id, "subagent", -1, b"root")
    for i, kid in enumerate(kids[:3]):
        store.put_projection(kid.id, "subagent", -1, b"kid%d" % i)
    store.put_projection(kids[3].id, "other", -1, b"another unit")
    store.put_projection(grandchild.id, "subagent", -1, b"grandchild")
    joined = store.scan_children_with  # type: ignore[attr-defined]
    found, cached, branching = joined([root.id], "subagent")
    assert found == store.scan_children([root.id])
    assert cached == store.get_projections_of("subagent", [k.id for k in kids])
    assert cached == {kid.id: (-1, b"kid%d" % i) for i, kid in enumerate(kids[:3])}
    assert branching == {kids[0].id}
    first, second = sorted([root.id, other.id], key=lambda sid: sid.to_bytes())
    found, _, branching = joined([other.id, root.id], "subagent")
    assert found == store.scan_children([first]) + store.scan_children([second])
    assert branching == {kids[0].id, cousins[1].id}
    assert joined([], "subagent") == ([], {}, set())
    with pytest.raises(SubagentError) as info:
        joined([root.id], "")
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
