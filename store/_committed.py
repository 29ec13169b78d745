"""The write half shared by the SQL stores: check, encode, then group-commit.

:class:`CommittedWrites` is mixed into :class:`~._sqlite.SqliteStore` and
:class:`~._postgres.PostgresStore`. Every public write is checked and encoded in
the caller's thread, then queued on the store's :class:`~._group.GroupCommitter`
as an operation on the batch's transaction object (``txn``), so the leader's
critical section is only SQL. The transaction objects of both stores
(``_writer.Txn``, ``_pg_txn.PgTxn``) offer the same operations under the same
names: this module is the contract between them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from subagents.protocol import (
    Event,
    Limits,
    MessageId,
    SessionHeader,
    SessionId,
    SubagentError,
    encode_event,
    encode_header,
)

from ._base import not_found
from ._durable import Accepted, Lease, LeaseToken, NewLease, Release
from ._group import GroupCommitter
from ._promises import Promises, check_owe, owe_in
from ._queue_txn import AcceptOp, Message
from ._validate import (
    check_acquire,
    check_blob,
    check_events,
    check_header,
    check_int,
    check_limit,
    check_message_ids,
    check_messages,
    check_new_lease,
    check_seconds,
    check_session_id,
    check_token,
    check_unit,
    invalid,
)

__all__ = ["CommittedWrites", "StoreStatistics", "encode_messages", "unit_name"]


def encode_messages(events: Sequence[Event]) -> list[Message]:
    """Checked inbox events as ``(message id bytes, body)`` rows."""
    return [(e.message_id.to_bytes(), encode_event(e)) for e in check_messages(events)]


def unit_name(unit: object) -> str:
    """A projection unit's name, checked (the SQL stores keep them to 200 characters)."""
    return check_unit(unit, max_len=200)


@dataclass(frozen=True, slots=True, kw_only=True)
class StoreStatistics:
    """Counters of a SQL store's writes since it was opened: what
    ``SqliteStore.statistics()`` and ``PostgresStore.statistics()`` return.

    ``transactions / write_requests`` shows how well group commit coalesces.
    """

    transactions: int
    write_requests: int
    events_appended: int
    largest_batch: int
    pending: int


class CommittedWrites(Promises):
    """Every write of a SQL store (see the module docstring)."""

    _committer: GroupCommitter
    _writer: Any  # ``_writer.Writer`` or ``_pg_txn.PgWriter``: the same counters
    _limits: Limits  # the decoding bounds of the store's reads (what a bound counts)

    def statistics(self) -> StoreStatistics:
        """A snapshot of the write-side counters (see :class:`StoreStatistics`)."""
        w = self._writer
        return StoreStatistics(
            transactions=w.transactions,
            write_requests=w.requests,
            events_appended=w.events,
            largest_batch=w.largest_batch,
            pending=self._committer.pending,
        )

    def exists(self, session_id: SessionId | str) -> bool:
        raise NotImplementedError

    def create_session(
        self,
        header: SessionHeader,
        events: Sequence[Event] = (),
        *,
        lease: NewLease | None = None,
        inbox: Sequence[Event] = (),
    ) -> int:
        create = self._prepare(("create", header, events, lease, inbox))
        result: int = self._committer.submit(create)
        return result

    def append(
        self,
        session_id: SessionId | str,
        events: Sequence[Event],
        *,
        lease: LeaseToken | None = None,
        done: Sequence[MessageId] = (),
    ) -> list[int]:
        sid = check_session_id(session_id)
        bodies = [encode_event(e) for e in check_events(events)]
        token = check_token(lease)
        finished = [m.to_bytes() for m in check_message_ids(done)] if done else []
        if not bodies and token is None and not finished:
            if not self.exists(sid):
                raise not_found(sid)
            return []
        seqs: list[int] = self._committer.submit(
            lambda txn: txn.append(sid, bodies, token, finished)
        )
        return seqs

    def write_many(self, ops: Sequence[tuple[Any, ...]]) -> list[Any]:
        return self._write_many(ops)

    def _write_soon(
        self, ops: Sequence[tuple[Any, ...]], unawaited: Callable[[], bool]
    ) -> list[Any]:
        # Lazy: a batch of them alone may linger for an acceptance to share its
        # commit with (see _group.py). A write_many of its own (a subclass's, or
        # one set on the object) is what it writes through, eagerly.
        write_many = self.write_many
        if getattr(write_many, "__func__", None) is not CommittedWrites.write_many:
            return write_many(ops)
        return self._write_many(ops, lazy=unawaited)

    def _hurry(self) -> None:
        self._committer.hurry()

    def _write_many(
        self, ops: Sequence[tuple[Any, ...]], *, lazy: Callable[[], bool] | None = None
    ) -> list[Any]:
        # Validate and encode every op first (failures stay per op), then hand the
        # rest to the committer at once: one transaction, one fsync.
        prepared: list[Any] = []
        results: list[Any] = [None] * len(ops)
        slots: list[int] = []
        for i, op in enumerate(ops):
            try:
                prepared.append(self._prepare(op))
                slots.append(i)
            except SubagentError as exc:
                results[i] = exc
        for i, request in zip(slots, self._committer.submit_many(prepared, lazy=lazy)):
            try:
                results[i] = request.outcome()
            except SubagentError as exc:
                results[i] = exc
        return results

    def _prepare(self, op: tuple[Any, ...]) -> Callable[[Any], Any]:
        kind = op[0]
        if kind == "create":
            header = check_header(op[1])
            blob = encode_header(header)
            bodies = [encode_event(e) for e in check_events(op[2])]
            lease = check_new_lease(op[3]) if len(op) > 3 else None
            inbox = encode_messages(op[4]) if len(op) > 4 else []
            return lambda txn: txn.create(header, blob, bodies, lease, inbox)
        if kind == "append":
            sid = check_session_id(op[1])
            bodies = [encode_event(e) for e in check_events(op[2])]
            token = check_token(op[3]) if len(op) > 3 else None
            done = [m.to_bytes() for m in check_message_ids(op[4])] if len(op) > 4 else []
            return lambda txn: txn.append(sid, bodies, token, done)
        if kind == "release":
            sid = check_session_id(op[1])
            released = check_token(op[2])
            if released is None:
                raise invalid("a lease token is (holder, epoch)")
            unrun = [m.to_bytes() for m in check_message_ids(op[3])] if len(op) > 3 else []
            return lambda txn: txn.release(sid, released, unrun)
        if kind == "delete":
            sid = check_session_id(op[1])
            return lambda txn: txn.delete(sid)
        if kind == "checkpoint":
            sid = check_session_id(op[1])
            seq = check_int(op[2], "seq")
            blob = check_blob(op[3])
            token = check_token(op[4]) if len(op) > 4 else None
            return lambda txn: txn.put_checkpoint(sid, seq, blob, token)
        if kind == "projection":
            sid = check_session_id(op[1])
            unit = unit_name(op[2])
            seq = check_int(op[3], "seq", minimum=-1)
            blob = check_blob(op[4])
            return lambda txn: txn.put_projection(sid, unit, seq, blob)
        if kind == "owe":
            sid, token, add, drop, clear = check_owe(op)
            token = check_token(token)
            return lambda txn: owe_in(txn, sid, token, add, drop, clear)
        raise invalid(f"unknown write op {kind!r}")

    def owe(
        self,
        session_id: SessionId | str,
        add: Sequence[MessageId] = (),
        drop: Sequence[MessageId] = (),
        *,
        lease: LeaseToken | None = None,
        clear: bool = False,
    ) -> None:
        self._committer.submit(self._prepare(("owe", session_id, lease, add, drop, clear)))

    def raise_delegation_depth(self, session_id: SessionId | str, depth: int) -> SessionHeader:
        sid = check_session_id(session_id)
        check_int(depth, "depth")
        header: SessionHeader = self._committer.submit(lambda txn: txn.raise_depth(sid, depth))
        return header

    def delete_session(self, session_id: SessionId | str) -> None:
        sid = check_session_id(session_id)
        self._committer.submit(lambda txn: txn.delete(sid))

    def put_checkpoint(
        self,
        session_id: SessionId | str,
        seq: int,
        data: bytes,
        *,
        lease: LeaseToken | None = None,
    ) -> None:
        sid = check_session_id(session_id)
        check_int(seq, "seq")
        blob = check_blob(data)
        token = check_token(lease)
        self._committer.submit(lambda txn: txn.put_checkpoint(sid, seq, blob, token))

    def put_projection(self, session_id: SessionId | str, unit: str, seq: int, data: bytes) -> None:
        sid = check_session_id(session_id)
        name = unit_name(unit)
        check_int(seq, "seq", minimum=-1)
        blob = check_blob(data)
        self._committer.submit(lambda txn: txn.put_projection(sid, name, seq, blob))

    def drop_projections(self) -> None:
        self._committer.submit(lambda txn: txn.drop_projections())

    # -- the inbox -----------------------------------------------------------------

    def accept(
        self,
        session_id: SessionId | str,
        events: Sequence[Event],
        *,
        epoch: int | None = None,
        now: float = 0.0,
        lease: LeaseToken | None = None,
        limit: int | None = None,
    ) -> list[Accepted]:
        sid = check_session_id(session_id)
        rows = encode_messages(events)
        at = check_seconds(now, "now")
        token = check_token(lease)
        bound = check_limit(limit)
        if epoch is not None and type(epoch) is not int:
            raise invalid("epoch must be an int or None")
        if not rows:
            if not self.exists(sid):
                raise not_found(sid)
            return []
        op = AcceptOp(sid, rows, epoch, at, token, bound, self._limits)
        out: list[Accepted] = self._committer.submit(op)
        return out

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
        self,
        session_id: SessionId | str,
        message_id: MessageId,
        *,
        epoch: int | None = None,
        accepted_at: float | None = None,
    ) -> bool:
        sid = check_session_id(session_id)
        (mid,) = check_message_ids([message_id])
        if epoch is not None and type(epoch) is not int:
            raise invalid("epoch must be an int or None")
        if accepted_at is not None and type(accepted_at) is not float:
            raise invalid("accepted_at must be a float or None")
        done: bool = self._committer.submit(
            lambda txn: txn.retract(sid, mid.to_bytes(), epoch, accepted_at)
        )
        return done

    def answer(self, session_id: SessionId | str, message_id: MessageId) -> bool:
        sid = check_session_id(session_id)
        (mid,) = check_message_ids([message_id])
        done: bool = self._committer.submit(lambda txn: txn.answer(sid, mid.to_bytes()))
        return done

    def withdraw(self, session_id: SessionId | str, message_id: MessageId) -> bool:
        sid = check_session_id(session_id)
        (mid,) = check_message_ids([message_id])
        done: bool = self._committer.submit(lambda txn: txn.withdraw(sid, mid.to_bytes()))
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

    def give_back(
        self, session_id: SessionId | str, message_ids: Sequence[MessageId], epoch: int
    ) -> int:
        sid = check_session_id(session_id)
        ids = [m.to_bytes() for m in check_message_ids(message_ids)]
        if type(epoch) is not int:
            raise invalid("epoch must be an int")
        given: int = self._committer.submit(lambda txn: txn.give_back(sid, ids, epoch))
        return given

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

    def renew_lease_count(self, holder: str, expires: float) -> int:
        until = check_seconds(expires, "expires")
        count: int = self._committer.submit(lambda txn: txn.renew_count(holder, until))
        return count

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
