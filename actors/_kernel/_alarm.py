"""An alarm: call back once the earliest requested deadline has passed.

The supervisor holds keep-warm deadlines but never blocks; it asks an
:class:`Alarm` to wake it. One task (a thread, or a greenlet of the runtime's hub)
is started on the first request and sleeps until the earliest deadline, then
calls ``fire`` -- which only posts a notice, so the deadlines themselves stay the
supervisor's. Deadlines are in ``clock()`` units (``time.monotonic`` by default).

The task is the runtime's only one of its kind: a round that raises (``fire`` or
``clock`` failing) is logged, its deadline stays pending, and the task tries
again after a bounded backoff -- ended by the failure, no keep-warm child of the
runtime would ever settle again.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from . import _fork
from ._backend import Backend, EventLike, TaskHandle

__all__ = ["Alarm"]

logger = logging.getLogger("subagents")

#: The pauses after rounds that failed in a row: from the first to the longest (s).
_BACKOFF = (0.05, 1.0)


class Alarm:
    """Calls ``fire()`` once the earliest deadline given to :meth:`at` has passed."""

    def __init__(
        self,
        backend: Backend,
        fire: Callable[[], object],
        *,
        clock: Callable[[], float] = time.monotonic,
        name: str = "subagents-alarm",
    ) -> None:
        # A fork before this runs its first round: the child's copy still abandons.
        self._born = _fork.generation
        self._backend = backend
        self._fire = fire
        self._clock = clock
        self._name = name
        self._lock = threading.Lock()  # never held across a call out or a switch
        self._next = math.inf
        self._closed = False
        self._task: TaskHandle | None = None
        self._wake: EventLike = backend.event()

    def at(self, deadline: float) -> None:
        """Fire once ``deadline`` has passed (an earlier pending one still fires first)."""
        if deadline == math.inf:
            return
        with self._lock:
            if self._closed or deadline >= self._next:
                return
            self._next = deadline
            if self._task is None:
                self._task = self._backend.spawn(self._run, name=self._name)
                return
        self._wake.set()

    def _run(self) -> None:
        failures = 0
        while True:
            _fork.abandon_if_forked(self._born)
            try:
                if not self._round():
                    return
                failures = 0
            except Exception:
                logger.exception("the alarm %s failed; trying again", self._name)
                pause = min(_BACKOFF[1], _BACKOFF[0] * 2**failures)
                failures = min(failures + 1, 8)  # (past the longest pause: no bigger powers)
                self._wake.wait(pause)  # (close() wakes it)
                self._wake.clear()

    def _round(self) -> bool:
        """Fire if the earliest deadline passed, else wait for it (or a wake-up);
        False once closed. A fire that raises leaves its deadline pending."""
        with self._lock:
            if self._closed:
                return False
            due = self._next
            left = due - self._clock()
            if left <= 0:
                self._next = math.inf
        if left <= 0:
            try:
                self._fire()
            except BaseException:
                with self._lock:
                    self._next = min(self._next, due)
                raise
            return True
        self._wake.wait(None if left == math.inf else left)
        self._wake.clear()
        return True

    def close(self, timeout: float | None = 30.0) -> None:
        """Stop the task (a pending deadline never fires)."""
        with self._lock:
            self._closed = True
            task = self._task
        self._wake.set()
        if task is not None:
            task.join(timeout)
