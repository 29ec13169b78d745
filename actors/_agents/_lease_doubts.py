"""Lease acquisitions in doubt: a lease that may be this holder's in the store
although no activation here holds it.

An acquisition whose connection was lost at its commit (``PERSISTENCE_UNAVAILABLE``
on PostgreSQL) may have committed all the same, its answer lost: the caller was
told it failed, yet the store may name this holder. Left so, this holder's
heartbeat -- renewed as long as it holds any other lease -- keeps that lease live
for as long as the process lives, and every other process is refused
``LEASE_HELD`` for good (a resume, a sweep adopting the session's work).

:class:`Doubts` remembers such sessions and settles them from the store: the lease
is read, and released by the token read when it is this holder's and no
acquisition here took the session since (held) or is under way. Read first and
checked after, so a later acquisition's lease -- a new epoch -- is never released
(the release compares the token). Settled at once when the store answers, else
by the renewal task every period, and at close.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Container, Iterator
from typing import Any

from subagents.protocol import SessionId, SubagentError
from subagents.store import SessionStore

__all__ = ["Doubts"]

logger = logging.getLogger("subagents")


class Doubts:
    """The acquisitions under way and those in doubt of one holder (thread-safe:
    ``lock`` is its :class:`~._leases.Leases`' lock, ``held`` the sessions it holds,
    read under it)."""

    def __init__(
        self,
        store: SessionStore,
        holder: str,
        call: Callable[..., Any],
        lock: threading.Lock,
        held: Container[SessionId],
    ) -> None:
        self._store = store
        self._holder = holder
        self._call = call
        self._lock = lock
        self._held = held
        self._acquiring: dict[SessionId, int] = {}  # session -> acquisitions under way
        self._doubted: set[SessionId] = set()

    def __bool__(self) -> bool:
        return bool(self._doubted)

    @contextlib.contextmanager
    def acquiring(self, session_id: SessionId) -> Iterator[None]:
        """Counts an acquisition of ``session_id`` under way while it runs."""
        with self._lock:
            self._acquiring[session_id] = self._acquiring.get(session_id, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                left = self._acquiring.pop(session_id) - 1
                if left:
                    self._acquiring[session_id] = left

    def add(self, session_id: SessionId) -> None:
        """An acquisition of ``session_id`` that may have committed (call it once the
        acquisition is no longer under way)."""
        with self._lock:
            self._doubted.add(session_id)

    def discard(self, session_id: SessionId) -> None:
        """``session_id`` is held now (under the lock's caller): nothing to settle."""
        self._doubted.discard(session_id)

    def settle(self) -> None:
        """Release each lease in doubt that is this holder's and held by nobody here;
        one the store cannot answer for stays for the next call."""
        with self._lock:
            doubted = list(self._doubted)
        for sid in doubted:
            try:
                lease = self._call(self._store.get_lease, sid)
            except SubagentError:
                continue
            with self._lock:
                if sid in self._acquiring:
                    continue  # its outcome settles it
                if sid in self._held or lease is None or lease.holder != self._holder:
                    self._doubted.discard(sid)  # held, not committed, or taken since
                    continue
            try:
                # A lost answer here: NOT_HELD next time, settled then.
                self._call(self._store.release_lease, sid, lease.token())
            except SubagentError:
                continue
            except Exception:  # not the store's typed error: the others still go
                logger.exception("releasing the lease in doubt of %s failed (retried)", sid)
                continue
            with self._lock:
                self._doubted.discard(sid)
