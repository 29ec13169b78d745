"""SqliteStore and its file: durability, identification, schema, corruption."""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from subagents.protocol import (
    CorruptRecordError,
    ErrorCode,
    MessageEvent,
    SessionHeader,
    SubagentError,
)
from subagents.store import (
    APPLICATION_ID,
    SCHEMA_VERSION,
    LogRecord,
    MemoryStore,
    SqliteStore,
    _schema,
    open_store,
)

MakeHeader = Callable[..., SessionHeader]
MakeEvents = Callable[..., list[MessageEvent]]


def _fingerprint(path: Path) -> tuple[str, int, list[str]]:
    """Bytes, mtime and the directory listing: what "untouched" means."""
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return digest, path.stat().st_mtime_ns, sorted(os.listdir(path.parent))


def _raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


# -- durability -----------------------------------------------------------------


def test_everything_survives_reopening(
    tmp_path: Path, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    path = tmp_path / "d.db"
    parent = make_header()
    child = make_header(parent=parent.id, depth=1, label="kid")
    events = make_events(5)
    with SqliteStore(path) as store:
        store.create_session(parent, events[:2])
        store.append(parent.id, events[2:])
        store.create_session(child)
        store.raise_delegation_depth(child.id, 3)
        store.put_checkpoint(parent.id, 4, b"folded")
    with SqliteStore(str(path)) as store:
        assert store.read(parent.id) == [LogRecord(i, e) for i, e in enumerate(events)]
        assert store.header(child.id).delegation_depth == 3  # type: ignore[union-attr]
        assert store.list_headers(parent.id)[0].label == "kid"
        assert store.get_checkpoint(parent.id) == (4, b"folded")
        assert store.append(parent.id, make_events(1)) == [5]  # seqs continue


def test_new_file_is_stamped_and_in_wal_mode(tmp_path: Path) -> None:
    path = tmp_path / "n.db"
    SqliteStore(path).close()
    head = path.read_bytes()[:100]
    assert head.startswith(b"SQLite format 3\x00")
    assert int.from_bytes(head[68:72], "big") == APPLICATION_ID
    conn = _raw(path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_schema WHERE type='table'")}
        assert {"schema_version", "sessions", "events", "checkpoints"} <= tables
    finally:
        conn.close()


@pytest.mark.parametrize("kind", ["empty file", "empty sqlite"])
def test_empty_files_are_initialised(tmp_path: Path, kind: str, make_header: MakeHeader) -> None:
    path = tmp_path / "e.db"
    if kind == "empty file":
        path.write_bytes(b"")
    else:
        conn = _raw(path)
        conn.execute("VACUUM")  # writes a valid header and an empty schema
        conn.close()
        assert path.stat().st_size > 0
    with SqliteStore(path) as store:
        h = make_header()
        store.create_session(h)
        assert store.header(h.id) == h


def test_synchronous_normal_with_flush(
    tmp_path: Path, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    path = tmp_path / "n.db"
    h = make_header()
    with SqliteStore(path, synchronous="normal") as store:
        store.create_session(h, make_events(3))
        store.flush()
        store.flush(h.id)
    with SqliteStore(path) as store:
        assert store.last_seq(h.id) == 2


def test_flush_under_normal_waits_for_no_reader(
    tmp_path: Path, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """R-STORE (durability): under ``synchronous=NORMAL``, ``flush`` makes the
    committed appends durable without waiting for a reader of an older snapshot
    (another process paused inside a read, or a long listing). It used to run a
    FULL checkpoint, which waited the whole busy timeout for that reader, held
    every writer off meanwhile, and came back busy with the WAL unsynced."""
    path = tmp_path / "n.db"
    h = make_header()
    with SqliteStore(path, synchronous="normal", busy_timeout_s=20.0) as store:
        store.create_session(h, make_events(2))
        reader = _raw(path)
        reader.execute("BEGIN")
        reader.execute("SELECT count(*) FROM sqlite_master").fetchall()  # a snapshot held
        store.append(h.id, make_events(1))  # a frame past the reader's snapshot
        started = time.monotonic()
        store.flush()
        store.flush(h.id)
        # Far below the busy timeout it waited before (20 s): no reader is waited for.
        assert time.monotonic() - started < 10.0
        store.append(h.id, make_events(1))  # writers were never held off
        reader.execute("COMMIT")
        reader.close()
    with SqliteStore(path) as store:
        assert store.last_seq(h.id) == 3


# -- refusing files that are not ours -------------------------------------------


def _other_app_db(path: Path, *, app_id: int = 0, wal: bool = False) -> None:
    conn = _raw(path)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    if app_id:
        conn.execute(f"PRAGMA application_id={app_id}")
    conn.execute("CREATE TABLE users (name TEXT)")
    conn.execute("INSERT INTO users VALUES ('ada')")
    conn.close()


FOREIGN: dict[str, Callable[[Path], object]] = {
    "text": lambda p: p.write_text("hello, I am a text file\n" * 20),
    "short text": lambda p: p.write_text("hi"),
    "random bytes": lambda p: p.write_bytes(bytes(range(256)) * 64),
    "sqlite header then garbage": lambda p: p.write_bytes(b"SQLite format 3\x00" + b"\xff" * 4000),
    "other app sqlite": _other_app_db,
    "other app sqlite (wal)": lambda p: _other_app_db(p, wal=True),
    "other app id": lambda p: _other_app_db(p, app_id=0x1234),
}


@pytest.mark.parametrize("kind", sorted(FOREIGN))
def test_foreign_files_are_refused_untouched(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "foreign.db"
    FOREIGN[kind](path)
    before = _fingerprint(path)
    with pytest.raises(SubagentError) as exc_info:
        SqliteStore(path)
    assert exc_info.value.code == ErrorCode.NOT_A_DATABASE
    assert _fingerprint(path) == before
    with pytest.raises(SubagentError):
        open_store(path)
    assert _fingerprint(path) == before


def _write_version(path: Path, version: int) -> None:
    conn = _raw(path)
    conn.execute("UPDATE schema_version SET version = ?", (version,))
    conn.close()  # the last connection checkpoints the WAL into the file


def test_newer_schema_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    SqliteStore(path).close()
    _write_version(path, SCHEMA_VERSION + 1)
    before = _fingerprint(path)
    with pytest.raises(SubagentError) as exc_info:
        SqliteStore(path)
    assert exc_info.value.code == ErrorCode.SCHEMA_TOO_NEW
    assert exc_info.value.hint["version"] == SCHEMA_VERSION + 1
    assert _fingerprint(path) == before


def test_newer_schema_still_in_the_wal_is_refused(tmp_path: Path) -> None:
    """A newer version whose bump is not yet checkpointed is caught under the lock."""
    path = tmp_path / "future.db"
    SqliteStore(path).close()
    holder = _raw(path)  # keeps the WAL from being checkpointed on close
    holder.execute("PRAGMA wal_autocheckpoint = 0")
    holder.execute("UPDATE schema_version SET version = ?", (SCHEMA_VERSION + 5,))
    try:
        with pytest.raises(SubagentError) as exc_info:
            SqliteStore(path)
        assert exc_info.value.code == ErrorCode.SCHEMA_TOO_NEW
    finally:
        holder.close()


def test_our_magic_without_version_table_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "odd.db"
    _other_app_db(path, app_id=APPLICATION_ID)
    before = _fingerprint(path)
    with pytest.raises(SubagentError) as exc_info:
        SqliteStore(path)
    assert exc_info.value.code == ErrorCode.NOT_A_DATABASE
    assert _fingerprint(path) == before


def test_a_file_another_process_is_committing_is_not_read_half_written(
    tmp_path: Path, make_header: MakeHeader
) -> None:
    """A store sets a new file up (its migration) before it switches to WAL; a
    second process opening the file then must not read the pages the first is
    writing. Forced: a writer holds the file's exclusive lock with every page
    but the first overwritten, as mid-commit; identification waits for the lock
    and reads the finished file (``"ours"``). It read it without locks, and called
    it damaged: ``DATABASE_CORRUPT`` when several workers started on one new
    file."""
    import threading

    path = tmp_path / "new.db"
    with SqliteStore(path) as store:
        store.create_session(make_header())
    with _raw(path) as conn:
        assert conn.execute("PRAGMA journal_mode = DELETE").fetchone()[0] == "delete"
    writer = _raw(path)
    writer.execute("BEGIN EXCLUSIVE")
    good = path.read_bytes()
    with open(path, "r+b") as f:  # pages 2.. as a commit would leave them, half done
        f.seek(4096)
        f.write(b"\xa5" * (len(good) - 4096))
    out: list[object] = []

    def identify() -> None:
        try:
            out.append(_schema.probe(str(path)))
        except SubagentError as exc:
            out.append(exc.code)

    reader = threading.Thread(target=identify)
    reader.start()
    reader.join(0.5)  # time for a read that ignores the lock to go wrong
    path.write_bytes(good)
    writer.rollback()
    writer.close()
    reader.join(10)
    assert out == ["ours"]


def test_a_file_locked_past_the_busy_timeout_is_unavailable_not_foreign(
    tmp_path: Path, make_header: MakeHeader
) -> None:
    """A file of ours another process holds locked (setting it up) past the store's
    busy timeout: ``PERSISTENCE_UNAVAILABLE`` -- a retry may succeed -- never
    ``NOT_A_DATABASE`` ("unreadable: database is locked"), which says for good
    that the file is not ours; the wait is the store's own ``busy_timeout_s``."""
    path = tmp_path / "locked.db"
    with SqliteStore(path) as store:
        store.create_session(make_header())
    with _raw(path) as conn:
        conn.execute("PRAGMA journal_mode = DELETE")
    writer = _raw(path)
    writer.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(SubagentError) as info:
            SqliteStore(path, busy_timeout_s=0.2)
        assert info.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE, info.value
    finally:
        writer.rollback()
        writer.close()
    SqliteStore(path).close()


def test_identifying_a_file_being_checkpointed_reads_it_whole(
    tmp_path: Path, make_header: MakeHeader
) -> None:
    """A live store's file, written and checkpointed into (a worker) while another
    process identifies it (a worker restarting, ``subagents show``): no false
    ``DATABASE_CORRUPT``. An immutable read of the main file read the pages a
    checkpoint was writing: 7% of the identifications of a busy file failed."""
    import threading

    path = tmp_path / "busy.db"
    stop = threading.Event()
    failures: list[BaseException] = []

    def write() -> None:
        try:
            with SqliteStore(path) as store, _raw(path) as conn:
                while not stop.is_set():
                    for _ in range(20):
                        store.create_session(make_header())
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except BaseException as exc:
            failures.append(exc)

    SqliteStore(path).close()
    writer = threading.Thread(target=write)
    writer.start()
    try:
        codes = []
        for _ in range(1500):
            try:
                _schema.probe(str(path))
            except SubagentError as exc:
                codes.append(exc.code)
    finally:
        stop.set()
        writer.join(30)
    assert codes == [] and failures == []


def test_several_processes_open_one_new_file_at_once(tmp_path: Path) -> None:
    """Real processes, 3 rounds of 6: every one opens the new file (none is told
    it is damaged or another application's), and it is ours after."""
    import subprocess
    import sys
    import time

    script = (
        "import sys, time\n"
        "from subagents.store import SqliteStore\n"
        "while time.time() < float(sys.argv[2]): pass\n"
        "SqliteStore(sys.argv[1]).close()\n"
    )
    for i in range(3):
        path = tmp_path / f"new{i}.db"
        start = str(time.time() + 1.0)
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", script, str(path), start],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(6)
        ]
        errors = [(p.communicate(timeout=60)[1], p.returncode) for p in procs]
        assert [code for _err, code in errors] == [0] * 6, (i, errors)
        assert _schema.probe(str(path)) == "ours"


def test_unusable_locations(tmp_path: Path) -> None:
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    for path in (tmp_path, tmp_path / "missing" / "s.db", a_file / "s.db"):
        with pytest.raises(SubagentError) as exc_info:
            SqliteStore(path)
        assert exc_info.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE, path
        assert str(path) in str(exc_info.value)
    assert sorted(os.listdir(tmp_path)) == ["file.txt"]


def test_constructor_argument_checks(tmp_path: Path) -> None:
    path = tmp_path / "a.db"
    bad: list[Callable[[], object]] = [
        lambda: SqliteStore(":memory:"),
        lambda: SqliteStore(""),
        lambda: SqliteStore(42),  # type: ignore[arg-type]
        lambda: SqliteStore(b"bytes.db"),  # type: ignore[arg-type]
        lambda: SqliteStore(path, synchronous="SOMETIMES"),
        lambda: SqliteStore(path, busy_timeout_s=-1),
        lambda: SqliteStore(path, busy_timeout_s="1"),  # type: ignore[arg-type]
        lambda: SqliteStore(path, limits={}),  # type: ignore[arg-type]
    ]
    for i, make in enumerate(bad):
        with pytest.raises(SubagentError) as exc_info:
            make()
        assert exc_info.value.code == ErrorCode.INVALID_ARGUMENT, i
    assert not path.exists()


# -- migrations -----------------------------------------------------------------


def _add_later_table(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE later_table (message BLOB PRIMARY KEY) WITHOUT ROWID")


def _broken(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE half_done (x)")
    raise sqlite3.OperationalError("migration failed halfway")


def test_migration_hook_upgrades_in_a_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_header: MakeHeader
) -> None:
    path = tmp_path / "m.db"
    h = make_header()
    with SqliteStore(path) as store:
        store.create_session(h)
    monkeypatch.setattr(_schema, "MIGRATIONS", (*_schema.MIGRATIONS, _broken))
    monkeypatch.setattr(_schema, "SCHEMA_VERSION", SCHEMA_VERSION + 1)
    with pytest.raises(SubagentError) as exc_info:
        SqliteStore(path)
    assert exc_info.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
    conn = _raw(path)
    try:  # rolled back: still the old version, no half-made table
        assert conn.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION
        assert not conn.execute("SELECT 1 FROM sqlite_schema WHERE name='half_done'").fetchall()
    finally:
        conn.close()
    monkeypatch.setattr(_schema, "MIGRATIONS", (*_schema.MIGRATIONS[:-1], _add_later_table))
    with SqliteStore(path) as store:
        assert store.header(h.id) == h
    conn = _raw(path)
    try:
        assert (
            conn.execute("SELECT version FROM schema_version").fetchone()[0] == SCHEMA_VERSION + 1
        )
        assert conn.execute("SELECT 1 FROM sqlite_schema WHERE name='later_table'").fetchall()
    finally:
        conn.close()


# -- corrupt rows ---------------------------------------------------------------


def test_corrupt_row_is_named_and_the_rest_stays_readable(
    tmp_path: Path, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    path = tmp_path / "c.db"
    bad, good = make_header(), make_header()
    events = make_events(4)
    with SqliteStore(path) as store:
        store.create_session(bad, events)
        store.create_session(good, events)
        conn = _raw(path)
        conn.execute(
            "UPDATE events SET body = ? WHERE session = ? AND seq = 1",
            (b"\xc1garbage", bad.id.to_bytes()),
        )
        conn.execute(
            "UPDATE events SET body = 'text, not a blob' WHERE session = ? AND seq = 3",
            (bad.id.to_bytes(),),
        )
        conn.close()

        with pytest.raises(CorruptRecordError) as exc_info:
            store.read(bad.id)
        err = exc_info.value
        assert (err.code, err.session_id, err.seq) == (ErrorCode.CORRUPT_RECORD, bad.id, 1)
        assert str(bad.id) in str(err)
        assert isinstance(err, ValueError)

        scanned = list(store.scan(bad.id))
        assert [type(r) for r in scanned] == [
            LogRecord,
            CorruptRecordError,
            LogRecord,
            CorruptRecordError,
        ]
        assert [r.seq for r in scanned] == [0, 1, 2, 3]
        assert [r.event for r in scanned if isinstance(r, LogRecord)] == [events[0], events[2]]
        with pytest.raises(CorruptRecordError) as exc_info:
            store.read(bad.id, 2)
        assert exc_info.value.seq == 3
        assert [r.event for r in store.read(good.id)] == events
        assert store.last_seq(bad.id) == 3
        logs = store.read_many([bad.id, good.id])  # one bad log does not hide another
        err = logs[bad.id]
        assert isinstance(err, CorruptRecordError) and (err.session_id, err.seq) == (bad.id, 1)
        assert logs[good.id] == store.read(good.id)
        assert store.append(bad.id, make_events(1)) == [4]  # the log goes on


def test_corrupt_header_names_the_session(tmp_path: Path, make_header: MakeHeader) -> None:
    path = tmp_path / "h.db"
    h = make_header()
    with SqliteStore(path) as store:
        store.create_session(h)
        conn = _raw(path)
        conn.execute("UPDATE sessions SET header = x'00' WHERE id = ?", (h.id.to_bytes(),))
        conn.close()
        with pytest.raises(CorruptRecordError) as exc_info:
            store.header(h.id)
        assert (exc_info.value.session_id, exc_info.value.seq) == (h.id, -1)
        assert store.exists(h.id)
        assert store.last_seq(h.id) == -1


def test_scan_children_reports_a_corrupt_child_in_place(
    tmp_path: Path, make_header: MakeHeader
) -> None:
    """A child header that does not decode comes back from ``scan_children`` as its
    CorruptRecordError, in its place, naming its parent; its siblings still decode."""
    path = tmp_path / "c.db"
    root = make_header()
    kids = [make_header(parent=root.id) for _ in range(3)]
    with SqliteStore(path) as store:
        for h in [root, *kids]:
            store.create_session(h)
        conn = _raw(path)
        conn.execute("UPDATE sessions SET header = x'00' WHERE id = ?", (kids[1].id.to_bytes(),))
        conn.close()
        first, broken, last = store.scan_children([root.id])
        assert (first, last) == (kids[0], kids[2])
        assert isinstance(broken, CorruptRecordError)
        assert (broken.session_id, broken.seq) == (kids[1].id, -1)
        assert broken.hint["parent_session"] == str(root.id)


# -- another writer on the same file ---------------------------------------------


def test_two_stores_on_one_file_share_a_session(
    tmp_path: Path, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """The next-seq cache notices another connection's commits (data_version)."""
    path = tmp_path / "two.db"
    h = make_header()
    with SqliteStore(path) as a, SqliteStore(path) as b:
        a.create_session(h)
        for i in range(6):
            writer = a if i % 2 == 0 else b
            assert writer.append(h.id, make_events(2)) == [2 * i, 2 * i + 1]
        b.delete_session(h.id)
        a.create_session(h)
        assert a.append(h.id, make_events(1)) == [0]
        assert b.append(h.id, make_events(1)) == [1]


def test_seq_conflict_is_retried_when_the_cache_is_stale(
    sqlite_store: SqliteStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """Second line of defence: a primary-key conflict re-reads max(seq)."""
    h = make_header()
    sqlite_store.create_session(h, make_events(2))
    sqlite_store.append(h.id, make_events(1))  # seq 2; the cache now says 3
    conn = _raw(Path(sqlite_store.path))
    conn.execute(
        "INSERT INTO events (session, seq, body) SELECT session, 3, body FROM events"
        " WHERE session = ? AND seq = 0",
        (h.id.to_bytes(),),
    )
    conn.close()
    # Hide the commit from the data_version check, as if it had been missed.
    writer = sqlite_store._writer
    writer._data_version = writer.conn.execute("PRAGMA data_version").fetchone()[0]
    assert sqlite_store.append(h.id, make_events(2)) == [4, 5]
    assert [r.seq for r in sqlite_store.read(h.id)] == list(range(6))


# -- open_store -----------------------------------------------------------------


def test_open_store(tmp_path: Path) -> None:
    assert open_store(None) is None
    memory = MemoryStore()
    assert open_store(memory) is memory
    memory.close()
    for spec in (tmp_path / "p.db", str(tmp_path / "s.db")):
        store = open_store(spec)
        try:
            assert isinstance(store, SqliteStore)
            assert store.path == os.fspath(spec)
        finally:
            assert store is not None
            store.close()
    for bad in (42, b"x.db", object(), ["a"]):
        with pytest.raises(SubagentError) as exc_info:
            open_store(bad)  # type: ignore[arg-type]
        assert exc_info.value.code == ErrorCode.INVALID_ARGUMENT


def test_sqlite_failures_surface_as_subagent_errors(
    tmp_path: Path, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    path = tmp_path / "broken.db"
    h = make_header()
    with SqliteStore(path) as store:
        store.create_session(h, make_events(1))
        conn = _raw(path)
        conn.execute("DROP TABLE events")  # damage the schema behind the store's back
        conn.close()
        for call in (lambda: store.read(h.id), lambda: store.append(h.id, make_events(1))):
            with pytest.raises(SubagentError) as exc_info:
                call()
            assert exc_info.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
            assert isinstance(exc_info.value.__cause__, sqlite3.Error)
        assert store.header(h.id) == h  # what is intact stays readable


def test_scan_children_with_skips_the_row_of_a_corrupt_child(
    tmp_path: Path, make_header: MakeHeader
) -> None:
    """``scan_children_with`` joins each child's cached row to its header row; a child
    whose header does not decode is its CorruptRecordError in place and brings no
    cached row (as the default, which reads rows of decodable children only), nor is
    it named among the children with children (the catalog reads a broken one's
    children anyway)."""
    path = tmp_path / "c.db"
    root = make_header()
    good, bad = make_header(parent=root.id), make_header(parent=root.id)
    with SqliteStore(path) as store:
        for h in (root, good, bad, make_header(parent=bad.id)):
            store.create_session(h)
        for h in (good, bad):
            store.put_projection(h.id, "subagent", -1, b"cached")
        conn = _raw(path)
        conn.execute("UPDATE sessions SET header = x'00' WHERE id = ?", (bad.id.to_bytes(),))
        conn.close()
        found, cached, branching = store.scan_children_with([root.id], "subagent")
        assert good in found
        assert [e.session_id for e in found if isinstance(e, CorruptRecordError)] == [bad.id]
        assert cached == {good.id: (-1, b"cached")}
        assert branching == set()
