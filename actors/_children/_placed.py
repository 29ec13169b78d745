"""Continuable children placed on another host: the parent's stand-in for them.

A provider with a ``placement`` attribute (a :class:`Placement`, such as
:class:`subagents.actors.ray.RayPlacement`) does not run its continuable
children here. The durable session, the lease and the inbox stay in the shared
store; the placement only decides *where* an Activation runs: on a host, a
process with a runtime of its own on the same store, which takes the child's
lease and runs what waits in its durable inbox.

The parent keeps ownership, supervision and child-first release. The child is
an Activation in this process's registry like any other -- owned by its parent,
routed, cut off by drains, settled by the supervisor -- whose agent is a
:class:`PlacedChild`: it has the gate and the quiescence an Agent has, and its
"turns" are calls to the host. Every message admitted to it is already committed
to the child's durable inbox (placement needs strict durability), so a call only
says "run what waits, and answer when you are idle". Settling asks the host to
release the child (its lease goes back to the store), and only then is the
Activation released, so a parent settles strictly after its placed children.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from subagents.actors._kernel import Backend
from subagents.actors._kernel._checks import check_listener
from subagents.actors._kernel._listeners import hear
from subagents.protocol import (
    ErrorCode,
    MessageId,
    MessageSource,
    SessionHeader,
    SessionId,
    SubagentError,
)

__all__ = ["PlacedChild", "Placement"]

logger = logging.getLogger("subagents")

_OPEN, _DRAINED, _CLOSED = 0, 1, 2
_JOIN = 30.0  # seconds a release waits for the child's last run to return
#: Numbers the runs and releases asked of hosts, in the order they were asked: a
#: host, which may carry out concurrent calls in any order, ignores a run asked
#: before a release it already carried out (the child would stay held there).
_CALLS = itertools.count(1)


class Placement(Protocol):
    """Where continuable children run: the calls a :class:`PlacedChild` makes.

    Each call blocks its caller (a task of this runtime's backend) and raises
    :class:`SubagentError` when no host could do it.
    """

    def run(
        self, child_id: SessionId, call: int | None = None, wake: Sequence[SessionId] = ()
    ) -> None:
        """Have a host hold ``child_id`` (activating it from the store if no host
        does) and run what waits in its durable inbox -- and what waits for
        ``wake``, sessions below it, woken there; return once it is idle there and
        owns no resident child. ``call`` orders it against releases."""

    def settle(self, child_id: SessionId, call: int | None = None) -> bool:
        """Release ``child_id`` on its host if it is idle there (True); False when
        it is busy again (a report of its own children woke it). Numbered
        ``call``, it orders as a release: a run of a lower one carried out after
        it (a run the parent stopped waiting for) does nothing."""

    def cancel(
        self, child_id: SessionId, cause: str, keep_inbox: bool, call: int | None = None
    ) -> None:
        """Cancel its running turn (``keep_inbox=False``: and what waits; numbered
        ``call``, a run of a lower one carried out after it drops what waits too,
        wherever it goes)."""

    def interrupt(self, child_id: SessionId, kind: str, by: SessionId | None) -> None:
        """Cancel its running turn, keeping its inbox, and log the interrupt."""

    def release(self, child_id: SessionId, cause: str, call: int | None = None) -> None:
        """Cancel it (what it accepted stays accepted), release its resident
        children, then the child itself: its lease goes back to the store. A run
        of a lower ``call`` arriving after it does nothing."""

    def forget(self, child_id: SessionId) -> None:
        """Nothing more is asked for ``child_id`` by this stand-in (it settled or
        was released, and no run of its is in flight here): what is kept of it
        may go. The next stand-in's calls are numbered above all of this one's."""


class PlacedChild:
    """The Activation's agent for a child placed on a host (see the module docstring).

    It offers what the registry, the supervisor and the continuation manager use
    of an Agent: the header, the gate (``admit_followup``, ``close_admission``,
    ``close_if_idle``), quiescence (``idle``, ``idle_since``, idle listeners),
    ``cancel``, ``interrupt`` and ``dispose``.
    """

    def __init__(self, header: SessionHeader, placement: Placement, backend: Backend) -> None:
        self._header = header
        self._placement = placement
        self._backend = backend
        self._lock = threading.Lock()
        self._gate = _OPEN
        self._accepted = 0  # admitted so far (monotone)
        self._done = 0  # admitted messages a finished run covered
        self._dropped = 0  # admitted messages a cancel dropping what waits covered
        self._running = False
        self._started = False
        self._asked = False  # a run was numbered: the host it goes to takes what waits
        self._owed: int | None = None  # a run a cancel owes, numbered below it (see cancel)
        self._disposed = False
        self._released = False  # release() asked: no run is asked after it
        self._noticed = False  # the last notice ran: the child is settled or released
        self._parties = 0  # a settling and a release in flight: the last one gives it
        self._idle_listeners: list[Callable[[Any], object]] = []
        self._dispose_listeners: list[Callable[[Any], object]] = []
        self.idle_since = time.monotonic()
        self.error: BaseException | None = None  # the last failed run's error
        self._below: set[SessionId] = set()  # sessions below it the next run wakes
        self._task: Any = None  # the task making runs, while there is one
        self._settling: Any = None  # the task settling it, once disposed

    def __repr__(self) -> str:
        return f"<PlacedChild {self.session_id}>"

    # -- identity --------------------------------------------------------------------

    @property
    def session_id(self) -> SessionId:
        return self._header.id

    @property
    def header(self) -> SessionHeader:
        return self._header

    @property
    def parent_session(self) -> SessionId | None:
        return self._header.parent_session

    @property
    def label(self) -> str | None:
        return self._header.label

    @property
    def disposed(self) -> bool:
        return self._disposed

    # -- the gate --------------------------------------------------------------------

    def deliver(
        self,
        content: Any,
        source: MessageSource | None,
        *,
        message_id: MessageId | None = None,
        drop: bool = False,
        redelivered: Any = False,
        **_: Any,
    ) -> None:
        """The first message of an epoch (already in the durable inbox). ``drop``
        (published below a drain cutoff): not run; the drain's cancel that follows
        the publication has a host drop it (see :meth:`cancel`)."""
        with self._lock:
            if self._gate == _CLOSED or self._disposed:
                raise SubagentError(
                    f"agent {self.session_id} is disposed", code=ErrorCode.AGENT_DISPOSED
                )
            if drop:
                return
            self._accepted += 1
        self._kick()

    def admit_followup(
        self,
        content: Any,
        source: MessageSource,
        message_id: MessageId,
        untaken: bool = False,
        limit: int | None = None,
    ) -> bool:
        """A follow-up committed to the durable inbox: admitted (True), or the
        child is retiring (False). ``ADMISSION_CLOSED`` below a drain cutoff.
        (``limit``: the store counted it when it was committed.)"""
        with self._lock:
            if self._gate != _OPEN or self._disposed:
                if self._gate == _DRAINED and not self._disposed:
                    raise SubagentError(
                        "admission is closed below this parent (drained)",
                        code=ErrorCode.ADMISSION_CLOSED,
                    )
                return False
            self._accepted += 1
        self._kick()
        return True

    def close_admission(self) -> None:
        with self._lock:
            if self._gate == _OPEN:
                self._gate = _DRAINED

    def close_if_idle(self) -> bool:
        """Close the gate for good if nothing is in flight (True). Not before its
        start: published, it has what waits in its durable inbox to run (or, drained,
        to drop) -- whoever published it starts it."""
        with self._lock:
            if self._accepted != self._done or self._running or not self._started:
                return False
            self._gate = _CLOSED
            return True

    @property
    def idle(self) -> bool:
        return self._accepted == self._done and not self._running

    def add_idle_listener(self, fn: Callable[[Any], object]) -> Callable[[], None]:
        check_listener(fn)
        self._idle_listeners.append(fn)
        return lambda: self._idle_listeners.remove(fn) if fn in self._idle_listeners else None

    def add_dispose_listener(self, fn: Callable[[Any], object]) -> None:
        check_listener(fn)
        self._dispose_listeners.append(fn)

    # -- runs ------------------------------------------------------------------------

    def wake(self) -> None:
        """Something waits in the durable inbox (committed by another process):
        one more run, unless it is retiring."""
        self.wake_below(None)

    def wake_below(self, session_id: SessionId | None) -> bool:
        """Something waits for ``session_id``, a session below this child (a
        grandchild; ``None``: for the child itself): one more run, whose host wakes
        it there. False when it is retiring (nothing asked)."""
        with self._lock:
            if self._gate == _CLOSED or self._disposed or not self._started:
                return False
            if session_id is not None:
                self._below.add(session_id)
            self._accepted += 1
        self._kick()
        return True

    def start(self) -> None:
        """Begin running (after publication, once nobody here holds the lease):
        one run for what already waits in the durable inbox -- drained, the run a
        drain's cancel owes, which drops it. Nothing once released."""
        with self._lock:
            if self._disposed:
                return
            self._started = True
            self._accepted += 1  # what waits: activations find it there
        self._kick()

    def _kick(self) -> None:
        with self._lock:
            if (
                self._running
                or not self._started
                or self._disposed  # released (or settled) meanwhile: nothing more
                or self._accepted == self._done
            ):
                return
            self._running = True
        self._task = self._backend.spawn(self._runs, name=f"subagents-placed-{self.session_id}")

    def _run_call(self) -> int | None:
        """The number of the next run to ask (under the lock); None once released:
        no run is asked after a release."""
        return None if self._released else next(_CALLS)

    def _runs(self) -> None:
        while True:
            with self._lock:
                target = self._accepted
                # What a cancel dropped is asked of no host (a drained gate), but
                # for the run it owes (numbered below it: the host drops what waits).
                if self._owed is not None:
                    call = None if self._released else self._owed
                else:
                    call = 0 if target <= self._dropped else self._run_call()
                self._owed = None
                if call is None:
                    self._running = False
                    return
                self._asked = self._asked or call > 0
                below = tuple(self._below)
                self._below.clear()
            try:
                if call:
                    self._backend.run_waiting(self._placement.run, self.session_id, call, below)
                self.error = None
            except BaseException as exc:  # the messages stay accepted, in the store
                self.error = exc
                logger.warning("placed child %s: %r", self.session_id, exc)
            with self._lock:
                self._done = max(self._done, target)
                if self._accepted != self._done:
                    continue
                self._running = False
                self.idle_since = time.monotonic()
            self._notify(self._idle_listeners, "idle")
            return

    # -- cancellation, interrupt, release -------------------------------------------

    def cancel(
        self, cause: Any = None, *, keep_inbox: bool = True, keep_accepted: bool = False
    ) -> None:
        """Cancel the running turn on the host (``keep_inbox=False``: and what waits --
        there, and in a run asked before this one, wherever it is carried out;
        nor is a run asked for what was admitted before it). Dropping what waits
        before any run was asked (no host took the child's durable inbox): one run,
        numbered below this cancel, has a host take it and drop it, as a local
        child's drain does."""
        call = None
        if not keep_inbox and not keep_accepted:
            with self._lock:
                if not self._asked and self._owed is None and not self._disposed:
                    self._owed = next(_CALLS)
                    self._accepted += 1
                call = next(_CALLS)
                self._dropped = self._accepted
        try:
            self._backend.run_waiting(
                self._placement.cancel,
                self.session_id,
                str(cause or "cancelled"),
                keep_inbox,
                call,
            )
        except SubagentError as exc:
            logger.warning("cancelling placed child %s: %s", self.session_id, exc)
        self._kick()  # (the run it owes; before its start, the start asks it)

    def interrupt(self, kind: str, by: SessionId | None) -> None:
        """An authorized interrupt: the host cancels the turn and logs it."""
        self._backend.run_waiting(self._placement.interrupt, self.session_id, kind, by)

    def dispose(self, *, wait: bool = True, checkpoint: bool = False, **_: Any) -> None:
        """Settle: the host releases the child once it is idle there; then the
        dispose listeners run (the supervisor's release)."""
        with self._lock:
            if self._disposed:
                return
            self._disposed = True
            self._gate = _CLOSED
            self._parties += 1
        task = self._backend.spawn(self._settle, name=f"subagents-placed-{self.session_id}")
        self._settling = task
        if wait:
            task.join(None)

    def _settle(self) -> None:
        try:
            while not self._backend.run_waiting(
                self._placement.settle, self.session_id, next(_CALLS)
            ):
                with self._lock:
                    call = self._run_call()
                if call is None:
                    break
                self._backend.run_waiting(self._placement.run, self.session_id, call)
        except BaseException as exc:  # its lease expires; whoever runs it next replays
            logger.warning("releasing placed child %s: %r", self.session_id, exc)
        self._last_notice()

    def release(self, cause: str) -> None:
        """Release it now (the runtime closes): cancelled, accepted work kept; its
        runs and a settling in flight return, and are waited for."""
        with self._lock:
            if self._noticed:  # settled: its host let it go, and its placement forgot it
                return
            self._parties += 1
            self._disposed = True
            self._released = True
            self._gate = _CLOSED
            call = next(_CALLS)
        try:
            self._backend.run_waiting(self._placement.release, self.session_id, cause, call)
        except BaseException as exc:
            logger.warning("releasing placed child %s: %r", self.session_id, exc)
        for task in (self._task, self._settling):
            if task is not None:  # it returns now that the host let the child go
                task.join(_JOIN)
        self._last_notice()  # (or the settling, if it is still at its host)

    def _last_notice(self) -> None:
        """By the last of a settling and a release to return (it made the last call
        to the placement): have the placement forget the child -- unless a run of
        it is still in flight -- then run the dispose listeners, heard for the
        last time, and drop them and the idle ones (a listener closing over what
        holds this child -- its activation -- would otherwise keep both for the
        cycle collector). Forgotten before the listeners: they release the
        Activation, and the next stand-in's calls must not be forgotten."""
        with self._lock:
            self._parties -= 1
            if self._parties > 0:
                return
            self._noticed = True
            running = self._running
        forget = getattr(self._placement, "forget", None)
        if not running and forget is not None:
            try:
                self._backend.run_waiting(forget, self.session_id)
            except Exception as exc:  # what it keeps stays: a leak, never a wrong answer
                logger.warning("forgetting placed child %s: %r", self.session_id, exc)
        self._notify(self._dispose_listeners, "dispose")
        self._idle_listeners.clear()
        self._dispose_listeners.clear()

    def _notify(self, listeners: list[Callable[[Any], object]], kind: str) -> None:
        for fn in list(listeners):
            hear(fn, self, f"{kind} listener")
