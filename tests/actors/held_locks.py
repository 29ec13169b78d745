"""Catch a plain lock held across a greenlet switch (the gevent backend, unpatched).

Without monkey-patching a ``threading.Lock`` is an OS lock: a greenlet that holds
one while it yields to the hub (a blocking store call run in the threadpool, a
wait on an event or a future, an actor's stop) stops the whole thread as soon as
another greenlet of it asks for the same lock -- the acquire blocks the thread, so
the hub never runs the holder again. Whether a second greenlet happens to ask
during that window is timing; the hold itself is not.

:class:`HeldLockWatch` makes every ``threading.Lock()`` created while it is
installed a tracked lock that remembers the greenlet owning it (blocking
acquires only: a lock only ever *tried* excludes nobody who could wait), and a
``greenlet.settrace`` hook that records, at every switch away from a greenlet of
this thread, the creation sites of the tracked locks that greenlet holds.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import greenlet
from subagents.actors._kernel._gevent import native_allocate_lock

__all__ = ["HeldLockWatch"]


class _TrackedLock:
    """A native lock that records its owning greenlet (see the module docstring)."""

    __slots__ = ("_lock", "_owned", "_owner", "site")

    def __init__(self, owned: dict[Any, list[_TrackedLock]], site: str) -> None:
        self._lock = native_allocate_lock()
        self._owned = owned
        self._owner: Any = None
        self.site = site

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        got = bool(self._lock.acquire(blocking, timeout))
        if got and blocking:
            owner = self._owner = greenlet.getcurrent()
            self._owned.setdefault(owner, []).append(self)
        return got

    def release(self) -> None:
        owner, self._owner = self._owner, None
        if owner is not None:
            held = self._owned.get(owner)
            if held is not None and self in held:
                held.remove(self)
                if not held:
                    del self._owned[owner]
        self._lock.release()

    def locked(self) -> bool:
        return bool(self._lock.locked())

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _at_fork_reinit(self) -> None:
        self._lock = native_allocate_lock()
        self._owner = None


class HeldLockWatch:
    """Use as a context manager around the code to watch; ``held`` lists the sites
    of the locks some greenlet held as it switched away (once per site)."""

    def __init__(self) -> None:
        self.held: list[str] = []
        self.switches = 0
        self._owned: dict[Any, list[_TrackedLock]] = {}
        self._original: Any = None
        self._previous: Any = None

    def _make(self) -> _TrackedLock:
        frame = sys._getframe(1)
        site = f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_qualname})"
        return _TrackedLock(self._owned, site)

    def __call__(self, event: str, args: Any) -> None:
        if event in ("switch", "throw"):
            self.switches += 1
            for lock in self._owned.get(args[0], ()):
                if lock.site not in self.held:
                    self.held.append(lock.site)
        if self._previous is not None:
            self._previous(event, args)

    def __enter__(self) -> HeldLockWatch:
        self._original = threading.Lock
        threading.Lock = self._make  # type: ignore[assignment]
        self._previous = greenlet.settrace(self)
        return self

    def __exit__(self, *exc: object) -> None:
        greenlet.settrace(self._previous)
        threading.Lock = self._original
