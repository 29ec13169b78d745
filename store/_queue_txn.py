"""The inbox and lease operations of a write transaction (see :mod:`._durable`).

Mixed into :class:`~._writer.Txn`: each runs inside the batch's ``BEGIN
IMMEDIATE`` transaction, checks before it writes (a failed check writes nothing
and fails only its own request), and a lease token fences the write by reading
the session's lease row in the same transaction.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Protocol

from subagents.protocol import DEFAULT_LIMITS, Limits, SessionId

from ._cells import integer, real, stored_session_id, text_or_none
from ._durable import (
    HOLDER_RETENTION,
    Accepted,
    Lease,
    LeaseToken,
    Release,
    inbox_full,
    lease_held,
    lease_lost,
    takes_place,
)
from ._presence import presence_ended

__all__ = ["ANSWERED", "EXPIRY", "INBOX_KEY", "LEASE", "AcceptOp", "QueueTxn", "SqlConn"]

#: A lease's expiry: the later of its own (set when taken) and its holder's heartbeat
#: (``holders``, written by every renewal), for ``leases l LEFT JOIN holders h``.
EXPIRY: Final = "CASE WHEN h.expires > l.expires THEN h.expires ELSE l.expires END"
#: One session's lease, its expiry as above.
LEASE: Final = (
    f"SELECT l.holder, l.epoch, {EXPIRY}, l.wake FROM leases l"
    " LEFT JOIN holders h ON h.holder = l.holder WHERE l.session = ?"
)
#: :data:`LEASE` for many sessions (``{}``: the ``IN`` list), each row led by its session.
LEASES: Final = (
    f"SELECT l.session, l.holder, l.epoch, {EXPIRY}, l.wake FROM leases l"
    " LEFT JOIN holders h ON h.holder = l.holder WHERE l.session IN ({})"
)
# Never backwards: a renewal committed late (its batch waited on a lock) must not
# shorten the heartbeat a later renewal already wrote.
_HEARTBEAT: Final = (
    "INSERT INTO holders (holder, expires) VALUES (?, ?)"
    " ON CONFLICT (holder) DO UPDATE SET expires ="
    " CASE WHEN excluded.expires > holders.expires THEN excluded.expires ELSE holders.expires END"
)
_UPSERT_LEASE: Final = (
    "INSERT INTO leases (session, holder, epoch, expires, wake) VALUES (?, ?, ?, ?, ?)"
    " ON CONFLICT (session) DO UPDATE SET holder = excluded.holder, epoch = excluded.epoch,"
    " expires = excluded.expires, wake = excluded.wake"
)
# A repeated message id is not an error (dedup): only that conflict is ignored, so a
# stale ``n`` still fails the statement (and the batch is retried uncached).
_INSERT_ENTRY: Final = (
    "INSERT INTO inbox (session, n, message_id, body, epoch, accepted_at) VALUES (?, ?, ?, ?, ?, ?)"
    " ON CONFLICT (session, message_id) DO NOTHING"
)

_KNOWN: Final = "SELECT n FROM inbox WHERE session = ? AND message_id = ?"
_LATER: Final = "SELECT epoch FROM leases WHERE session = ? AND epoch > ?"

# A duplicate acceptance answered for the entry: its time moves on (by a microsecond,
# nothing reads it finer), so the first acceptor's retraction no longer matches it.
ANSWERED: Final = (
    "UPDATE inbox SET accepted_at = accepted_at + 0.000001"
    " WHERE session = ? AND message_id = ? AND done = 0"
)

#: Prefix of an inbox's last-``n`` key in the writer's cache (a session key is 16 bytes).
_N: Final = b"n"
#: The prefix of a session's inbox place in the next-seq cache.
INBOX_KEY: Final = _N

#: ``(message id bytes, encoded event)`` of one message to accept.
Message = tuple[bytes, bytes]


@dataclass(slots=True, eq=False)
class AcceptOp:
    """A queued acceptance: ``txn.accept_messages`` of one caller's messages (an object,
    not a closure: a run of them for one session and lease is one statement, see
    :meth:`QueueTxn.accept_many`)."""

    session_id: SessionId
    rows: Sequence[Message]
    epoch: int | None
    at: float
    token: LeaseToken | None
    limit: int | None = None
    limits: Limits = DEFAULT_LIMITS  # the store's decoding bounds: what a bound counts

    def __call__(self, txn: QueueTxn) -> list[Accepted]:
        args = (self.session_id, self.rows, self.epoch, self.at, self.token, self.limit)
        return txn.accept_messages(*args, self.limits)

    def joins(self, other: AcceptOp) -> bool:
        """Whether ``other`` may be written in one statement with this one (a bounded
        acceptance is checked on its own)."""
        alone = self.limit is not None or other.limit is not None
        return not alone and (self.session_id, self.epoch, self.token) == (
            other.session_id, other.epoch, other.token
        )  # fmt: skip


def _accepted(placed: list[int | Accepted], at: float, run: tuple[int, int]) -> list[Accepted]:
    """The outcomes of ``placed`` (:meth:`QueueTxn._place`), the new ones of ``run``."""
    return [Accepted(p, False, at, run) if isinstance(p, int) else p for p in placed]


_PENDING_ROWS: Final = "SELECT n, body, epoch FROM inbox WHERE session = ? AND done = 0"


class SqlConn(Protocol):
    """What a transaction needs of its connection (``sqlite3.Connection``, or the
    PostgreSQL store's wrapper): statements with ``?`` placeholders, returning a
    cursor with ``fetchone``, ``fetchall`` and ``rowcount``."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Any: ...
    def executemany(self, sql: str, parameters: Any, /) -> Any: ...


class QueueTxn:
    """Inbox and lease operations; ``conn`` and ``_next_seq`` come from ``Txn``.

    ``FENCE`` is the statement that reads a lease to fence a write (the PostgreSQL
    transaction adds ``FOR SHARE``, so no acquisition commits between the check and
    the write).
    """

    FENCE: ClassVar[str] = "SELECT holder, epoch FROM leases WHERE session = ?"
    conn: SqlConn
    _fenced: dict[bytes, LeaseToken]
    _cache: dict[bytes, int]
    overlay: dict[bytes, int | None]
    released: list[bytes]

    def _next_seq(self, key: bytes, session_id: SessionId) -> int:
        raise NotImplementedError

    def _last_n(self, key: bytes) -> int:
        """The session's highest inbox ``n`` (0 for none), cached like next seqs."""
        nkey = _N + key
        last = self.overlay.get(nkey, self._cache.get(nkey))
        if last is None:
            found = self.conn.execute("SELECT max(n) FROM inbox WHERE session = ?", (key,))
            last = found.fetchone()[0] or 0
        return last

    def _accepting(self, key: bytes, session_id: SessionId, token: LeaseToken | None) -> int:
        """Before an acceptance: ``SESSION_NOT_FOUND`` for an unknown session, the fence
        of ``token``; returns the inbox's last ``n``."""
        self._next_seq(key, session_id)
        self.fence(session_id, token)
        return self._last_n(key)

    def fence(self, session_id: SessionId, token: LeaseToken | None) -> None:
        """``LEASE_LOST`` unless the session's lease is exactly ``token``.

        Read once per session and token in a transaction (a batch of one holder's
        acceptances checks its lease once): only this transaction can change the
        row meanwhile, and every op that does forgets the check (:meth:`_moved`).
        The SQLite writer keeps the checks across its transactions for as long as
        no other connection commits (``data_version``), so a holder's steady
        stream of acceptances reads its lease once.
        """
        if token is None:
            return
        key = session_id.to_bytes()
        if self._fenced.get(key) == token:
            return
        row = self.conn.execute(self.FENCE, (key,)).fetchone()
        if row is None or row[0] != token[0] or row[1] != token[1]:
            raise lease_lost(session_id, token)
        self._fenced[key] = token

    def _moved(self, key: bytes) -> None:
        """The session's lease row changed in this transaction: fence it again."""
        self._fenced.pop(key, None)

    def accept_messages(
        self,
        session_id: SessionId,
        messages: Sequence[Message],
        epoch: int | None,
        at: float,
        token: LeaseToken | None,
        limit: int | None = None,
        limits: Limits = DEFAULT_LIMITS,
    ) -> list[Accepted]:
        key = session_id.to_bytes()
        n = self._accepting(key, session_id, token)
        if limit is not None:
            self._check_room(session_id, key, messages, limit, limits)
        first = n + 1
        placed, n = self._place(key, messages, n, epoch, at)
        self.overlay[_N + key] = n
        return _accepted(placed, at, (first, n))

    def _place(
        self, key: bytes, rows: Sequence[Message], n: int, epoch: int | None, at: float
    ) -> tuple[list[int | Accepted], int]:
        """Insert ``rows`` one by one past place ``n``: each new entry's place (or a
        duplicate's outcome), and the last place taken."""
        placed: list[int | Accepted] = []
        for mid, body in rows:
            if self.conn.execute(_INSERT_ENTRY, (key, n + 1, mid, body, epoch, at)).rowcount:
                n += 1
                placed.append(n)
            else:
                placed.append(self._duplicate(key, mid))
        return placed, n

    def _duplicate(self, key: bytes, mid: bytes) -> Accepted:
        """An id accepted before: its place, and the entry answered for."""
        conn = self.conn
        known = conn.execute(_KNOWN, (key, mid)).fetchone()
        conn.execute(ANSWERED, (key, mid))
        return Accepted(int(known[0]), True)

    def _check_room(
        self,
        session_id: SessionId,
        key: bytes,
        messages: Sequence[Message],
        limit: int,
        limits: Limits,
    ) -> None:
        """``INBOX_FULL`` unless the pending messages and the new ones fit ``limit``:
        those ``pending()`` lists (decoded with ``limits``), quiet reports aside.

        Read after :meth:`_accepting` (on PostgreSQL: under the session's row lock,
        which every acceptance takes first), so it holds until the insert commits.
        """
        conn = self.conn
        pending = conn.execute(
            "SELECT count(*) FROM inbox WHERE session = ? AND done = 0", (key,)
        ).fetchone()[0]
        new: set[bytes] = set()
        for mid, _body in messages:
            if mid not in new and not conn.execute(_KNOWN, (key, mid)).fetchone():
                new.add(mid)
        if new and int(pending) + len(new) > limit:
            # Read only when it would be refused: neither quiet reports nor rows that
            # do not decode (skipped, never done) take a place.
            rows = conn.execute(_PENDING_ROWS, (key,)).fetchall()
            pending = sum(1 for n, body, epoch in rows if takes_place(n, body, epoch, limits))
            if pending + len(new) > limit:
                raise inbox_full(session_id, limit, pending)

    def accept_many(self, ops: Sequence[AcceptOp]) -> list[list[Accepted]]:
        """Several acceptances for one session, epoch and lease (``AcceptOp.joins``)
        in one insert: each op's result as ``accept_messages`` would give it."""
        first = ops[0]
        session_id = first.session_id
        key = session_id.to_bytes()
        last = self._accepting(key, session_id, first.token)
        epoch = first.epoch
        params: list[tuple[object, ...]] = []
        for op in ops:
            at = op.at
            for mid, body in op.rows:
                params.append((key, last + len(params) + 1, mid, body, epoch, at))
        inserted = self.conn.executemany(_INSERT_ENTRY, params).rowcount
        out: list[list[Accepted]] = []
        if inserted == len(params):
            n = last
            run = (last + 1, last + len(params))
            for op in ops:
                out.append([Accepted(n + i, False, op.at, run) for i in range(1, len(op.rows) + 1)])
                n += len(op.rows)
            self.overlay[_N + key] = n
            return out
        # Some ids were accepted before (or twice in this batch): the rows went in
        # at their positions, leaving a place empty for each one left out. Take them
        # out again (every row past ``last`` is this statement's) and place the rows
        # one by one, as accept_messages does, so the places stay gapless.
        self.conn.execute("DELETE FROM inbox WHERE session = ? AND n > ?", (key, last))
        n = last
        placements = []
        for op in ops:
            placed, n = self._place(key, op.rows, n, epoch, op.at)
            placements.append((placed, op.at))
        self.overlay[_N + key] = n
        return [_accepted(placed, at, (last + 1, n)) for placed, at in placements]

    def complete(
        self, session_id: SessionId, message_ids: Sequence[bytes], token: LeaseToken | None
    ) -> None:
        self.fence(session_id, token)
        key = session_id.to_bytes()
        self.conn.executemany(
            "UPDATE inbox SET done = 1 WHERE session = ? AND message_id = ?",
            [(key, mid) for mid in message_ids],
        )

    def retract(
        self,
        session_id: SessionId,
        message_id: bytes,
        epoch: int | None,
        accepted_at: float | None = None,
    ) -> bool:
        key = session_id.to_bytes()
        if epoch is not None and self.conn.execute(_LATER, (key, epoch)).fetchone():
            return False  # a later activation replays it: it stays (DurableQueues.retract)
        sql = "DELETE FROM inbox WHERE session = ? AND message_id = ? AND done = 0"
        sql += " AND (epoch IS NULL OR epoch = ?)"
        params: tuple[object, ...] = (key, message_id, epoch)
        if accepted_at is not None:  # only the caller's own, not answered for since
            sql += " AND accepted_at = ?"
            params += (accepted_at,)
        cursor = self.conn.execute(sql, params)
        return bool(cursor.rowcount > 0)

    def hand_over(
        self,
        session_id: SessionId,
        message_ids: Sequence[bytes],
        epoch: int,
        token: LeaseToken | None,
    ) -> list[bool]:
        self.fence(session_id, token)
        key = session_id.to_bytes()
        return [
            self.conn.execute(
                "UPDATE inbox SET epoch = ?"
                " WHERE session = ? AND message_id = ? AND epoch IS NULL AND done = 0",
                (epoch, key, mid),
            ).rowcount
            > 0
            for mid in message_ids
        ]

    def give_back(self, session_id: SessionId, message_ids: Sequence[bytes], epoch: int) -> int:
        key = session_id.to_bytes()
        later = self.conn.execute(_LATER, (key, epoch)).fetchone()  # see DurableQueues.give_back
        to = later[0] if later is not None and type(later[0]) is int else None
        sql = "UPDATE inbox SET epoch = ? WHERE session = ? AND message_id = ? AND epoch = ?"
        sql += " AND done = 0"
        given = sum(self.conn.execute(sql, (to, key, m, epoch)).rowcount for m in message_ids)
        return 0 if to is not None else given

    def prune(self, before: float) -> int:
        cursor = self.conn.execute(
            "DELETE FROM inbox WHERE done = 1 AND accepted_at < ?", (before,)
        )
        return int(cursor.rowcount)

    # -- leases --------------------------------------------------------------------

    def new_lease(
        self, session_id: SessionId, holder: str, expires: float, wake: str | None
    ) -> None:
        """The first lease of a session being created (epoch 1)."""
        key = session_id.to_bytes()
        self._moved(key)
        self.conn.execute(_UPSERT_LEASE, (key, holder, 1, expires, wake))

    def acquire(
        self,
        session_id: SessionId,
        holder: str,
        now: float,
        expires: float,
        wake: str | None,
        dead: Callable[[str], bool] | None,
    ) -> Lease:
        key = session_id.to_bytes()
        self._next_seq(key, session_id)  # SESSION_NOT_FOUND for an unknown session
        row = self.conn.execute(LEASE, (key,)).fetchone()
        epoch = 0
        if row is not None:
            current = text_or_none(row[0], session_id, "lease holder")
            epoch = integer(row[1], session_id, "lease epoch")
            until = real(row[2], session_id, "lease expiry")
            their_wake = text_or_none(row[3], session_id, "lease wake address")
            if (
                current is not None
                and current != holder
                and until > now
                and not (dead is not None and (dead(current) or presence_ended(their_wake)))
            ):
                raise lease_held(Lease(session_id, current, epoch, until, their_wake))
        lease = Lease(session_id, holder, epoch + 1, expires, wake)
        self._moved(key)
        self.conn.execute(_UPSERT_LEASE, (key, holder, lease.epoch, expires, wake))
        return lease

    def heartbeat(self, holder: str, expires: float) -> None:
        """A renewal: ``holder``'s heartbeat now runs until ``expires``, which keeps
        every lease it has live until then; no lease row is written."""
        conn = self.conn
        conn.execute(_HEARTBEAT, (holder, expires))
        conn.execute("DELETE FROM holders WHERE expires < ?", (expires - HOLDER_RETENTION,))

    def renew(self, holder: str, expires: float) -> list[SessionId]:
        self.heartbeat(holder, expires)
        rows = self.conn.execute("SELECT session FROM leases WHERE holder = ?", (holder,))
        return [sid for r in rows.fetchall() if (sid := stored_session_id(r[0])) is not None]

    def renew_count(self, holder: str, expires: float) -> int:
        self.heartbeat(holder, expires)
        found = self.conn.execute("SELECT count(*) FROM leases WHERE holder = ?", (holder,))
        return int(found.fetchone()[0])

    def release(
        self, session_id: SessionId, token: LeaseToken, unrun: Sequence[bytes] = ()
    ) -> Release:
        key = session_id.to_bytes()
        self._moved(key)
        cursor = self.conn.execute(
            "UPDATE leases SET holder = NULL, expires = 0, wake = NULL"
            " WHERE session = ? AND holder = ? AND epoch = ?",
            (key, token[0], token[1]),
        )
        if cursor.rowcount == 0:
            return Release.NOT_HELD
        # Another process may write it from now on: its cached next seq and inbox
        # place are stale, and a server that released a session keeps no memory of it.
        self.released.append(key)
        if unrun:
            self.give_back(session_id, unrun, token[1])
        waiting = self.conn.execute(
            "SELECT EXISTS (SELECT 1 FROM inbox WHERE session = ? AND done = 0 AND epoch IS NULL)",
            (key,),
        ).fetchone()[0]
        return Release.WAITING if waiting else Release.RELEASED
