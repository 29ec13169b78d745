"""The inbox and lease half of ``SqliteStore`` (see :mod:`._durable`).

Writes go through the store's group committer like every other write (so many
concurrent accepts share one transaction and one fsync); reads use its pooled
read connections.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from subagents.protocol import (
    CorruptRecordError,
    DecodeError,
    Event,
    Limits,
    MessageEvent,
    MessageId,
    ReportEvent,
    SessionId,
    decode_event,
    encode_event,
)

from ._base import not_found
from ._durable import Accepted, DurableQueues, InboxEntry, Lease, LeaseToken, Release
from ._queue_txn import AcceptOp, Message
from ._validate import (
    check_acquire,
    check_message_ids,
    check_messages,
    check_seconds,
    check_session_id,
    check_token,
    invalid,
)

__all__ = ["SqliteQueues", "encode_messages"]


def encode_messages(events: Sequence[Event]) -> list[Message]:
    """Checked inbox events as ``(message id bytes, body)`` rows."""
    return [(e.message_id.to_bytes(), encode_event(e)) for e in check_messages(events)]


class SqliteQueues(DurableQueues):
    """Mixed into :class:`~._sqlite.SqliteStore` (which provides the members below)."""

    _committer: Any
    _limits: Limits

    def _query(self, sql: str, params: tuple[Any, ...]) -> list[Any]:
        raise NotImplementedError

    def exists(self, session_id: SessionId | str) -> bool:
        raise NotImplementedError

    # -- the inbox -----------------------------------------------------------------

    def accept(
        self,
        session_id: SessionId | str,
        events: Sequence[Event],
        *,
        epoch: int | None = None,
        now: float = 0.0,
        lease: LeaseToken | None = None,
    ) -> list[Accepted]:
        sid = check_session_id(session_id)
        rows = encode_messages(events)
        at = check_seconds(now, "now")
        token = check_token(lease)
        if epoch is not None and type(epoch) is not int:
            raise invalid("epoch must be an int or None")
        if not rows:
            if not self.exists(sid):
                raise not_found(sid)
            return []
        out: list[Accepted] = self._committer.submit(AcceptOp(sid, rows, epoch, at, token))
        return out

    def pending(self, session_id: SessionId | str) -> list[InboxEntry]:
        sid = check_session_id(session_id)
        rows = self._query(
            "SELECT EXISTS (SELECT 1 FROM sessions WHERE id = ?1), n, body, epoch"
            " FROM (SELECT 1) LEFT JOIN inbox ON session = ?1 AND done = 0 ORDER BY n",
            (sid.to_bytes(),),
        )
        if not rows or not rows[0][0]:
            raise not_found(sid)
        entries = []
        for _exists, n, body, epoch in rows:
            if n is None:
                continue
            try:
                event = decode_event(bytes(body), limits=self._limits)
            except DecodeError as exc:
                raise _corrupt_entry(sid, n, exc) from exc
            if not isinstance(event, (MessageEvent, ReportEvent)):
                raise _corrupt_entry(sid, n, DecodeError(f"not a message: {event.type!r}"))
            entries.append(InboxEntry(int(n), event, None if epoch is None else int(epoch)))
        return entries

    def complete(
        self,
        session_id: SessionId | str,
        message_ids: Sequence[MessageId],
        *,
        lease: LeaseToken | None = None,
    ) -> None:
        sid = check_session_id(session_id)
        ids = [m.to_bytes() for m in check_message_ids(message_ids)]
        token = check_token(lease)
        self._committer.submit(lambda txn: txn.complete(sid, ids, token))

    def retract(
        self, session_id: SessionId | str, message_id: MessageId, *, epoch: int | None = None
    ) -> bool:
        sid = check_session_id(session_id)
        (mid,) = check_message_ids([message_id])
        if epoch is not None and type(epoch) is not int:
            raise invalid("epoch must be an int or None")
        done: bool = self._committer.submit(lambda txn: txn.retract(sid, mid.to_bytes(), epoch))
        return done

    def hand_over(
        self,
        session_id: SessionId | str,
        message_ids: Sequence[MessageId],
        epoch: int,
        *,
        lease: LeaseToken | None = None,
    ) -> list[MessageId]:
        sid = check_session_id(session_id)
        ids = check_message_ids(message_ids)
        token = check_token(lease)
        if type(epoch) is not int:
            raise invalid("epoch must be an int")
        raw = [m.to_bytes() for m in ids]
        taken: list[bool] = self._committer.submit(
            lambda txn: txn.hand_over(sid, raw, epoch, token)
        )
        return [m for m, took in zip(ids, taken) if took]

    def orphans(self, now: float) -> list[SessionId]:
        at = check_seconds(now, "now")
        rows = self._query(
            "SELECT DISTINCT i.session FROM inbox i LEFT JOIN leases l ON l.session = i.session"
            " WHERE i.done = 0 AND (l.session IS NULL OR l.holder IS NULL OR l.expires <= ?)",
            (at,),
        )
        return [SessionId.from_bytes(bytes(r[0])) for r in rows]

    def waiting(self, holder: str) -> list[SessionId]:
        if type(holder) is not str:
            raise invalid("holder must be a str")
        rows = self._query(
            "SELECT DISTINCT l.session FROM leases l JOIN inbox i ON i.session = l.session"
            " WHERE l.holder = ? AND i.done = 0 AND i.epoch IS NULL",
            (holder,),
        )
        return [SessionId.from_bytes(bytes(r[0])) for r in rows]

    def give_back(
        self, session_id: SessionId | str, message_ids: Sequence[MessageId], epoch: int
    ) -> int:
        sid = check_session_id(session_id)
        ids = [m.to_bytes() for m in check_message_ids(message_ids)]
        if type(epoch) is not int:
            raise invalid("epoch must be an int")
        given: int = self._committer.submit(lambda txn: txn.give_back(sid, ids, epoch))
        return given

    def find_accepted(self, message_id: MessageId) -> list[tuple[SessionId, int]]:
        (mid,) = check_message_ids([message_id])
        rows = self._query("SELECT session, n FROM inbox WHERE message_id = ?", (mid.to_bytes(),))
        return [(SessionId.from_bytes(bytes(key)), int(n)) for key, n in rows]

    def prune_inbox(self, before: float) -> int:
        cutoff = check_seconds(before, "before")
        removed: int = self._committer.submit(lambda txn: txn.prune(cutoff))
        return removed

    # -- leases --------------------------------------------------------------------

    def acquire_lease(
        self,
        session_id: SessionId | str,
        holder: str,
        *,
        now: float,
        expires: float,
        wake: str | None = None,
        dead: Callable[[str], bool] | None = None,
    ) -> Lease:
        sid, at, until = check_acquire(session_id, holder, now, expires, wake)
        lease: Lease = self._committer.submit(
            lambda txn: txn.acquire(sid, holder, at, until, wake, dead)
        )
        return lease

    def renew_leases(self, holder: str, expires: float) -> list[SessionId]:
        until = check_seconds(expires, "expires")
        renewed: list[SessionId] = self._committer.submit(lambda txn: txn.renew(holder, until))
        return renewed

    def release_lease(
        self, session_id: SessionId | str, token: LeaseToken, *, unrun: Sequence[MessageId] = ()
    ) -> Release:
        sid = check_session_id(session_id)
        ids = [m.to_bytes() for m in check_message_ids(unrun)]
        checked = check_token(token)
        if checked is None:
            raise invalid("a lease token is (holder, epoch)")
        done: Release = self._committer.submit(lambda txn: txn.release(sid, checked, ids))
        return done

    def get_lease(self, session_id: SessionId | str) -> Lease | None:
        sid = check_session_id(session_id)
        rows = self._query(
            "SELECT holder, epoch, expires, wake FROM leases WHERE session = ?", (sid.to_bytes(),)
        )
        if not rows:
            return None
        holder, epoch, expires, wake = rows[0]
        return Lease(sid, holder, int(epoch), float(expires), wake)


def _corrupt_entry(session_id: SessionId, n: int, exc: DecodeError) -> CorruptRecordError:
    err = CorruptRecordError(
        f"session {session_id} inbox entry {n} does not decode: {exc}",
        session_id=session_id,
        seq=-1,
    )
    err.__cause__ = exc
    return err
