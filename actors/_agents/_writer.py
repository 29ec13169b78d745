"""The write-behind writer: one task commits every session's writes, in order (or
the appending caller, *inline*, where the store allows it: see :class:`Writer`).
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from subagents.actors._kernel._backend import Backend, TaskHandle
from subagents.actors._kernel._fork import abandon_if_forked, fork_generation
from subagents.actors._kernel._future import Waiter
from subagents.protocol import (
    ErrorCode,
    Event,
    SessionId,
    SubagentError,
    TurnRecord,
    materialise,
)
from subagents.store import Release, SessionStore

from ._write_faults import detached, lost_lease

__all__ = ["Writer"]

logger = logging.getLogger("subagents")


class Writer:
    """The write-behind queue to persistence: one task, writes in order.

    A store that allows it (``store.inline_writes``: in memory, never blocks) is
    written *inline* instead (:meth:`write_through` for appends, :meth:`submit` for the
    other ops), by the caller under the writer lock: the same order, no task, and
    no thread or greenlet hand-off per write, which cost a follow-up's round trip
    more than the write itself.

    A write's failure is recorded at once (the session gets no later write), and
    its callback (``failed``: the session's agent stops, running its turn's abort
    listeners -- behaviour code, which may write to that session, read it, or
    yield) runs from :meth:`report` once the writer's lock and the caller's are
    released: the writer task after each batch, an inline writer's caller after
    its own ``with``. An inline writer's other callbacks (``committed``,
    ``waiting``, ``unreleased``) wait for :meth:`report` too.
    """

    def __init__(
        self,
        store: SessionStore,
        backend: Backend,
        committed: Callable[[SessionId, int], object],
        failed: Callable[[SessionId, BaseException], object],
        waiting: Callable[[SessionId], object] | None = None,
        unreleased: Callable[[SessionId, Any, Any], object] | None = None,
    ) -> None:
        # A fork before this runs its first round: the child's copy still abandons.
        self._born = fork_generation()
        self._store = store
        self._on_waiting = waiting  # a released session has messages nobody took
        # A release that did not land (its batch failed, or an earlier write of its
        # session did): its (token, unrun), to be given back another way -- else the
        # lease stays this holder's, kept live by its heartbeat.
        self._on_unreleased = unreleased
        self._backend = backend
        self._on_committed = committed  # (session, last seq) now in the store
        self._on_failed = failed  # a session's write failed: it gets no more writes
        self._ops: deque[tuple[int, str, SessionId, Any]] = deque()
        self._lock = threading.Lock()
        self._ticket = 0
        self._committed = 0
        self._wake = backend.event()
        # A heap by ticket: a drain reads only the waiters it wakes (a million at a close).
        self._waiters: list[tuple[int, int, Any]] = []
        self._arrivals = itertools.count()  # ties in the heap: never compare waiters
        self._failed: dict[SessionId, BaseException] = {}
        # Callbacks due, not run yet (see report): a failure's; an inline writer's
        # others too, which its caller runs once it let go of the writer's lock.
        self._due: deque[tuple[Callable[..., object], tuple[Any, ...]]] = deque()
        self._closing = False
        self._task: TaskHandle | None = None
        self._awake = False  # the writer is draining: no need to signal it again
        self.inline = store.inline_writes and not store.blocking
        self._append_owned = store._owned_appender()
        self._compact = store._takes_turn_records()  # it takes TurnRecord slots as they are

    def submit(self, op: str, session_id: SessionId, payload: Any, *, report: bool = True) -> int:
        """Queue ``op`` (or, inline, write it now); its ticket. ``report=False``: the
        caller holds a lock of its own, and calls :meth:`report` once it let go."""
        with self._lock:
            if self._closing:
                raise SubagentError("the session service is closed", code=ErrorCode.STORE_CLOSED)
            self._ticket += 1
            ticket = self._ticket
            if self.inline:
                self._write([(ticket, op, session_id, payload)])
                self._committed = ticket
            else:
                self._ops.append((ticket, op, session_id, payload))
                if self._task is None:
                    self._task = self._backend.spawn(self._run, name="subagents-session-writer")
                if self._awake:
                    return ticket
                self._awake = True
        if self.inline:
            if report and self._due:  # its callbacks, with the lock released
                self.report()
            return ticket
        # Setting an event costs microseconds (a gevent one schedules a callback);
        # only the submit that finds the writer asleep pays it.
        self._wake.set()
        return ticket

    def write_through(
        self, session_id: SessionId, first_seq: int, events: Sequence[Event | TurnRecord]
    ) -> bool:
        """Inline mode: append ``events`` (from ``first_seq`` on; a turn may be in
        them as its record's slots) to the store now; True when stored.

        The caller holds the session's lock, so the session's appends reach the
        store in seq order; no other order matters to an append, so the writer
        lock is not taken (the store has its own). A failure is logged and kept
        for ``flush`` to report, and the session gets no later writes (no holes in
        its log); the caller, on False, calls :meth:`report` once it released the
        session's lock (the failure callback stops the agent: see the class).
        """
        if self._closing:
            raise SubagentError("the session service is closed", code=ErrorCode.STORE_CLOSED)
        if session_id in self._failed:
            return False
        try:
            # A compact-aware store takes the record's slots as they are.
            # (No typing.cast: it is a call, once a turn.)
            self._append_owned(
                session_id,
                events if self._compact else materialise(first_seq, events),  # type: ignore[arg-type]
            )
        except Exception as exc:
            logger.error("persisting session %s failed: %s", session_id, exc)
            self._fails(session_id, exc)
            return False
        return True

    def _fails(self, sid: SessionId, exc: BaseException) -> None:
        """Record ``sid``'s failure: no later write of it lands; its callback is due."""
        self._failed[sid] = detached(exc)
        self._due.append((self._on_failed, (sid, exc)))

    def report(self) -> None:
        """Run the callbacks due so far, each once, in order: the failures'
        recorded so far, and an inline writer's others (:meth:`_notify`).

        Called with no lock held (the writer's, a session's): a failure's callback
        stops the session's agent, and that runs behaviour code. What it raises is
        logged (:meth:`_call_back`)."""
        due = self._due
        while due:
            try:
                fn, args = due.popleft()
            except IndexError:  # another caller took the last one meanwhile
                return
            self._call_back(fn, *args)

    def ended(self, session_id: SessionId) -> None:
        """The activation of ``session_id`` is over (its session left the live set,
        its last write queued): a failure of its writes, kept so that none of them
        landed after it, is history once those writes are done -- queued behind
        them (an ``ended`` op, as :meth:`reset` is). Without it the entry stayed for as long as the
        session was not activated here again: for ever for a one-shot child, a
        disposed top-level agent, or one another process resumes."""
        with self._lock:
            if self.inline:  # its writes were made by the callers, in order: all done
                self._failed.pop(session_id, None)
                return
            # (A write still queued may fail yet; closing, the writer goes with it.)
            behind = session_id in self._failed or self._committed < self._ticket
            if not behind or self._closing:
                return
        with contextlib.suppress(SubagentError):  # closed meanwhile: as above
            self.submit("ended", session_id, None)

    def fail(self, session_id: SessionId, error: SubagentError) -> None:
        """Stop ``session_id``'s writes as a failed write would, behind those queued
        so far: later ones are dropped (the activation did what the store does
        not know), and its agent stops. Closing: nothing is written any more."""
        with contextlib.suppress(SubagentError):
            self.submit("fail", session_id, error)

    def reset(self, session_id: SessionId) -> int | None:
        """A new activation of ``session_id`` starts from what the store holds: its
        writes go through again. Queued behind the failed activation's writes, which
        stay dropped (no holes in the log). Returns the reset's ticket, if one was
        needed."""
        if session_id in self._failed:
            return self.submit("reset", session_id, None)
        return None

    def _run(self) -> None:
        while True:
            self._wake.wait()
            abandon_if_forked(self._born)  # the parent's writer, in the child of a fork
            self._wake.clear()
            self._drain()
            with self._lock:
                if self._ops:
                    self._wake.set()  # raced with a submit that saw us awake
                    continue
                self._awake = False
                if self._closing:
                    return

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._ops:
                    return
                batch: list[tuple[int, str, SessionId, Any]] = []
                while self._ops and len(batch) < 4096:
                    batch.append(self._ops.popleft())
            try:
                self._write(batch)
            except Exception as exc:
                # Raised with the batch half done: what of it reached the store is
                # unknown. Its sessions fail as after a failed write (their next
                # activation starts from the store), and the writer goes on: ended
                # here, it left every later write unwritten, every flush waiting.
                abandon_if_forked(self._born)  # forked mid-batch: the parent's, not ours
                logger.exception("writing a batch of %d ops failed", len(batch))
                self._fail_batch(batch, exc)
            self.report()  # before a flush waiting for the batch wakes: it reads the failures
            with self._lock:
                self._committed = committed = batch[-1][0]
                waiters, ready = self._waiters, []
                while waiters and waiters[0][0] <= committed:
                    ready.append(heapq.heappop(waiters)[2])
            for ev in ready:
                ev.wake()

    def _fail_batch(self, batch: list[tuple[int, str, SessionId, Any]], exc: Exception) -> None:
        """Fail every session with a write in ``batch`` (see :meth:`_drain`)."""
        for sid in dict.fromkeys(sid for _, op, sid, _ in batch if op not in ("reset", "ended")):
            if sid not in self._failed:
                self._fails(sid, exc)

    def _unreleased(self, sid: SessionId, payload: Any) -> None:
        if self._on_unreleased is not None:
            self._notify(self._on_unreleased, sid, *payload)

    def _notify(self, fn: Callable[..., object], *args: Any) -> None:
        """A callback a write makes due: run now by the writer task (it holds no
        lock while it writes), kept for :meth:`report` by an inline writer, whose
        caller writes under the writer's lock -- a callback that wrote again, or
        waited on anything that does, would wait for that lock for ever."""
        if self.inline:
            self._due.append((fn, args))
        else:
            self._call_back(fn, *args)

    def _call_back(self, fn: Callable[..., object], *args: Any) -> None:
        """``fn(*args)``, one of the writer's callbacks: what it raises is logged and
        stops neither the batch nor the writer (what it reports is written, or
        failed, all the same)."""
        try:
            fn(*args)
        except Exception:
            logger.exception("the session writer's callback %r failed", fn)

    def _call(self, fn: Any, *args: Any) -> Any:
        if self._store.blocking:
            return self._backend.run_blocking(fn, *args)
        return fn(*args)

    def _write(self, batch: list[tuple[int, str, SessionId, Any]]) -> None:
        """Write a batch through ``store.write_many``: one durable transaction.

        Runs of appends to one session are merged into one op. A session whose
        earlier write failed gets no later writes (no holes in its log).
        """
        ops: list[tuple[Any, ...]] = []
        owners: list[SessionId] = []
        ended: dict[SessionId, int] = {}  # sessions whose activation ended: at which op
        i = 0
        while i < len(batch):
            _, op, sid, payload = batch[i]
            i += 1
            if op == "reset" or op == "ended":
                self._failed.pop(sid, None)
                if op == "ended":  # and what its writes before fail in this batch
                    ended[sid] = len(ops)
                continue
            if sid in self._failed:
                if op == "release":
                    self._unreleased(sid, payload)
                continue
            if op == "fail":  # (see fail): what is queued after it is dropped
                self._failed[sid] = payload
                self._due.append((self._on_failed, (sid, payload)))
                continue
            if op == "append":
                events, token, done = payload
                events = list(events)
                done = list(done)
                while i < len(batch) and batch[i][1] == "append" and batch[i][2] == sid:
                    more, _token, more_done = batch[i][3]
                    events.extend(more)
                    done.extend(more_done)
                    i += 1
                ops.append(("append", sid, events, token, done))
            elif op == "create":
                ops.append(("create", *payload))
            elif op == "delete":
                ops.append(("delete", sid))
            else:  # checkpoint, projection: payload is the rest of the op
                ops.append((op, sid, *payload))
            owners.append(sid)
        if not ops:
            return
        failed = self._write_ops(ops, owners)
        for sid, at in ended.items():  # unless a write of a later activation failed
            if failed.get(sid, at) < at:
                self._failed.pop(sid, None)

    def _write_ops(
        self, ops: list[tuple[Any, ...]], owners: list[SessionId]
    ) -> dict[SessionId, int]:
        """Write ``ops`` (of sessions ``owners``) in one transaction; the failed
        sessions, each with its last failed op."""
        store = self._store
        try:
            # Nobody waits for it yet: a store may hold it to share a commit (a
            # waiter coming meanwhile hurries it: see wait).
            if self._unawaited():
                results = self._call(store._write_soon, ops, self._unawaited)
            else:
                results = self._call(store.write_many, ops)
        except Exception as exc:  # the store itself failed: every session in the batch
            abandon_if_forked(self._born)  # forked mid-batch: the parent's, not ours
            logger.exception("persisting a batch of %d writes failed", len(ops))
            results = [exc] * len(ops)
        failed: dict[SessionId, int] = {}  # each session fails once, not once an op
        for k, (sid, done, result) in enumerate(zip(owners, ops, results)):
            if isinstance(result, BaseException):
                abandon_if_forked(self._born)  # (a store refusing the copy: WRONG_PROCESS)
                if done[0] == "checkpoint" and lost_lease(result):
                    # A stale holder's: refused, as it should be. No failure of the
                    # session -- a new activation of it here may hold the lease now.
                    logger.warning("no checkpoint of %s: its lease was lost", sid)
                elif done[0] != "projection":
                    # (A projection is derived data: a lost cache row is harmless.)
                    if sid not in failed:
                        logger.error("persisting session %s failed: %s", sid, result)
                        self._fails(sid, result)
                    failed[sid] = k
                    if done[0] == "release":  # (lost at its commit: NOT_HELD then)
                        self._unreleased(sid, done[2:])
            elif done[0] == "append" and result:
                self._notify(self._on_committed, sid, result[-1])
            elif (
                done[0] == "release" and result == Release.WAITING and self._on_waiting is not None
            ):
                self._notify(self._on_waiting, sid)
        return failed

    def _unawaited(self) -> bool:
        # Read by the store as it holds a batch, after it said so (see _group.py).
        return not self._waiters and not self._closing

    def wait(self, ticket: int, timeout: float | None) -> bool:
        if self._committed >= ticket:  # it only grows: true once is true for good
            return True  # (every inline write; a settle's flush, 10,000 in a drain)
        waiter = Waiter()  # woken from the writer's thread, which may not be ours
        with self._lock:
            if self._committed >= ticket:
                return True
            heapq.heappush(self._waiters, (ticket, next(self._arrivals), waiter))
        self._store._hurry()  # a batch held for a commit to share goes now
        return waiter.wait(timeout)

    def take_failure(self, sid: SessionId) -> BaseException | None:
        return self._failed.get(sid)

    def forget(self, sid: SessionId) -> None:
        self._failed.pop(sid, None)

    @property
    def ticket(self) -> int:
        return self._ticket

    def close(self) -> None:
        with self._lock:
            self._closing = True
            task = self._task
            self._awake = True
        self._store._hurry()  # (a batch lingering for an acceptance: the close waits)
        self._wake.set()
        if task is not None:
            task.join()
