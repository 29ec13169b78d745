"""This runtime's leases: one activation per session among every process on a store.

A runtime on a durable store is a lease *holder* (``host:pid:nonce``). Every
session it makes live -- created, resumed, materialized -- it holds under a lease
taken from the store by compare-and-swap, and every write it makes for that
session carries the lease's token, so a holder that lost the lease can write
nothing more (``LEASE_LOST``). :class:`Leases` keeps them:

* ``acquire`` takes a session's lease, or says who holds it (``LEASE_HELD``); a
  holder on this host whose process is gone counts as gone at once, without
  waiting for its lease to expire;
* one renewal task extends every lease this holder has, every ``ttl / 3`` seconds,
  in one store write, for as long as it holds any; a session whose lease was not
  renewed (taken over after this process stalled past its ttl) is reported lost;
* ``release`` gives a session's lease up with its last write;
* an acquisition whose commit answer was lost may have taken the lease all the
  same: it is settled from the store (:mod:`._lease_doubts`).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from subagents.actors._kernel._backend import Backend, EventLike, TaskHandle
from subagents.actors._kernel._fork import abandon_if_forked, fork_generation
from subagents.protocol import CorruptRecordError, ErrorCode, MessageId, SessionId, SubagentError
from subagents.store import Holder, Lease, LeaseToken, SessionStore

from ._lease_clock import LeaseClock
from ._lease_doubts import Doubts
from ._write_faults import unsure

__all__ = ["Holder", "Leases"]

logger = logging.getLogger("subagents")


class Leases:
    """The leases of one runtime (see the module docstring). Thread-safe."""

    def __init__(
        self,
        store: SessionStore,
        backend: Backend,
        *,
        ttl: float,
        lost: Callable[[SessionId], object],
        clock: Callable[[], float] | None = None,
        wake: str | None = None,
    ) -> None:
        # A fork before this runs its first round: the child's copy still abandons.
        self._born = fork_generation()
        self.holder = Holder()
        self.ttl = ttl
        self.wake = wake
        self._store = store
        self._backend = backend
        self._lost = lost
        # The store's clock, not this host's: holders and contenders compare expiries.
        self._store_clock: LeaseClock | None = None
        if clock is None:
            clock = self._store_clock = LeaseClock(store, self._call, ttl / 3)
        self._clock = clock
        self._lock = threading.Lock()  # held for a set operation, never across a call out
        self._held: dict[SessionId, int] = {}  # session -> epoch
        # Sessions created under a lease no renewal has returned yet: their create
        # may still wait in the write-behind queue (relaxed durability), so a
        # renewal that misses them says nothing about a takeover.
        self._fresh: set[SessionId] = set()
        # Releases the store refused (it was failing): retried every period.
        self._unreleased: dict[
            SessionId, tuple[LeaseToken, Callable[[Any], object], Sequence[MessageId]]
        ] = {}
        self._doubts = Doubts(store, self.holder.id, self._call, self._lock, self._held)
        self._task: TaskHandle | None = None
        self._stop: EventLike = backend.event()
        # One renewal question at a time (a round's, or a confirm's), each answer
        # applied before the next is asked: applied after a later one, a stale
        # answer missed leases the later one saw stored (no longer fresh): "lost".
        self._asking = backend.lock()
        self._closed = False
        # Until when (monotonic) every lease held counts as held without asking the
        # store: two thirds of the ttl past the last renewal that confirmed them
        # all (its losses settled), or past the first lease taken while none was.
        self._sure_until = time.monotonic() + ttl * 2 / 3

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._store.blocking:
            return self._backend.run_blocking(fn, *args, **kwargs)
        return fn(*args, **kwargs)

    def _refresh(self) -> None:
        if self._store_clock is not None:
            self._store_clock.refresh()

    def now(self) -> float:
        """The clock leases expire by (wall-clock seconds, the store's clock)."""
        self._refresh()
        return self._clock()

    def error(self) -> float:
        """How far :meth:`now` may be off the store's clock (seconds; see
        ``LeaseClock.error``): another process's reading may be off as far."""
        return 0.0 if self._store_clock is None else self._store_clock.error

    def new(self, session_id: SessionId) -> tuple[str, float, str | None]:
        """The lease a session is created with (epoch 1); it is held from now on."""
        self._hold(session_id, 1)
        with self._lock:
            self._fresh.add(session_id)
        return (self.holder.id, self._clock() + self.ttl, self.wake)

    def acquire(self, session_id: SessionId) -> Lease:
        """Take ``session_id``'s lease.

        Raises:
            SubagentError: ``LEASE_HELD`` when another live holder has it.
        """
        try:
            with self._doubts.acquiring(session_id):
                self._refresh()
                asked = time.monotonic()  # when the expiry written was read
                now = self._clock()
                lease: Lease = self._call(
                    self._store.acquire_lease,
                    session_id,
                    self.holder.id,
                    now=now,
                    expires=now + self.ttl,
                    wake=self.wake,
                    dead=self.holder.dead,
                )
                try:
                    self._hold(session_id, lease.epoch, asked)  # under way until held
                except SubagentError:  # closed meanwhile: the lease just taken goes back
                    with contextlib.suppress(SubagentError):
                        self._call(self._store.release_lease, session_id, lease.token())
                    raise
        except SubagentError as exc:
            if unsure(exc):  # taken all the same? (its answer lost): settled now, or later
                self._doubts.add(session_id)
                with self._lock:
                    self._renewing()
                self._doubts.settle()
            raise
        return lease

    def token(self, session_id: SessionId, epoch: int) -> LeaseToken:
        return (self.holder.id, epoch)

    def _hold(self, session_id: SessionId, epoch: int, asked: float | None = None) -> None:
        """Hold ``session_id`` (its lease's expiry read at monotonic ``asked``, or now).
        A lease counts as held without asking the store only until two thirds of the
        ttl past that reading: an acquisition that waited long for the store (a
        lock another process held) wrote an expiry already past, or nearly, and
        another process may take it over at once -- the next turn then asks."""
        since = time.monotonic() if asked is None else asked
        with self._lock:
            if self._closed:
                raise SubagentError("the runtime is closed", code=ErrorCode.RUNTIME_CLOSED)
            sure = since + self.ttl * 2 / 3
            self._sure_until = sure if not self._held else min(self._sure_until, sure)
            self._held[session_id] = epoch
            self._doubts.discard(session_id)
            self._renewing()

    def _renewing(self) -> None:
        """The renewal task runs (under the lock): for the leases held, and for the
        doubts to settle while none is."""
        if self._task is None and not self._closed:
            self._task = self._backend.spawn(self._renew_loop, name="subagents-leases")

    def forget(self, session_id: SessionId, epoch: int) -> None:
        """This runtime stops holding the session (call it before the release is written,
        so a renewal in between does not take the release for a loss)."""
        with self._lock:
            if self._held.get(session_id) == epoch:
                del self._held[session_id]
                self._fresh.discard(session_id)

    def release_later(
        self,
        session_id: SessionId,
        token: LeaseToken,
        done: Callable[[Any], object],
        unrun: Sequence[MessageId] = (),
    ) -> None:
        """A release the store refused: retry it every period, and at close, until it
        is written (``unrun`` given back with it); ``done(result)`` then."""
        with self._lock:
            self._unreleased[session_id] = (token, done, unrun)

    def _retry_releases(self) -> None:
        with self._lock:
            pending = dict(self._unreleased)
        for sid, (token, done, unrun) in pending.items():
            try:
                result = self._call(self._store.release_lease, sid, token, unrun=unrun)
            except SubagentError:
                continue  # still failing: next period
            except Exception:  # (not a store's typed error: the other releases still go)
                logger.exception("releasing the lease of %s failed (retried)", sid)
                continue
            with self._lock:
                if self._unreleased.get(sid, (None,))[0] == token:
                    del self._unreleased[sid]
            try:
                done(result)
            except Exception:  # written: what is left of its callback is not retried
                logger.exception("after releasing the lease of %s", sid)

    def holds(self, session_id: SessionId) -> bool:
        return session_id in self._held

    def confirm(self, session_id: SessionId) -> bool:
        """Whether this runtime still holds ``session_id``'s lease, before a turn of
        it starts: at once while the last renewal is recent (two thirds of the
        ttl: renewals come every third); after longer -- the process was stopped,
        or starved -- the store is asked, renewing every lease held. False: it was
        taken over (and is let go as a renewal would). A store that cannot answer
        counts as held: every write is fenced anyway."""
        if time.monotonic() < self._sure_until:  # one clock read a turn, as a rule
            return session_id in self._held
        # One question at a time: the turns starting meanwhile wait for its answer.
        # (Each asked on its own, with a copy of every lease held: building 100,000
        # children past a stall, thousands of copies and renewals piled up.)
        with self._asking:
            if time.monotonic() < self._sure_until:  # confirmed while this waited
                return session_id in self._held
            with self._lock:
                held = dict(self._held)
            if session_id not in held:
                return False
            asked = time.monotonic()
            self._refresh()
            try:
                renewed = set(
                    self._call(self._store.renew_leases, self.holder.id, self._clock() + self.ttl)
                )
            except SubagentError:
                logger.warning("could not confirm the lease of %s", session_id, exc_info=True)
                return True
            lost = self._renewed(held, renewed)
            self._confirmed(asked)
        if session_id in renewed or session_id in lost or not self.holds(session_id):
            return session_id in renewed
        return self._still_ours(session_id, held[session_id])

    def _still_ours(self, session_id: SessionId, epoch: int) -> bool:
        """A lease no renewal has seen yet (taken as its session was created), met
        after a stall: the renewal cannot say it was lost -- its row may not be
        written yet -- so its row is read. Another holder's, or a later epoch: it
        was taken over while this process stood still (it is let go)."""
        try:
            lease = self._call(self._store.get_lease, session_id)
        except SubagentError:
            return True  # every write is fenced anyway
        if lease is None or (lease.holder == self.holder.id and lease.epoch == epoch):
            return True
        with self._lock:
            still = self._held.get(session_id) == epoch
            if still:
                del self._held[session_id]
                self._fresh.discard(session_id)
        if still:
            logger.error("the lease of session %s was taken over", session_id)
            self._let_go(session_id)
        return False

    def _let_go(self, session_id: SessionId) -> None:
        """``lost(session_id)``: what it raises is logged, and the other losses of
        the round are still let go."""
        try:
            self._lost(session_id)
        except Exception:
            logger.exception("letting go of session %s (its lease was lost) failed", session_id)

    def _confirmed(self, asked: float) -> None:
        """A renewal asked at ``asked`` confirmed every lease held, its losses let go."""
        with self._lock:
            self._sure_until = max(self._sure_until, asked + self.ttl * 2 / 3)

    def count(self) -> int:
        """How many sessions this runtime holds the lease of."""
        return len(self._held)

    def _renew_loop(self) -> None:
        period = self.ttl / 3
        while True:
            if self._stop.wait(period):
                return
            abandon_if_forked(self._born)  # the parent's leases: never renewed by the child
            try:
                if not self._renew_round():
                    return
            except Exception:
                # The only task renewing this runtime's leases: ended, they would all
                # expire under its live agents. The next round comes a period later.
                logger.exception("a lease renewal round of %s failed", self.holder.id)

    def _renew_round(self) -> bool:
        """One period's work: retry the releases the store refused, renew every lease
        held and let the lost ones go. False once closed."""
        with self._lock:
            if self._closed:
                return False
        if self._unreleased:
            self._retry_releases()
        if self._doubts:
            self._doubts.settle()
        with self._asking:
            self._renew_held()
        return True

    def _renew_held(self) -> None:
        with self._lock:
            held = dict(self._held)
            fresh = bool(self._fresh)
        if not held:
            return
        try:
            asked = time.monotonic()
            self._refresh()
            until = self._clock() + self.ttl
            count = self._call(self._store.renew_lease_count, self.holder.id, until)
            # Answered late (a stall, before or during it): a lease may have
            # expired and been taken over, a loss a count can hide -- and a turn
            # about to start trusts this renewal (confirm): the list is read.
            late = time.monotonic() >= self._sure_until
            if count == len(held) and not late and not fresh:
                # Every lease it holds was renewed (none is lost, each is stored):
                # no list to read. A loss hidden by a lease taken meanwhile shows
                # in the next round's count; every write is fenced anyway. (With
                # a create still queued, a count can match by a release still
                # queued too: only the list says which leases a renewal saw.)
                self._confirmed(asked)
                return
            renewed = set(self._call(self._store.renew_leases, self.holder.id, until))
        except SubagentError as exc:  # the store's, typed (an outage): no traceback
            logger.warning("renewing the leases of %s failed: %s", self.holder.id, exc)
            return
        self._renewed(held, renewed)
        self._confirmed(asked)

    def _renewed(self, held: dict[SessionId, int], renewed: set[SessionId]) -> list[SessionId]:
        """After a renewal of the leases ``held`` (session -> epoch) that renewed
        ``renewed``: the others were taken over -- unless created under a lease no
        renewal has seen yet, whose row is not stored (a create still queued) or
        still ours -- and are let go (``lost``). Returns them."""
        with self._lock:
            self._fresh -= renewed
            fresh = set(self._fresh)
        unseen = [s for s, epoch in held.items() if s not in renewed and epoch == 1 and s in fresh]
        taken = self._taken(unseen) if unseen else set()
        lost = []
        for sid, epoch in held.items():
            if sid in renewed:
                continue
            if epoch == 1 and sid in fresh and sid not in taken:
                continue
            with self._lock:
                still = self._held.get(sid) == epoch
                if still:
                    del self._held[sid]
                    self._fresh.discard(sid)
            if still:
                logger.error("the lease of session %s was taken over", sid)
                self._let_go(sid)
                lost.append(sid)
        return lost

    def _taken(self, fresh: list[SessionId]) -> set[SessionId]:
        """Which of the ``fresh`` sessions (leased at epoch 1, unseen by any renewal)
        have a stored lease that is another's -- taken over before a renewal saw
        theirs: never let go otherwise. One read for them all (a burst of creations
        leaves many); none while a row is not stored, or the store cannot say."""
        try:
            leases = self._call(self._store.get_leases, fresh)
        except CorruptRecordError:  # one damaged row: the others one by one
            leases = {}
            for sid in fresh:
                with contextlib.suppress(SubagentError):
                    lease = self._call(self._store.get_lease, sid)
                    if lease is not None:
                        leases[sid] = lease
        except SubagentError:
            return set()
        mine = (self.holder.id, 1)
        return {sid for sid, lease in leases.items() if (lease.holder, lease.epoch) != mine}

    def close(self) -> None:
        with self._lock:
            self._closed = True
            task = self._task
        self._stop.set()
        if task is not None:
            task.join(30)
        if self._unreleased:
            self._retry_releases()
        if self._doubts:
            self._doubts.settle()
