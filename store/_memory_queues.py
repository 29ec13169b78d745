"""The durable-inbox and lease half of ``MemoryStore`` (see :mod:`._durable`).

Nothing here survives the process; it holds the contract all the same, so the
runtime and the tests run one code path on every store. State lives on each
session record, under the store's one lock, never held across a call out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from subagents.protocol import Event, MessageEvent, MessageId, ReportEvent, SessionId

from ._base import store_closed
from ._durable import (
    HOLDER_RETENTION,
    Accepted,
    DurableQueues,
    InboxEntry,
    Lease,
    LeaseToken,
    NewLease,
    Release,
    inbox_full,
    lease_held,
    lease_lost,
    quiet_report,
)
from ._validate import (
    check_acquire,
    check_limit,
    check_message_ids,
    check_messages,
    check_seconds,
    check_session_id,
    check_token,
    invalid,
)

__all__ = ["MemoryQueues", "QueueState"]


class _Entry:
    __slots__ = ("at", "done", "epoch", "event", "n")

    def __init__(self, n: int, event: MessageEvent | ReportEvent, epoch: int | None, at: float):
        self.n = n
        self.event = event
        self.epoch = epoch
        self.done = False
        self.at = at


class QueueState:
    """A session's inbox and lease (made on first use: most sessions never need one)."""

    __slots__ = ("inbox", "lease", "next_n")

    def __init__(self) -> None:
        self.inbox: dict[MessageId, _Entry] = {}
        self.next_n = 1
        self.lease: Lease | None = None

    @classmethod
    def fresh(
        cls,
        session_id: SessionId,
        lease: NewLease | None,
        messages: Sequence[MessageEvent | ReportEvent],
    ) -> QueueState:
        """The state of a session created with a lease (epoch 1) and first messages."""
        state = cls()
        epoch = None
        if lease is not None:
            holder, expires, wake = lease
            state.lease = Lease(session_id, holder, 1, expires, wake)
            epoch = 1
        for event in messages:
            state.add(event, epoch, 0.0)
        return state

    def add(self, event: MessageEvent | ReportEvent, epoch: int | None, at: float) -> Accepted:
        known = self.inbox.get(event.message_id)
        if known is not None:
            if not known.done:  # answered for (see DurableInbox.retract)
                known.at += 0.000001
            return Accepted(known.n, True)
        n = self.next_n
        self.next_n = n + 1
        self.inbox[event.message_id] = _Entry(n, event, epoch, at)
        return Accepted(n, False, at)

    def give_back(self, message_ids: Sequence[MessageId], epoch: int) -> int:
        later = self.lease.epoch if self.lease and self.lease.epoch > epoch else None
        n = 0
        for mid in message_ids:
            entry = self.inbox.get(mid)
            if entry is not None and entry.epoch == epoch and not entry.done:
                entry.epoch = later  # the later activation's: see DurableQueues.give_back
                n += 1
        return n if later is None else 0

    def mark_done(self, message_ids: Sequence[MessageId]) -> None:
        for mid in message_ids:
            entry = self.inbox.get(mid)
            if entry is not None:
                entry.done = True


class _Session(Protocol):
    queues: QueueState | None


class MemoryQueues(DurableQueues):
    """Mixed into :class:`~._memory.MemoryStore` (which provides the fields below)."""

    _lock: Any
    _sessions: dict[SessionId, Any]
    _closed: bool
    _holders: dict[str, float]  # holder -> heartbeat (its last renewal's expiry)

    def _get(self, session_id: SessionId) -> _Session:
        raise NotImplementedError

    def _drop(self, session_id: SessionId) -> None:
        """Delete the session (caller holds the lock)."""
        raise NotImplementedError

    def _queues(self, session_id: SessionId) -> QueueState:
        # Caller holds the lock.
        session = self._get(session_id)
        state = session.queues
        if state is None:
            state = session.queues = QueueState()
        return state

    def _live(self, lease: Lease | None) -> Lease | None:
        """``lease`` with its expiry: its own, or its holder's heartbeat when later.
        Caller holds the lock."""
        if lease is None or lease.holder is None:
            return lease
        beat = self._holders.get(lease.holder)
        if beat is None or beat <= lease.expires:
            return lease
        return Lease(lease.session_id, lease.holder, lease.epoch, beat, lease.wake)

    def _fence(self, session_id: SessionId, state: QueueState, lease: LeaseToken | None) -> None:
        if lease is None:
            return
        held = state.lease
        if held is None or held.holder != lease[0] or held.epoch != lease[1]:
            raise lease_lost(session_id, lease)

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
        messages = check_messages(events)
        at = check_seconds(now, "now")
        token = check_token(lease)
        bound = check_limit(limit)
        if epoch is not None and type(epoch) is not int:
            raise invalid("epoch must be an int or None")
        with self._lock:
            state = self._queues(sid)
            self._fence(sid, state, token)
            if bound is not None:
                new = {e.message_id for e in messages if e.message_id not in state.inbox}
                pending = sum(
                    1 for e in state.inbox.values() if not e.done and not quiet_report(e.event)
                )
                if new and pending + len(new) > bound:
                    raise inbox_full(sid, bound, pending)
            first = state.next_n
            out = [state.add(event, epoch, at) for event in messages]
            run = (first, state.next_n - 1)
            return [a if a.duplicate else Accepted(a.n, False, a.at, run) for a in out]

    def pending(
        self, session_id: SessionId | str, *, damaged: list[int] | None = None
    ) -> list[InboxEntry]:
        # Values in memory never fail to decode: ``damaged`` stays empty.
        sid = check_session_id(session_id)
        with self._lock:
            state = self._queues(sid)
            return [InboxEntry(e.n, e.event, e.epoch) for e in state.inbox.values() if not e.done]

    def complete(
        self,
        session_id: SessionId | str,
        message_ids: Sequence[MessageId],
        *,
        lease: LeaseToken | None = None,
    ) -> None:
        sid = check_session_id(session_id)
        ids = check_message_ids(message_ids)
        token = check_token(lease)
        with self._lock:
            state = self._queues(sid)
            self._fence(sid, state, token)
            state.mark_done(ids)

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
        with self._lock:
            state = self._queues(sid)
            entry = state.inbox.get(mid)
            if entry is None or entry.done or entry.epoch not in (None, epoch):
                return False
            if accepted_at is not None and entry.at != accepted_at:
                return False  # answered for by a later acceptance: it stays
            if epoch is not None and state.lease is not None and state.lease.epoch > epoch:
                return False  # a later activation replays it already
            del state.inbox[mid]
            return True

    def answer(self, session_id: SessionId | str, message_id: MessageId) -> bool:
        sid = check_session_id(session_id)
        (mid,) = check_message_ids([message_id])
        with self._lock:
            entry = self._queues(sid).inbox.get(mid)
            if entry is None or entry.done:
                return False
            entry.at += 0.000001  # as a duplicate acceptance does (QueueState.add)
            return True

    def withdraw(self, session_id: SessionId | str, message_id: MessageId) -> bool:
        sid = check_session_id(session_id)
        (mid,) = check_message_ids([message_id])
        with self._lock:
            if self._closed:
                raise store_closed(self)
            if sid not in self._sessions:
                return False
            entry = self._queues(sid).inbox.get(mid)
            if entry is None or entry.done or entry.epoch is not None or entry.at != 0.0:
                return False
            self._drop(sid)
            return True

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
        taken: list[MessageId] = []
        with self._lock:
            state = self._queues(sid)
            self._fence(sid, state, token)
            for mid in ids:
                entry = state.inbox.get(mid)
                if entry is not None and entry.epoch is None and not entry.done:
                    entry.epoch = epoch
                    taken.append(mid)
        return taken

    def orphans(self, now: float) -> list[SessionId]:
        at = check_seconds(now, "now")
        with self._lock:
            if self._closed:
                raise store_closed(self)
            out = []
            for sid, session in self._sessions.items():
                state = session.queues
                if state is None or not any(not e.done for e in state.inbox.values()):
                    continue
                lease = self._live(state.lease)
                if lease is None or lease.holder is None or lease.expires <= at:
                    out.append(sid)
            return out

    def waiting(self, holder: str) -> list[SessionId]:
        if type(holder) is not str:
            raise invalid("holder must be a str")
        with self._lock:
            if self._closed:
                raise store_closed(self)
            out = []
            for sid, session in self._sessions.items():
                state = session.queues
                if (
                    state is not None
                    and state.lease is not None
                    and state.lease.holder == holder
                    and any(e.epoch is None and not e.done for e in state.inbox.values())
                ):
                    out.append(sid)
            return out

    def give_back(
        self, session_id: SessionId | str, message_ids: Sequence[MessageId], epoch: int
    ) -> int:
        sid = check_session_id(session_id)
        ids = check_message_ids(message_ids)
        if type(epoch) is not int:
            raise invalid("epoch must be an int")
        with self._lock:
            return self._queues(sid).give_back(ids, epoch)

    def find_accepted(self, message_id: MessageId) -> list[tuple[SessionId, int]]:
        (mid,) = check_message_ids([message_id])
        with self._lock:
            if self._closed:
                raise store_closed(self)
            found = []
            for sid, session in self._sessions.items():
                entry = session.queues.inbox.get(mid) if session.queues is not None else None
                if entry is not None:
                    found.append((sid, entry.n))
            return found

    def prune_inbox(self, before: float) -> int:
        cutoff = check_seconds(before, "before")
        removed = 0
        with self._lock:
            if self._closed:
                raise store_closed(self)
            for session in self._sessions.values():
                state = session.queues
                if state is None:
                    continue
                gone = [m for m, e in state.inbox.items() if e.done and e.at < cutoff]
                for mid in gone:
                    del state.inbox[mid]
                removed += len(gone)
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
        with self._lock:
            state = self._queues(sid)
            held = self._live(state.lease)
            if (
                held is not None
                and held.holder is not None
                and held.holder != holder
                and held.expires > at
                and not (dead is not None and dead(held.holder))
            ):
                raise lease_held(held)
            lease = Lease(sid, holder, (held.epoch if held else 0) + 1, until, wake)
            state.lease = lease
            return lease

    def renew_leases(self, holder: str, expires: float) -> list[SessionId]:
        until = check_seconds(expires, "expires")
        with self._lock:
            if self._closed:
                raise store_closed(self)
            beats = self._holders
            beats[holder] = max(until, beats.get(holder, until))  # never backwards
            for gone in [h for h, beat in beats.items() if beat < until - HOLDER_RETENTION]:
                del beats[gone]
            return [
                sid
                for sid, session in self._sessions.items()
                if session.queues is not None
                and session.queues.lease is not None
                and session.queues.lease.holder == holder
            ]

    def release_lease(
        self, session_id: SessionId | str, token: LeaseToken, *, unrun: Sequence[MessageId] = ()
    ) -> Release:
        sid = check_session_id(session_id)
        ids = check_message_ids(unrun)
        checked = check_token(token)
        assert checked is not None
        with self._lock:
            if self._closed:
                raise store_closed(self)
            session = self._sessions.get(sid)
            state = session.queues if session is not None else None
            held = state.lease if state is not None else None
            if state is None or held is None or (held.holder, held.epoch) != checked:
                return Release.NOT_HELD
            state.lease = Lease(sid, None, held.epoch, 0.0, None)
            state.give_back(ids, held.epoch)
            if any(e.epoch is None and not e.done for e in state.inbox.values()):
                return Release.WAITING
            return Release.RELEASED

    def get_lease(self, session_id: SessionId | str) -> Lease | None:
        sid = check_session_id(session_id)
        with self._lock:
            if self._closed:
                raise store_closed(self)
            session = self._sessions.get(sid)
            state = session.queues if session is not None else None
            return None if state is None else self._live(state.lease)
