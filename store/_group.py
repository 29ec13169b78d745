"""Group commit without a background thread (leader/follower).

Every write request is queued. A caller that finds no leader becomes the leader:
it takes *every* pending request, hands the batch to the executor (which writes it
in one transaction), wakes the batch's followers, and passes leadership to the
oldest request still queued, if any. While a leader waits for its commit's
fsync, new requests pile up, so the next batch is as large as the load.

No thread is ever started, so nothing can leak; a caller is only ever blocked on
its own request's lock. A leader writes at most :data:`KEEP_LEADING` batches in a
row before it hands leadership over: the thread that just ran holds the
interpreter, while a woken successor would first wait behind every caller the
batch woke (measured: 16 producers, 5.9-6.2k -> 7.2-7.3k acceptances/s), and the
bound keeps what a caller pays for other callers' writes to a few batches.

After a batch of several requests, the next leader first gives the callers that
batch woke a moment to queue again (:meth:`GroupCommitter._gather`, the idea of
PostgreSQL's ``commit_delay``/``commit_siblings``): they are runnable but have not
yet had the interpreter, and a batch taken at once would leave them for one more
transaction -- one more fsync. It pauses :data:`GATHER_PAUSE` at a time until as
many requests are queued as the last batch held, or two pauses brought none; a
caller writing alone never pauses. Measured (16 producers following up one agent,
SQLite ``synchronous=FULL``): batches of 11.2 -> 15.3 of 16, 11.2-11.7k ->
13.1-15.3k acceptances/s.

A request may be *lazy* (:meth:`GroupCommitter.submit_many` with ``lazy``, a
function saying whether that still holds): nobody waits for it but its
submitter -- a runtime's write-behind of its turns, until a flush waits.
A batch of lazy requests alone, right after a batch that held an eager one,
first *lingers*: it waits, for at most as long as the last batch took to commit,
for an eager request to share its commit (:meth:`GroupCommitter._linger`). An
eager request, or :meth:`GroupCommitter.hurry` (called by whoever now waits for
the lazy write, after ``lazy`` says so), ends the wait at once. With follow-ups
accepted while their turns run, each turn's records otherwise took a commit of
their own between two acceptances: two fsyncs a message instead of one.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Final

from subagents.protocol import ErrorCode, SubagentError

from ._critical import critical
from ._native import native_lock

__all__ = ["GroupCommitter", "WriteRequest"]

#: Batches a leader writes in a row while more requests are queued (its own caller
#: waits for them: a bound on the latency that buys).
KEEP_LEADING = 4

#: One pause of a leader gathering the callers the last batch woke (seconds; the
#: kernel rounds it up to its timer slack, some 50 us on Linux).
GATHER_PAUSE: Final = 20e-6

#: The longest a batch of lazy requests lingers for an eager one (seconds): the
#: last commit's duration, up to this.
LINGER_MAX: Final = 0.002

_NO_OUTCOME = SubagentError("write request finished without an outcome", code=ErrorCode.INTERNAL)


class WriteRequest:
    """One queued write: ``op`` is applied by the executor inside a transaction."""

    __slots__ = ("_wake", "done", "error", "lazy", "lead", "op", "result")

    def __init__(self, op: Callable[[Any], Any], lazy: Callable[[], bool] | None = None) -> None:
        self.op = op
        self.lazy = lazy  # while lazy() holds, nobody waits for it (see the module)
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = False  # result or error is final
        self.lead = False
        # Acquired now, released by whoever finishes or promotes this request.
        self._wake = native_lock()
        self._wake.acquire()

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        """Record the outcome (called by the executor)."""
        self.result = result
        self.error = error
        self.done = True

    def outcome(self) -> Any:
        if not self.done:
            raise _NO_OUTCOME
        if self.error is not None:
            raise self.error
        return self.result


class GroupCommitter:
    """Coalesces concurrent :meth:`submit` calls into batches.

    Args:
        execute: applies a batch in one transaction and calls
            :meth:`WriteRequest.finish` on every request; if it raises, requests
            left unfinished get that exception.
        closed_error: builds the error for requests refused after :meth:`close`.
        pause: how a leader waits while it gathers a batch (``time.sleep``; it must
            let other threads run).
    """

    def __init__(
        self,
        execute: Callable[[list[WriteRequest]], None],
        closed_error: Callable[[], SubagentError],
        pause: Callable[[float], object] = time.sleep,
    ) -> None:
        self._execute = execute
        self._closed_error = closed_error
        self._pause = pause
        self._last = 0  # requests in the last batch (only the leader touches it)
        self._mu = native_lock()  # guards the fields below
        self._pending: list[WriteRequest] = []
        self._leading = False
        self._closed = False
        self._eager = 0  # eager requests among the pending
        self._lingering = False  # a leader waits on _nudge for an eager request
        # A hurry came while nobody lingered (a waiter of a batch another submitter
        # may lead): the next linger does not start.
        self._hurried = False
        # Locked but while a nudge is under way: released to end a linger.
        self._nudge = native_lock()
        self._nudge.acquire()
        # Only the leader touches these: whether the last batch held an eager
        # request, and how long its commit took (what a linger may wait).
        self._lately = False
        self._spent = 0.0
        # Held while a batch (or an exclusive job) runs; close() takes it to wait
        # for the batch in flight.
        self._exec = native_lock()

    @property
    def pending(self) -> int:
        """Requests queued and not yet taken by a leader."""
        return len(self._pending)

    def submit(self, op: Callable[[Any], Any]) -> Any:
        """Queue ``op``, wait until its batch committed, return its result."""
        (request,) = self.submit_many([op])
        return request.outcome()

    def submit_many(
        self, ops: list[Callable[[Any], Any]], *, lazy: Callable[[], bool] | None = None
    ) -> list[WriteRequest]:
        """Queue every op at once (so one batch takes them all), wait, return the
        finished requests: read each one's ``outcome()``. ``lazy``: while it returns
        True nobody else waits for them; whoever starts to calls :meth:`hurry`
        after ``lazy`` says so (see the module docstring). ``lazy`` must not raise."""
        requests = [WriteRequest(op, lazy) for op in ops]
        if not requests:
            return requests
        first = requests[0]
        nudge = False
        # A Ctrl-C between queueing and leading would strand every later writer.
        with critical():
            with self._mu:
                if self._closed:
                    raise self._closed_error()
                self._pending.extend(requests)  # atomically: a leader takes all or none
                if lazy is None:
                    self._eager += len(requests)
                    nudge, self._lingering = self._lingering, False
                lead = not self._leading
                self._leading = True
            if nudge:
                self._nudge.release()
            if not lead:
                first._wake.acquire()  # woken when the batch is done, or promoted to lead
                if not first.lead:
                    return requests
            self._lead(first)
        return requests

    def _lead(self, own: WriteRequest) -> None:
        rounds = KEEP_LEADING
        while True:
            if own.lazy is not None and not own.done:
                self._linger(own.lazy)  # (its own thread's time: see the finally below)
            self._gather()
            with self._mu:
                batch, self._pending = self._pending, []
                self._lately, self._eager = self._eager > 0, 0
            self._last = len(batch)
            raising = True
            try:
                try:
                    with self._exec:
                        if self._closed:
                            raise self._closed_error()
                        began = time.monotonic()
                        self._execute(batch)
                        self._spent = time.monotonic() - began
                except Exception as exc:
                    for request in batch:
                        if not request.done:
                            request.finish(error=exc)
                except BaseException:
                    for request in batch:
                        if not request.done:
                            request.finish(error=_NO_OUTCOME)
                    raise
                raising = False
            finally:
                rounds -= 1
                again = False
                successor: WriteRequest | None = None
                with self._mu:
                    if not self._pending:
                        self._leading = False
                    elif not raising and rounds > 0 and self._eager:
                        # Keep leading: this thread holds the interpreter now, while a
                        # woken successor would first queue behind every caller this
                        # batch woke. Not for lazy requests alone: their submitter
                        # leads them, lingering in its own thread, not this caller's.
                        again = True
                    else:
                        successor = self._pending[0]
                        successor.lead = True
                for request in batch:
                    if request is not own:
                        request._wake.release()
                if successor is not None:
                    successor._wake.release()
            if not again:
                return

    def _linger(self, lazy: Callable[[], bool]) -> None:
        """Hold a batch of lazy requests alone, after a batch with an eager one, for
        at most the last commit's duration: until an eager request or a
        :meth:`hurry` comes (see the module docstring)."""
        if not self._lately:
            return
        with self._mu:
            if self._eager or self._closed or self._hurried:
                self._hurried = False
                return
            self._lingering = True
        # Asked once lingering is set: a waiter that came before this read is seen
        # here, one that comes after sees the linger and hurries it.
        if lazy() and self._nudge.acquire(True, min(self._spent, LINGER_MAX)):
            return  # nudged (by whoever cleared _lingering): the lock is locked again
        with self._mu:  # timed out, or somebody waits already
            nudged = not self._lingering
            self._lingering = False
        if nudged:
            # A nudge is under way: take it, so that it does not end the next linger.
            self._nudge.acquire()

    def hurry(self) -> None:
        """Someone now waits for the lazy requests queued: a linger ends at once (the
        next one does not start, when none is under way: the waiter's batch may be
        led by another submitter, whose ``lazy`` does not know of it)."""
        # A Ctrl-C between the flag and the nudge would leave the leader waiting for
        # a nudge nobody sends, and every later writer behind it.
        with critical():
            with self._mu:
                nudge, self._lingering = self._lingering, False
                if not nudge:
                    self._hurried = True
            if nudge:
                self._nudge.release()

    def _gather(self) -> None:
        """Wait (a few pauses at most) for the callers of the last batch to queue again."""
        want = self._last
        if want < 2:
            return
        queued = len(self._pending)
        still = 0
        for _ in range(2 * want):
            if queued >= want:
                return
            self._pause(GATHER_PAUSE)
            now = len(self._pending)
            still = still + 1 if now == queued else 0
            if still == 2:
                return
            queued = now

    def exclusive(self, job: Callable[[], Any]) -> Any:
        """Run ``job`` while no batch is in flight (and none starts)."""
        with self._exec:
            if self._closed:
                raise self._closed_error()
            return job()

    def pause(self, timeout: float) -> bool:
        """Wait for the batch in flight, and let none start until :meth:`unpause`
        (a fork, see ``_forked.py``); False when it did not end in ``timeout``."""
        return self._exec.acquire(True, timeout)

    def unpause(self) -> None:
        self._exec.release()

    def forked(self) -> None:
        """In the child of a fork: refuse every request from now on (with the closed
        error), taking none of the copy's locks -- a thread of the parent may have
        held them as it forked, and it is not here to release them."""
        self._mu = native_lock()
        self._exec = native_lock()
        self._nudge = native_lock()
        self._nudge.acquire()
        self._pending = []
        self._leading = False
        self._lingering = self._hurried = False
        self._closed = True

    def close(self, finish: Callable[[], None]) -> None:
        """Refuse new requests, wait for the batch in flight, then run ``finish``.

        Requests still queued fail with the closed error when their turn to
        lead comes. Idempotent: ``finish`` runs on the first call only.
        """
        with self._mu:
            if self._closed:
                return
            self._closed = True
        self.hurry()  # a lingering batch goes now
        with self._exec:
            finish()
