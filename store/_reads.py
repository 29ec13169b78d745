"""The read side of the SQL stores: one statement, one snapshot.

:class:`SqlReads` is mixed into :class:`~._sqlite.SqliteStore` and
:class:`~._postgres.PostgresStore`; each provides ``_query`` (one statement on a
pooled connection, every row fetched). The SQL here is written once for both:
``?`` and ``?N`` placeholders (the PostgreSQL store translates them), no
dialect-only syntax. Reads never wait for a writer (SQLite's WAL, PostgreSQL's
MVCC). Stored bytes are decoded against the store's limits; an event that does
not decode is a :class:`~subagents.protocol.CorruptRecordError` for that row,
never another exception type. So is a session row whose key is no 16-byte id: it
is named by its :class:`~._keys.StoredKey` (``x'0102'``); the header scans return
it in place like an undecodable header, and a projection-cache row keyed so is
skipped (derived data).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final

from subagents.protocol import (
    CorruptRecordError,
    DecodeError,
    Limits,
    SessionHeader,
    SessionId,
    decode_event,
)

from ._base import LogRecord, not_found
from ._cells import blob, corrupt_cell, integer
from ._committed import unit_name
from ._keys import StoredKey, raw_key
from ._validate import check_int, check_session_id, check_session_ids
from ._writer import HEADER_CACHE_MAX, NEXT_SEQ, decode_header_row

#: A scan of at least this many children keeps their headers cached.
_REMEMBER_FROM = 64

__all__ = ["SqlReads"]

_SCAN_CHUNK: Final = 512
#: Parents per ``IN (...)``: under the 999 bound variables of older SQLite builds.
_IN_CHUNK: Final = 500

_READ: Final = (
    "SELECT e.seq, e.body FROM sessions AS s"
    " LEFT JOIN events AS e ON e.session = s.id AND e.seq >= ?2"
    " WHERE s.id = ?1 ORDER BY e.seq"
)


def _bad_key(key: StoredKey) -> CorruptRecordError:
    """The error of a session row whose key is no session id (named by ``key``)."""
    return CorruptRecordError(f"session {key}: {key.describe()}", session_id=key, seq=-1)


def _corrupt(session_id: SessionId, seq: int, exc: DecodeError) -> CorruptRecordError:
    err = CorruptRecordError(
        f"session {session_id} seq {seq}: stored event does not decode: {exc}",
        session_id=session_id,
        seq=seq,
    )
    err.__cause__ = exc
    return err


class SqlReads:
    """Reads of a SQL store (which sets the attributes below)."""

    _limits: Limits
    _header_cache: dict[bytes, SessionHeader]
    _id_cache: dict[bytes, SessionId]

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        """Run one read statement on a pooled connection and fetch every row."""
        raise NotImplementedError

    def _decode(self, session_id: SessionId, seq: int, body: bytes) -> LogRecord:
        if type(seq) is not int:  # SQLite keeps what a column is given
            raise corrupt_cell(session_id, "event seq", seq)
        try:
            return LogRecord(seq, decode_event(body, limits=self._limits))
        except DecodeError as exc:
            raise _corrupt(session_id, seq, exc) from exc

    def read(self, session_id: SessionId | str, from_seq: int = 0) -> list[LogRecord]:
        sid = check_session_id(session_id)
        check_int(from_seq, "from_seq")
        rows = self._query(_READ, (sid.to_bytes(), from_seq))
        if not rows:
            raise not_found(sid)
        if rows[0][0] is None:  # the session exists; no event at or after from_seq
            return []
        decode = self._decode
        return [decode(sid, seq, body) for seq, body in rows]

    def read_many(
        self, session_ids: Iterable[SessionId | str]
    ) -> dict[SessionId, list[LogRecord] | CorruptRecordError]:
        logs: dict[SessionId, list[LogRecord] | CorruptRecordError] = {}
        decode = self._decode
        runs = self._each_session(session_ids, "t.seq, t.body", "events", "t.seq")
        for sid, group in runs:
            records: list[LogRecord] = []
            logs[sid] = records
            for _key, seq, body in group:
                if seq is None:  # a session with no event
                    break
                try:
                    records.append(decode(sid, seq, body))
                except CorruptRecordError as exc:
                    logs[sid] = exc
                    break
        return logs

    def scan(
        self, session_id: SessionId | str, from_seq: int = 0
    ) -> Iterator[LogRecord | CorruptRecordError]:
        sid = check_session_id(session_id)
        check_int(from_seq, "from_seq")
        if not self.exists(sid):
            raise not_found(sid)
        return self._scan(sid, from_seq)

    def _scan(self, sid: SessionId, seq: int) -> Iterator[LogRecord | CorruptRecordError]:
        key = sid.to_bytes()
        while True:
            rows = self._query(
                "SELECT seq, body FROM events WHERE session = ? AND seq >= ? ORDER BY seq LIMIT ?",
                (key, seq, _SCAN_CHUNK),
            )
            last = None
            for row_seq, body in rows:
                try:
                    yield self._decode(sid, row_seq, body)
                except CorruptRecordError as exc:
                    yield exc
                if type(row_seq) is int:
                    last = row_seq
            # Seqs that are no integers (a damaged file) sort after every integer.
            if len(rows) < _SCAN_CHUNK or last is None:
                return
            seq = last + 1

    def header(self, session_id: SessionId | str) -> SessionHeader | None:
        sid = check_session_id(session_id)
        rows = self._query("SELECT header FROM sessions WHERE id = ?", (sid.to_bytes(),))
        return decode_header_row(sid, rows[0][0], self._header_cache, False) if rows else None

    def headers_many(
        self, session_ids: Iterable[SessionId | str]
    ) -> dict[SessionId, SessionHeader | CorruptRecordError]:
        """Each given session's header, a chunk of sessions per statement, for a
        reader of many (a listing re-checking what it enumerated): one that does not
        decode maps to its :class:`CorruptRecordError` (as :meth:`header` raises
        it); an id that names no stored session is absent."""
        keys = [s.to_bytes() for s in check_session_ids(session_ids)]
        rows = self._query_in("SELECT id, header FROM sessions WHERE id IN ({})", keys)
        found: dict[SessionId, SessionHeader | CorruptRecordError] = {}
        for key, data in rows:
            sid = self._session_id(bytes(key))
            try:
                found[sid] = decode_header_row(sid, data, self._header_cache, False)
            except CorruptRecordError as exc:
                found[sid] = exc
        return found

    def exists(self, session_id: SessionId | str) -> bool:
        sid = check_session_id(session_id)
        return bool(self._query("SELECT 1 FROM sessions WHERE id = ?", (sid.to_bytes(),)))

    def last_seq(self, session_id: SessionId | str) -> int:
        sid = check_session_id(session_id)
        exists, last = self._query(NEXT_SEQ, (sid.to_bytes(),))[0]
        if not exists:
            raise not_found(sid)
        return -1 if last is None else integer(last, sid, "event seq")

    def _headers(self, where: str, params: tuple[Any, ...]) -> list[SessionHeader]:
        rows = self._query(
            f"SELECT id, header FROM sessions {where} ORDER BY created_at, id", params
        )
        return [self._decode_row(key, blob) for key, blob in rows]

    def _session_id(self, key: bytes) -> SessionId:
        """The SessionId for 16 raw id bytes of our own table (shared when known)."""
        sid = self._id_cache.get(key)
        if sid is None:
            sid = SessionId.from_bytes(key)
        return sid

    def _decode_row(self, key: Any, blob: bytes, remember: bool = True) -> SessionHeader:
        """A stored header row; ``remember``: keep it in the header and id caches
        (a big listing, read again warm), else only read them (a small one)."""
        if type(key) is not bytes or len(key) != 16:
            key = raw_key(key)
            if isinstance(key, StoredKey):
                raise _bad_key(key)
        header = decode_header_row(self._session_id(key), blob, self._header_cache, remember)
        ids = self._id_cache
        if remember and key not in ids:
            if len(ids) >= HEADER_CACHE_MAX:
                ids.clear()
            ids[key] = header.id
            parent = header.parent_session
            if parent is not None:
                # Parents are stored (and scanned) before their children: share the
                # parent header's id object instead of keeping an equal copy alive.
                shared = ids.get(parent.to_bytes())
                if shared is not None and shared is not parent:
                    object.__setattr__(header, "parent_session", shared)
        return header

    def list_headers(self, parent_session: SessionId | str | None) -> list[SessionHeader]:
        if parent_session is None:
            return self._headers("WHERE parent IS NULL", ())
        parent = check_session_id(parent_session)
        return self._headers("WHERE parent = ?", (parent.to_bytes(),))

    def all_headers(self) -> list[SessionHeader]:
        return self._headers("", ())

    def sole_root(self) -> SessionId | None:
        """The id of the store's only top-level session (stored with no parent), or
        None when there are none or several: that root's tree is every session the
        store holds (but damaged ones), so a listing of it reads one scan rather than
        level after level."""
        rows = self._query("SELECT id FROM sessions WHERE parent IS NULL LIMIT 2", ())
        if len(rows) != 1:
            return None
        key = raw_key(rows[0][0])
        return None if isinstance(key, StoredKey) else self._session_id(key)

    def scan_headers(self) -> list[SessionHeader | CorruptRecordError]:
        rows = self._query(
            "SELECT created_at, id, parent, header FROM sessions ORDER BY created_at, id", ()
        )
        return self._scanned(rows)

    def _scanned(
        self, rows: Iterable[Any], remember: bool = True
    ) -> list[SessionHeader | CorruptRecordError]:
        """Decoded ``(created_at, id, parent, header, ...)`` rows; a broken one as its
        error, in place."""
        out: list[SessionHeader | CorruptRecordError] = []
        known, ids = self._header_cache, self._id_cache
        for row in rows:
            key, parent, blob = row[1], row[2], row[3]
            # Warm (a big listing read again): the remembered header of these very
            # bytes, whose id is the very object remembered for this key.
            header = known.get(blob) if type(blob) is bytes else None
            if header is not None and type(key) is bytes and header.id is ids.get(key):
                out.append(header)
                continue
            try:
                out.append(self._decode_row(key, blob, remember))
            except CorruptRecordError as exc:
                # The indexed parent column still says where the broken row belongs
                # (as hex; a parent that is no id itself, as its StoredKey).
                if parent is not None:
                    parent = raw_key(parent)
                    if not isinstance(parent, StoredKey):
                        parent = parent.hex()
                exc.hint["parent_session"] = parent
                out.append(exc)
        return out

    def scan_children(
        self, parents: Sequence[SessionId | str]
    ) -> list[SessionHeader | CorruptRecordError]:
        return self._scanned_children(self._child_rows(parents))

    def scan_children_with(
        self, parents: Sequence[SessionId | str], unit: str
    ) -> tuple[
        list[SessionHeader | CorruptRecordError], dict[SessionId, tuple[int, bytes]], set[SessionId]
    ]:
        """:meth:`scan_children` of ``parents``, with what a tree listing asks of each
        level, in one read: the cached ``(seq, data)`` of ``unit`` for each decodable
        child that has one (:meth:`get_projections_of`), and the decodable children
        that have a stored child of their own (the next level's parents: the leaves,
        most of a big tree, are never read again to find they have none).

        Each parent's children come in ``(created_at, id)`` order, parents one after
        another (not interleaved, as :meth:`scan_children` gives them): the catalog
        links children per parent, and the index gives them so with no sort.
        """
        # One statement a chunk: the identity rows joined to the header rows (a
        # listing of a 10,000-session tree made 20 more reads, and an id -> bytes
        # conversion a session, to fetch them apart).
        name = unit_name(unit)
        rows = self._child_rows(
            parents,
            ", c.seq, c.data, EXISTS (SELECT 1 FROM sessions k WHERE k.parent = s.id)",
            " LEFT JOIN projection_cache c ON c.session = s.id AND c.unit = ?",
            name,
            by_parent=True,
        )
        found = self._scanned_children(rows)
        cached: dict[SessionId, tuple[int, bytes]] = {}
        branching: set[SessionId] = set()
        # One decoded item per row, in place: a broken one (its error) brings neither,
        # as the default reads rows of decodable children only.
        for item, row in zip(found, rows):
            if type(item) is SessionHeader:
                if row[4] is not None and _cached(row[4], row[5]):
                    cached[item.id] = (row[4], bytes(row[5]))
                if row[6]:
                    branching.add(item.id)
        return found, cached, branching

    def _child_rows(
        self,
        parents: Sequence[SessionId | str],
        columns: str = "",
        join: str = "",
        *params: Any,
        by_parent: bool = False,
    ) -> list[Any]:
        """``(created_at, id, parent, header, *columns)`` of the children of ``parents``,
        ordered by ``(created_at, id)`` (``by_parent``: by parent first); ``join``
        (with ``params``) joins another table."""
        keys = sorted(p.to_bytes() for p in check_session_ids(parents))
        # By parent, the parent index's own order: no sort, and chunks of sorted keys
        # concatenate in order.
        order = "s.parent, s.created_at, s.id" if by_parent else "s.created_at, s.id"
        rows = self._query_in(
            f"SELECT s.created_at, s.id, s.parent, s.header{columns} FROM sessions s{join}"
            f" WHERE s.parent IN ({{}}) ORDER BY {order}",
            keys,
            *params,
        )
        if len(keys) > _IN_CHUNK and not by_parent:
            # Chunks merged: (created_at, id), kinds ordered as SQLite orders them,
            # so a damaged cell sorts instead of failing the whole listing.
            rows.sort(key=lambda r: (_stored_order(r[0]), _stored_order(r[1])))
        return rows

    def _scanned_children(self, rows: list[Any]) -> list[SessionHeader | CorruptRecordError]:
        # A few children (a server listing one family per request) are decoded, not
        # cached: caching every family a server ever listed grows it for ever.
        remember = len(rows) >= _REMEMBER_FROM
        return self._scanned(rows, remember)

    def get_checkpoint(self, session_id: SessionId | str) -> tuple[int, bytes] | None:
        sid = check_session_id(session_id)
        rows = self._query("SELECT seq, data FROM checkpoints WHERE session = ?", (sid.to_bytes(),))
        if not rows:
            return None
        return integer(rows[0][0], sid, "checkpoint seq"), blob(rows[0][1], sid, "checkpoint")

    # -- writes ---------------------------------------------------------------

    def get_projection(self, session_id: SessionId | str, unit: str) -> tuple[int, bytes] | None:
        sid = check_session_id(session_id)
        rows = self._query(
            "SELECT seq, data FROM projection_cache WHERE session = ? AND unit = ?",
            (sid.to_bytes(), unit_name(unit)),
        )
        # Derived data: a row of the wrong kinds is as good as none.
        return (rows[0][0], bytes(rows[0][1])) if rows and _cached(*rows[0]) else None

    def get_projections(self, unit: str) -> dict[SessionId, tuple[int, bytes]]:
        rows = self._query(
            "SELECT session, seq, data FROM projection_cache WHERE unit = ?", (unit_name(unit),)
        )
        return self._projection_rows(rows)

    def _projection_rows(self, rows: Iterable[Any]) -> dict[SessionId, tuple[int, bytes]]:
        """``(session, seq, data)`` rows by session id (shared id objects); a row
        whose key is no id is skipped (derived data, and no listing could ask)."""
        ids = self._session_id
        out: dict[SessionId, tuple[int, bytes]] = {}
        for k, q, d in rows:
            key = k if type(k) is bytes and len(k) == 16 else raw_key(k)
            if not isinstance(key, StoredKey) and _cached(q, d):
                out[ids(key)] = (q, bytes(d))
        return out

    def get_projections_of(
        self, unit: str, sessions: Iterable[SessionId | str]
    ) -> dict[SessionId, tuple[int, bytes]]:
        name = unit_name(unit)
        keys = [s.to_bytes() for s in check_session_ids(sessions)]
        rows = self._query_in(
            "SELECT session, seq, data FROM projection_cache WHERE unit = ? AND session IN ({})",
            keys,
            name,
        )
        return self._projection_rows(rows)

    def _each_session(
        self,
        session_ids: Iterable[SessionId | str],
        columns: str,
        table: str,
        order: str,
        only: str = "",
    ) -> Iterator[tuple[SessionId, Iterator[Any]]]:
        """``columns`` of ``table``'s rows (aliased ``t``; ``only``: a condition on
        them) of each given stored session, a session at a time, each run ordered by
        ``order``: ``(session id, rows)``, a row being ``(key, *columns)``; a
        session with no such row has one row of NULLs. Chunks of sessions per
        statement; unknown ids are absent."""
        keys = [s.to_bytes() for s in check_session_ids(session_ids)]
        rows = self._query_in(
            f"SELECT s.id, {columns} FROM sessions AS s"
            f" LEFT JOIN {table} AS t ON t.session = s.id{only and ' AND ' + only}"
            f" WHERE s.id IN ({{}}) ORDER BY s.id, {order}",
            keys,
        )
        for key, group in itertools.groupby(rows, key=operator.itemgetter(0)):
            yield self._session_id(bytes(key)), group

    def _query_in(self, sql: str, keys: list[bytes], *params: Any) -> list[Any]:
        """Rows of ``sql`` (whose ``{}`` is an ``IN`` list, after ``params``) for every
        key, in chunks under SQLite's bound-variable limit."""
        rows: list[Any] = []
        for i in range(0, len(keys), _IN_CHUNK):
            chunk = keys[i : i + _IN_CHUNK]
            rows += self._query(sql.format(",".join("?" * len(chunk))), (*params, *chunk))
        return rows


def _cached(seq: Any, data: Any) -> bool:
    """Whether a projection-cache row holds what the store wrote (an int, bytes)."""
    return type(seq) is int and isinstance(data, (bytes, bytearray, memoryview))


def _stored_order(value: Any) -> tuple[int, Any]:
    """A sort key of a stored cell of any kind, in SQLite's order of kinds: NULL,
    numbers, text, blobs."""
    if value is None:
        return (0, 0)
    if isinstance(value, (int, float)):
        return (1, value)
    if isinstance(value, str):
        return (2, value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return (3, bytes(value))
    return (4, repr(value))
