"""The clock a runtime's leases are measured by: its store's.

A lease's expiry is written by its holder and compared by its contenders, so both
must read one clock. Every process on an SQLite file runs on one host and reads
that host's wall clock, as the store's ``clock()`` does, at every call. On a
server store (PostgreSQL) each host's wall clock may be off by any amount -- a
contender an hour ahead took live holders' sessions over, a holder an hour behind
wrote leases expired an hour ago, one an hour ahead held its leases an hour past
its death -- so the server's clock is read instead: once a ``period`` (a round
trip), advanced in between by this process's monotonic clock, which no step of
the host's wall clock (NTP, a VM resumed with a stale clock) moves.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from subagents.protocol import SubagentError

__all__ = ["LeaseClock"]

logger = logging.getLogger("subagents")


class LeaseClock:
    """Wall-clock seconds by the store's clock (see the module docstring).

    Calling it never does I/O: it is read under the runtime's own locks.
    :meth:`refresh` reads the server's clock when the last reading is ``period``
    old (or none was taken); call it where a store call is made anyway. Until the
    server first answered, this host's clock stands in (a store that cannot answer
    takes no lease either)."""

    def __init__(
        self, store: Any, call: Callable[..., Any], period: float, *, initial: bool = True
    ) -> None:
        remote = getattr(store, "remote_clock", False) is True
        self._read: Callable[[], float] | None = store.clock if remote else None
        self._call = call
        self._period = period
        self._lock = threading.Lock()  # held for two assignments, never across a call
        self._anchor: float | None = None  # the server's clock at monotonic ``_at``
        self._at = 0.0
        self._error = 0.0  # half the round trip of the reading ``_anchor`` came from
        self._tried = -float("inf")  # monotonic: the last reading asked, answered or not
        if initial:
            self.refresh()

    def __call__(self) -> float:
        if self._read is None:
            return time.time()
        with self._lock:
            anchor, at = self._anchor, self._at
        if anchor is None:
            return time.time()
        return anchor + (time.monotonic() - at)

    @property
    def error(self) -> float:
        """How far :meth:`__call__` may be off the store's clock, in seconds: half the
        round trip of the reading it extrapolates (a loaded host's thread may take
        the answer late); 0.0 where this host's clock is the store's."""
        if self._read is None:
            return 0.0
        with self._lock:
            return self._error if self._anchor is not None else 0.0

    def refresh(self) -> None:
        """Read the server's clock again if the last reading is a period old: a
        failed reading waits a period too (the extrapolation goes on)."""
        read = self._read
        if read is None or time.monotonic() - self._tried < self._period:
            return
        before = time.monotonic()
        self._tried = before
        try:
            server = float(self._call(read))
        except Exception as exc:  # the extrapolation goes on: a lease's clock never fails a call
            # (A typed store error -- an outage -- says what it is: no traceback.)
            typed = isinstance(exc, SubagentError)
            logger.warning("could not read the store's clock: %s", exc, exc_info=not typed)
            return
        after = time.monotonic()
        with self._lock:  # the reading was taken somewhere in the round trip: its middle
            self._anchor, self._at = server, (before + after) / 2
            self._error = (after - before) / 2
