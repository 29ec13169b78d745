"""The on-disk schema of :class:`SqliteStore`: identification, versions, migrations.

A subagents database is an SQLite file whose header carries
:data:`APPLICATION_ID` (``PRAGMA application_id``, bytes 68..71 of the file) and
whose ``schema_version`` table holds one row. :data:`MIGRATIONS` is the migration
hook: ``MIGRATIONS[n]`` takes a database from version ``n`` to ``n + 1`` and runs
inside one ``BEGIN IMMEDIATE`` transaction together with the version bump, so a
crash leaves either version. Later versions add tables (a durable inbox,
cross-process leases, a projection cache) by appending a function here.

Identification happens *before* anything could write to a file (:func:`probe`):
the first 100 bytes are read as plain bytes, and a database is only ever opened
read-only before it is known to be ours -- ``immutable`` when it is in WAL mode,
because even a read-only open of a WAL database creates ``-wal``/``-shm`` files
and a read-write open may checkpoint into it; with locks otherwise, which
create nothing, so that a file another process is setting up is read whole.
A file that is not ours is refused untouched:
``NOT_A_DATABASE`` when it is no SQLite file (no SQLite header) or another
application's, ``DATABASE_CORRUPT`` when it starts with SQLite's header but SQLite
finds it damaged (truncated, overwritten pages: :func:`is_corrupt`), the same code
every later read or write of a damaged file raises.

Version 1:

* ``sessions(id, parent, origin, depth, created_at, header)``: ``header`` is the
  msgpack :class:`SessionHeader` and authoritative; the other columns exist to be
  queried and indexed (``created_at`` in integer microseconds since the epoch, so
  ``ORDER BY created_at, id`` is exact).
* ``events(session, seq, body)``, primary key ``(session, seq)``, ``WITHOUT
  ROWID`` so a session's log is one contiguous range of the primary-key B-tree.
* ``checkpoints(session, seq, data)``: one folded-state blob per session. A rowid
  table, because checkpoint blobs can be large and WITHOUT ROWID suits small rows.

Version 2:

* ``projection_cache(session, unit, seq, data)``: the durable projection cache
  (derived data; ``seq`` is where the value was folded, the listing's fork-seed gate).

Version 3 (see :mod:`._durable`):

* ``inbox(session, n, message_id, body, epoch, done, accepted_at)``: the durable
  inbox, ``n`` the acceptance order within the session, ``(session, message_id)``
  unique (deduplication), a partial index over the pending entries;
* ``leases(session, holder, epoch, expires, wake)``: one lease per session.

Version 4:

* ``holders(holder, expires)``: one heartbeat per lease holder. A renewal writes
  its holder's row alone, and a lease is live until the later of its own
  ``expires`` (set when it is taken) and its holder's heartbeat -- so renewing a
  million leases is one row, not a million. A process of version 3 still running
  reads a lease by its own ``expires`` alone: during a rolling upgrade it may
  take over a session an upgraded process holds once that lease's own expiry
  passed; fencing keeps the loser from writing (it sees ``LEASE_LOST``).

Version 5: ``promises(session, message_id)``, open promises (:mod:`._promises`).
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from collections.abc import Callable
from typing import Final, Literal

from subagents.protocol import ErrorCode, SubagentError

from ._promises import PROMISES_DDL

__all__ = [
    "APPLICATION_ID",
    "MIGRATIONS",
    "SCHEMA_VERSION",
    "check_current",
    "database_corrupt",
    "is_corrupt",
    "migrate",
    "probe",
    "unavailable",
]

#: ``PRAGMA application_id`` of every subagents database: ASCII ``"SUBA"``.
APPLICATION_ID: Final = 0x53554241

_SQLITE_MAGIC: Final = b"SQLite format 3\x00"

Migration = Callable[[sqlite3.Connection], None]


def _v0_to_v1(conn: sqlite3.Connection) -> None:
    conn.execute(
        "CREATE TABLE sessions ("
        " id BLOB PRIMARY KEY NOT NULL,"
        " parent BLOB,"
        " origin TEXT NOT NULL,"
        " depth INTEGER NOT NULL,"
        " created_at INTEGER NOT NULL,"
        " header BLOB NOT NULL"
        ") WITHOUT ROWID"
    )
    conn.execute("CREATE INDEX sessions_by_parent ON sessions(parent, created_at, id)")
    conn.execute("CREATE INDEX sessions_by_created ON sessions(created_at, id)")
    conn.execute(
        "CREATE TABLE events ("
        " session BLOB NOT NULL,"
        " seq INTEGER NOT NULL,"
        " body BLOB NOT NULL,"
        " PRIMARY KEY (session, seq)"
        ") WITHOUT ROWID"
    )
    conn.execute(
        "CREATE TABLE checkpoints ("
        " session BLOB PRIMARY KEY NOT NULL,"
        " seq INTEGER NOT NULL,"
        " data BLOB NOT NULL"
        ")"
    )


def _v1_to_v2(conn: sqlite3.Connection) -> None:
    # The durable projection cache: derived data, one row per (session, unit),
    # ``seq`` being the log position the value was folded at. Droppable at will.
    conn.execute(
        "CREATE TABLE projection_cache ("
        " session BLOB NOT NULL,"
        " unit TEXT NOT NULL,"
        " seq INTEGER NOT NULL,"
        " data BLOB NOT NULL,"
        " PRIMARY KEY (session, unit)"
        ") WITHOUT ROWID"
    )


def _v2_to_v3(conn: sqlite3.Connection) -> None:
    # The durable inbox and the leases: what makes "accepted" mean committed, and
    # one activation per session across processes.
    conn.execute(
        "CREATE TABLE inbox ("
        " session BLOB NOT NULL,"
        " n INTEGER NOT NULL,"
        " message_id BLOB NOT NULL,"
        " body BLOB NOT NULL,"
        " epoch INTEGER,"
        " done INTEGER NOT NULL DEFAULT 0,"
        " accepted_at REAL NOT NULL,"
        " PRIMARY KEY (session, n)"
        ") WITHOUT ROWID"
    )
    conn.execute("CREATE UNIQUE INDEX inbox_by_message ON inbox(session, message_id)")
    conn.execute("CREATE INDEX inbox_by_id ON inbox(message_id)")
    conn.execute("CREATE INDEX inbox_pending ON inbox(session, n) WHERE done = 0")
    conn.execute(
        "CREATE TABLE leases ("
        " session BLOB PRIMARY KEY NOT NULL,"
        " holder TEXT,"
        " epoch INTEGER NOT NULL,"
        " expires REAL NOT NULL,"
        " wake TEXT"
        ") WITHOUT ROWID"
    )
    conn.execute("CREATE INDEX leases_by_holder ON leases(holder)")


def _v3_to_v4(conn: sqlite3.Connection) -> None:
    # One heartbeat per lease holder: a renewal writes one row (see the module doc).
    conn.execute(
        "CREATE TABLE holders (holder TEXT PRIMARY KEY NOT NULL, expires REAL NOT NULL)"
        " WITHOUT ROWID"
    )


def _v4_to_v5(conn: sqlite3.Connection) -> None:
    conn.execute(f"{PROMISES_DDL} WITHOUT ROWID")  # open promises: see ._promises


#: ``MIGRATIONS[n]`` migrates version ``n`` to ``n + 1``; append, never edit.
MIGRATIONS: Final[tuple[Migration, ...]] = (_v0_to_v1, _v1_to_v2, _v2_to_v3, _v3_to_v4, _v4_to_v5)
#: The schema version this code reads and writes.
SCHEMA_VERSION: Final = len(MIGRATIONS)


def unavailable(path: str, why: object) -> SubagentError:
    """The error for a location the store cannot use (directory, permissions...)."""
    return SubagentError(
        f"cannot open a session store at {path!r}: {why}",
        code=ErrorCode.PERSISTENCE_UNAVAILABLE,
        hint={"path": path},
    )


#: SQLite's primary result codes for a damaged file.
_CORRUPT_CODES: Final = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})
_CORRUPT_TEXTS: Final = ("malformed", "not a database", "corrupt")


def is_corrupt(exc: BaseException) -> bool:
    """Whether an SQLite error says the file is damaged (``SQLITE_CORRUPT`` or
    ``SQLITE_NOTADB``, extended codes included; by its text when it has no code)."""
    if not isinstance(exc, sqlite3.DatabaseError):
        return False
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF in _CORRUPT_CODES
    text = str(exc).lower()
    return any(t in text for t in _CORRUPT_TEXTS)


def database_corrupt(path: str | None, exc: object, *, untouched: bool = False) -> SubagentError:
    """``DATABASE_CORRUPT``: an SQLite file that SQLite finds damaged; the message
    carries SQLite's own text (``exc``)."""
    where = "the session store's SQLite file" if path is None else repr(path)
    then = "; it was left untouched" if untouched else ""
    err = SubagentError(
        f"{where} is a damaged SQLite database: {exc}{then}",
        code=ErrorCode.DATABASE_CORRUPT,
        hint={"path": path, "sqlite": str(exc)},
    )
    if isinstance(exc, BaseException):
        err.__cause__ = exc
    return err


def _not_ours(path: str, why: str) -> SubagentError:
    return SubagentError(
        f"{path!r} is not a subagents database ({why}); it was left untouched",
        code=ErrorCode.NOT_A_DATABASE,
        hint={"path": path},
    )


def _too_new(path: str, version: int) -> SubagentError:
    return SubagentError(
        f"{path!r} has schema version {version}; this code supports up to {SCHEMA_VERSION}"
        " (upgrade subagents); it was left untouched",
        code=ErrorCode.SCHEMA_TOO_NEW,
        hint={"path": path, "version": version, "supported": SCHEMA_VERSION},
    )


def _read_version(conn: sqlite3.Connection) -> int | None:
    """The stored version; ``None`` when there is no ``schema_version`` table."""
    row = conn.execute(
        "SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'schema_version'"
    ).fetchone()
    if not row[0]:
        return None
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    if row is None:
        return 0
    if type(row[0]) is not int or row[0] < 0:
        # A damaged file: as SQLite reports one (typed where it is opened or read).
        raise sqlite3.DatabaseError(f"its schema_version holds {row[0]!r}, no version")
    return row[0]


def check_current(conn: sqlite3.Connection, path: str) -> None:
    """Refuse a database this code cannot read as it is, without migrating it.

    Raises:
        SubagentError: ``NOT_A_DATABASE`` (no ``schema_version``),
            ``SCHEMA_TOO_NEW``, or ``PERSISTENCE_UNAVAILABLE`` for an older version
            (a runtime opening it migrates it).
    """
    version = _read_version(conn)
    if version is None:
        raise _not_ours(path, "no schema_version table")
    if version > SCHEMA_VERSION:
        raise _too_new(path, version)
    if version < SCHEMA_VERSION:
        raise unavailable(
            path,
            f"schema version {version}, older than {SCHEMA_VERSION}: open it read-write"
            " (a Runtime on it) once to migrate it",
        )


def _schema_is_empty(conn: sqlite3.Connection) -> bool:
    return bool(conn.execute("SELECT count(*) = 0 FROM sqlite_schema").fetchone()[0])


def _identify(path: str, base: str, head: bytes, timeout: float) -> tuple[int, int | None]:
    """``(application_id, version)`` read in one snapshot of the file at ``base`` (a
    ``mode=ro`` URI); version ``-1``: an empty schema, ``None``: no ``schema_version`` table.

    Read with locks where that makes no file beside it: a file in rollback-journal mode
    (header bytes 18-19 are 1: every file we are still setting up, since a store migrates
    before it switches to WAL); a WAL file whose header names us and whose WAL and index
    are there (a writer has it open). A locking read waits for a writer's commit, and
    reads the WAL, rather than pages half written -- another process setting up the file,
    or checkpointing into it, read as damage. Anything else -- a WAL file with no writer,
    whose main file nothing changes, or where a locking read cannot be made (a hot
    journal a read-only connection cannot roll back, an index it cannot open) -- is read
    ``immutable``: no locks, no ``-wal``/``-shm`` files, nothing written.
    """
    ours = int.from_bytes(head[68:72], "big") == APPLICATION_ID
    live_wal = os.path.exists(path + "-wal") and os.path.exists(path + "-shm")
    if head[18] == head[19] == 1 or (ours and live_wal):
        try:
            return _identify_in(sqlite3.connect(base, uri=True, timeout=timeout))
        except sqlite3.OperationalError as exc:
            name = getattr(exc, "sqlite_errorname", "")
            if not name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN")):
                raise
    return _identify_in(sqlite3.connect(base + "&immutable=1", uri=True))


def foreign_without_wal(path: str) -> bool:
    """Whether a reader other than the file's owner (and not root) finds no WAL and
    index beside it (no writer has it open: the file holds everything). SQLite
    would make them as this user, and leave them: the owner's next writes would
    fail on files it cannot write."""
    if not hasattr(os, "geteuid") or os.geteuid() in (0, os.stat(path).st_uid):
        return False
    return not (os.path.exists(path + "-wal") and os.path.exists(path + "-shm"))


def _identify_in(conn: sqlite3.Connection) -> tuple[int, int | None]:
    try:
        conn.execute("BEGIN")  # one read transaction: the id and the schema agree
        app_id = int(conn.execute("PRAGMA application_id").fetchone()[0])
        if _schema_is_empty(conn):
            return app_id, -1
        return app_id, _read_version(conn)
    except UnicodeDecodeError as exc:  # SQLite's message quotes a damaged schema's bytes
        raise sqlite3.DatabaseError(exc.object.decode(errors="replace")) from exc
    finally:
        conn.close()


def probe(path: str, timeout: float = 5.0) -> Literal["new", "ours"]:
    """Classify ``path`` without writing to it; ``timeout``: seconds to wait for a
    writer's lock (a file another process is setting up).

    Returns:
        ``"new"`` for a missing or empty file or an SQLite file with an empty
        schema (to be initialised), ``"ours"`` for a subagents database this
        code can open.

    Raises:
        SubagentError: ``NOT_A_DATABASE``, ``DATABASE_CORRUPT``, ``SCHEMA_TOO_NEW``
            or ``PERSISTENCE_UNAVAILABLE`` (a directory, a missing parent directory,
            no permission).
    """
    try:
        with open(path, "rb") as f:
            head = f.read(100)
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            raise unavailable(path, f"directory {parent!r} does not exist") from None
        return "new"
    except IsADirectoryError:
        raise unavailable(path, "it is a directory") from None
    except OSError as exc:
        raise unavailable(path, exc) from exc
    if not head:
        return "new"
    if not head.startswith(_SQLITE_MAGIC):
        raise _not_ours(path, "not an SQLite file")
    if len(head) < 100:
        raise database_corrupt(
            path, f"truncated to {len(head)} bytes, inside SQLite's header", untouched=True
        )
    app_id = int.from_bytes(head[68:72], "big")
    if app_id not in (0, APPLICATION_ID):
        raise _not_ours(path, f"SQLite application_id is {app_id:#x}")
    base = "file:" + urllib.parse.quote(os.path.abspath(path)) + "?mode=ro"
    try:
        app_id, version = _identify(path, base, head, timeout)
    except sqlite3.DatabaseError as exc:
        if is_corrupt(exc):  # it starts with SQLite's header: a damaged SQLite file
            raise database_corrupt(path, exc, untouched=True) from exc
        if getattr(exc, "sqlite_errorname", "").startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
            raise unavailable(path, f"locked by another process past {timeout} s") from exc
        raise _not_ours(path, f"unreadable: {exc}") from exc
    except sqlite3.Error as exc:
        raise unavailable(path, exc) from exc
    if app_id == 0:
        if version == -1:
            return "new"
        raise _not_ours(path, "an SQLite database of another application")
    if app_id != APPLICATION_ID:
        raise _not_ours(path, f"SQLite application_id is {app_id:#x}")
    if version is None or version == -1:
        raise _not_ours(path, "no schema_version table")
    if version > SCHEMA_VERSION:
        raise _too_new(path, version)
    return "ours"


def migrate(conn: sqlite3.Connection, path: str) -> int:
    """Bring the database behind ``conn`` to :data:`SCHEMA_VERSION`.

    Each step is one ``BEGIN IMMEDIATE`` transaction that re-reads the version
    under the write lock, so processes opening one file at once migrate it once.
    Version 0 (an empty schema) also stamps :data:`APPLICATION_ID` and creates
    ``schema_version`` in the same transaction as the version-1 tables.

    Returns:
        The number of migration steps this call applied.
    """
    # Current already (every open but a file's first): read without the write
    # lock, so an open never waits behind another process's write.
    try:
        if _read_version(conn) == SCHEMA_VERSION:
            return 0
    except sqlite3.OperationalError:  # locked mid-change: the locked path decides
        pass
    applied = 0
    while True:
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = _read_version(conn)
            if version is None:
                if not _schema_is_empty(conn):
                    raise _not_ours(path, "no schema_version table")
                conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
                conn.execute("INSERT INTO schema_version (version) VALUES (0)")
                version = 0
            if version > SCHEMA_VERSION:
                raise _too_new(path, version)
            if version == SCHEMA_VERSION:
                conn.execute("COMMIT")
                return applied
            MIGRATIONS[version](conn)
            conn.execute("UPDATE schema_version SET version = ?", (version + 1,))
            conn.execute("COMMIT")
            applied += 1
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
