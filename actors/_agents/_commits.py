"""Commits handed to one activation that are under way: its lease's release waits.

A follow-up to a resident continuable child is committed *taken* by the child's
activation, then admitted to it (``_children/_intake.accept_resident``). One that
finds the child retiring -- its gate closed between the commit and the admission
-- gives the message back to nobody (``give_back``) and routes it. (A top-level
agent's own follow-up, ``_followups._accept``, refused as the agent is disposed,
is taken back the same way.) Were the lease
released in between, the child's next activation could read the message still
taken by the retiring one, as one that may have run, and flag its first run a
redelivery.

So an activation counts the commits under way for it (:meth:`Commits.enter` /
:meth:`Commits.exit`), and its release first closes the count
(:meth:`Commits.close`): no commit for it begins after (the follow-up goes the
slow way, committed for nobody), and those begun -- given back or admitted by
then -- end before the lease is let go.
"""

from __future__ import annotations

import threading
from typing import Any

from subagents.actors._kernel import Backend

__all__ = ["Commits"]


class Commits:
    """The commits under way for one activation (see the module docstring)."""

    __slots__ = ("_backend", "_count", "_done", "_leaving", "_lock")

    def __init__(self, backend: Backend) -> None:
        # A native lock held for a few bytecodes, never across a call out.
        self._lock = threading.Lock()
        self._count = 0
        self._leaving = False
        self._backend = backend
        # Made only by a release that has commits to wait for: every resident
        # activation has one of these, and an event costs ~2 KiB on gevent.
        self._done: Any = None

    def enter(self) -> bool:
        """Begin a commit for this activation: False once its release began."""
        with self._lock:
            if self._leaving:
                return False
            self._count += 1
            return True

    def exit(self) -> None:
        """The commit that :meth:`enter` began is admitted or given back."""
        with self._lock:
            self._count -= 1
            done = self._done if self._leaving and not self._count else None
        if done is not None:
            done.set()

    def close(self, timeout: float) -> bool:
        """No commit begins from now on; wait for those under way (False: still
        one after ``timeout`` seconds)."""
        with self._lock:
            self._leaving = True
            if not self._count:
                return True
            if self._done is None:  # (made under the lock: the last exit sets it)
                self._done = self._backend.event()
            done = self._done
        return bool(done.wait(timeout))
