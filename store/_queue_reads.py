"""The inbox and lease reads of the SQL stores (see :mod:`._durable`).

Their writes are in :mod:`._committed`; these reads use the store's ``_query``,
in SQL both dialects run (see :mod:`._reads`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, Final

from subagents.protocol import (
    CorruptRecordError,
    DecodeError,
    Limits,
    MessageId,
    SessionId,
)

from ._base import not_found
from ._cells import inbox_event, integer, real, stored_session_id, text_or_none
from ._durable import DurableQueues, InboxEntry, Lease
from ._promises import OWED_SESSIONS
from ._queue_txn import EXPIRY, LEASE, LEASES
from ._validate import (
    check_int,
    check_message_ids,
    check_seconds,
    check_session_id,
    check_session_ids,
    invalid,
)

__all__ = ["WORK_LEASES", "SqlQueueReads"]

#: ``(session, holder, wake)`` of accepted work -- messages not done, or promises
#: open (:mod:`._promises`) -- joined to its session's lease ``l`` and the holder's
#: heartbeat ``h`` (for ``EXPIRY``): what the sweep's questions about holders
#: narrow with a ``WHERE``.
WORK_LEASES: Final = (
    "SELECT DISTINCT w.session, l.holder, l.wake FROM (SELECT session FROM inbox"
    " WHERE done = 0 UNION SELECT p.session FROM promises p"
    " JOIN sessions s ON s.id = p.session) w JOIN leases l ON l.session = w.session"
    " LEFT JOIN holders h ON h.holder = l.holder"
)


class SqlQueueReads(DurableQueues):
    """Mixed into the SQL stores (which provide the members below)."""

    _committer: Any
    _limits: Limits

    #: Rows of a table a session at a time (:meth:`SqlReads._each_session`).
    _each_session: Callable[..., Iterator[tuple[SessionId, Iterator[Any]]]]

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        raise NotImplementedError

    def _query_in(self, sql: str, keys: list[bytes], *params: Any) -> list[Any]:
        raise NotImplementedError  # (SqlReads: chunked under the bound-variable limit)

    def exists(self, session_id: SessionId | str) -> bool:
        raise NotImplementedError

    # -- the inbox -----------------------------------------------------------------

    def pending(
        self, session_id: SessionId | str, *, damaged: list[int] | None = None
    ) -> list[InboxEntry]:
        return self._inbox(check_session_id(session_id), "", (), damaged)

    def untaken(
        self, session_id: SessionId | str, after: int = 0, *, damaged: list[int] | None = None
    ) -> list[InboxEntry]:
        sid = check_session_id(session_id)
        at = check_int(after, "after")
        return self._inbox(sid, " AND epoch IS NULL AND n > ?2", (at,), damaged)

    def _inbox(
        self, sid: SessionId, narrower: str, params: tuple[Any, ...], damaged: list[int] | None
    ) -> list[InboxEntry]:
        """The session's pending entries (``narrower``: more of the join's condition,
        its parameters from ``?2``), in order; ``SESSION_NOT_FOUND`` for no session."""
        rows = self._query(
            "SELECT EXISTS (SELECT 1 FROM sessions WHERE id = ?1), n, body, epoch"
            " FROM (SELECT 1) AS one LEFT JOIN inbox ON session = ?1 AND done = 0"
            f"{narrower} ORDER BY n",
            (sid.to_bytes(), *params),
        )
        if not rows or not rows[0][0]:
            raise not_found(sid)
        entries: list[InboxEntry] = []
        for _exists, n, body, epoch in rows:
            if n is not None:
                self._entry(sid, entries, n, body, epoch, damaged)
        return entries

    def pending_many(
        self,
        session_ids: Iterable[SessionId | str],
        *,
        damaged: dict[SessionId, list[int]] | None = None,
    ) -> dict[SessionId, list[InboxEntry]]:
        found: dict[SessionId, list[InboxEntry]] = {}
        runs = self._each_session(session_ids, "t.n, t.body, t.epoch", "inbox", "t.n", "t.done = 0")
        for sid, group in runs:
            entries: list[InboxEntry] = []
            found[sid] = entries
            places: list[int] | None = None if damaged is None else []
            for _key, n, body, epoch in group:
                if n is not None:  # None: a session with an empty inbox
                    self._entry(sid, entries, n, body, epoch, places)
            if damaged is not None and places:  # only a session with damage gets a list
                damaged[sid] = places
        return found

    def _entry(
        self,
        sid: SessionId,
        entries: list[InboxEntry],
        n: Any,
        body: Any,
        epoch: Any,
        damaged: list[int] | None,
    ) -> None:
        """Decode one inbox row onto ``entries``; a bad one raises, or is named in
        ``damaged`` and skipped."""
        try:
            event = inbox_event(n, body, epoch, self._limits)
        except DecodeError as exc:
            if damaged is None:
                raise _corrupt_entry(sid, n, exc) from exc
            damaged.append(n if type(n) is int else -1)
            return
        entries.append(InboxEntry(n, event, epoch))

    def orphans(self, now: float) -> list[SessionId]:
        at = check_seconds(now, "now")
        rows = self._query(
            "SELECT DISTINCT i.session FROM inbox i LEFT JOIN leases l ON l.session = i.session"
            " LEFT JOIN holders h ON h.holder = l.holder"
            f" WHERE i.done = 0 AND (l.session IS NULL OR l.holder IS NULL OR {EXPIRY} <= ?)"
            f" UNION {OWED_SESSIONS.format(expiry=EXPIRY)}",  # owed a message: see ._promises
            (at, at),
        )
        return _sessions(rows)

    def leased_work(self, prefix: str, now: float) -> list[tuple[SessionId, str]]:
        at = check_seconds(now, "now")
        if type(prefix) is not str:
            raise invalid("prefix must be a str")
        # LIKE narrows the rows (a host name's ``_`` is its own character, escaped).
        like = prefix.replace("!", "!!").replace("%", "!%").replace("_", "!_") + "%"
        rows = self._query(
            f"{WORK_LEASES} WHERE l.holder LIKE ? ESCAPE '!' AND {EXPIRY} > ?",
            (like, at),
        )
        # (SQLite's LIKE ignores ASCII case: the prefix is checked as written here.)
        return [
            (sid, r[1])
            for r in rows
            if (sid := stored_session_id(r[0])) is not None
            and type(r[1]) is str
            and r[1].startswith(prefix)
        ]

    def owed(self, session_id: SessionId | str) -> list[MessageId]:
        sid = check_session_id(session_id)
        rows = self._query("SELECT message_id FROM promises WHERE session = ?", (sid.to_bytes(),))
        return [MessageId.from_bytes(bytes(r[0])) for r in rows]

    def waiting(self, holder: str) -> list[SessionId]:
        if type(holder) is not str:
            raise invalid("holder must be a str")
        rows = self._query(
            "SELECT DISTINCT l.session FROM leases l JOIN inbox i ON i.session = l.session"
            " WHERE l.holder = ? AND i.done = 0 AND i.epoch IS NULL",
            (holder,),
        )
        return _sessions(rows)

    def find_accepted(self, message_id: MessageId) -> list[tuple[SessionId, int]]:
        (mid,) = check_message_ids([message_id])
        rows = self._query("SELECT session, n FROM inbox WHERE message_id = ?", (mid.to_bytes(),))
        return [
            (sid, n)
            for key, n in rows
            if (sid := stored_session_id(key)) is not None and type(n) is int
        ]

    # -- leases --------------------------------------------------------------------

    def get_lease(self, session_id: SessionId | str) -> Lease | None:
        sid = check_session_id(session_id)
        rows = self._query(LEASE, (sid.to_bytes(),))
        return _lease(sid, *rows[0]) if rows else None

    def get_leases(self, session_ids: Iterable[SessionId | str]) -> dict[SessionId, Lease]:
        keys = [sid.to_bytes() for sid in check_session_ids(session_ids)]
        found: dict[SessionId, Lease] = {}
        for key, *row in self._query_in(LEASES, keys):
            sid = SessionId.from_bytes(bytes(key))
            found[sid] = _lease(sid, *row)
        return found


def _sessions(rows: Iterable[Any]) -> list[SessionId]:
    """The session keys of ``rows`` (first column), a damaged one left out."""
    return [sid for r in rows if (sid := stored_session_id(r[0])) is not None]


def _lease(sid: SessionId, holder: Any, epoch: Any, expires: Any, wake: Any) -> Lease:
    """A lease row's cells, each checked (a damaged cell: ``CORRUPT_RECORD``)."""
    return Lease(
        sid,
        text_or_none(holder, sid, "lease holder"),
        integer(epoch, sid, "lease epoch"),
        real(expires, sid, "lease expiry"),
        text_or_none(wake, sid, "lease wake address"),
    )


def _corrupt_entry(session_id: SessionId, n: int, exc: DecodeError) -> CorruptRecordError:
    err = CorruptRecordError(
        f"session {session_id} inbox entry {n} does not decode: {exc}",
        session_id=session_id,
        seq=-1,
    )
    err.__cause__ = exc
    return err
