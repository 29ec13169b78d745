"""Stores across ``fork()``: the child's copy of a store belongs to the parent.

A child process (gunicorn ``--preload``, multiprocessing's fork start method)
holds a copy of every store its parent had open -- and of their connections,
which are the parent's: a PostgreSQL connection is a socket the parent still
talks on, an SQLite connection believes it holds locks only the parent holds.
So, in the child, right after the fork:

* every call on a store opened before it raises ``WRONG_PROCESS`` (its
  ``close()`` returns and does nothing): open the store again in the child;
* the copy's PostgreSQL connections are never used or closed there: closing
  one sends the server a goodbye on the socket the parent shares, ending the
  parent's session (psycopg itself ends a connection it frees only in the
  process that made it);
* the copy's SQLite connections are closed there, and no thread of the parent's
  was inside one as it forked (see :class:`ForkGate`): SQLite keeps one record
  per open file and process of the locks its connections hold, so a connection
  the child opens to the same file shares the copy's -- one left open in the
  middle of a statement makes the child's own wait for a lock nobody will free.
  Closing releases nothing of the parent's (POSIX locks are per process) and
  checkpoints nothing while the parent has the file open. A store still in use
  when the fork's wait ran out keeps its copy open and unused (:func:`never_free`).

:func:`track` registers a store (or a listener) at its opening; its
``_forked()`` runs in the child, taking no lock (the threads that held the
copy's locks are gone), and ``_quiesce()``/``_resume()`` -- where it has them --
around every fork in the parent.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
import weakref
from typing import Any, Final, Protocol

from subagents.protocol import WrongProcessError

from ._native import native_lock, original_sleep

__all__ = ["ForkGate", "inherited_error", "never_free", "track"]

logger = logging.getLogger("subagents")

#: How long a fork waits for the statements in flight of one store (seconds). Any
#: fork waits (``subprocess`` with ``preexec_fn`` too), so it is short: a write
#: waiting for another process's lock may take the store's busy timeout, and then
#: the child keeps the copy's connections open instead (:func:`never_free`).
QUIESCE_TIMEOUT: Final = 2.0
_sleep = original_sleep()  # the hook must not yield to a hub: it holds native locks


class ForkGate:
    """Counts the calls inside a store's connections, so that a fork can wait
    until none is (and let none start) -- ``with gate:`` around each use.

    Two native locks, no condition: a fork is rare, and its wait polls.
    """

    __slots__ = ("_count", "_entry", "_using")

    def __init__(self) -> None:
        self._entry = native_lock()  # held by a fork from its wait to its end
        self._count = native_lock()
        self._using = 0

    def __enter__(self) -> None:
        with self._entry, self._count:
            self._using += 1

    def __exit__(self, *exc: object) -> None:
        with self._count:
            self._using -= 1

    def close(self, timeout: float) -> bool:
        """Let no use start, and wait until none is in flight; False after
        ``timeout`` (the gate is closed all the same: :meth:`open` it)."""
        self._entry.acquire()
        deadline = time.monotonic() + timeout
        while self._using and time.monotonic() < deadline:
            _sleep(0.001)
        return not self._using

    def open(self) -> None:
        self._entry.release()


class _Forkable(Protocol):
    def _forked(self) -> None: ...


_open: weakref.WeakSet[Any] = weakref.WeakSet()


def track(obj: _Forkable) -> None:
    """Call ``obj._forked()`` in the child of every later fork."""
    _open.add(obj)


def never_free(*objs: object) -> None:
    """Never free ``objs`` in this process, not even at interpreter exit (when
    module globals are cleared): a connection freed in the child of a fork
    would close what its parent uses."""
    for obj in objs:
        if obj is not None:
            ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))


def inherited_error(what: str, pid: int) -> WrongProcessError:
    """``WRONG_PROCESS``: ``what`` was opened by process ``pid``, before a fork."""
    return WrongProcessError(what, pid, "open a store (or make a Runtime) of its own here")


_quiesced: list[Any] = []  # the stores a fork in progress holds still
# One fork at a time quiesces the stores: two threads forking at once would pause
# the same store twice, and each resume what the other paused.
_forking = native_lock()


def _before_fork() -> None:
    _forking.acquire()
    _quiesced[:] = [obj for obj in list(_open) if hasattr(obj, "_quiesce")]
    for obj in _quiesced:
        if not obj._quiesce(QUIESCE_TIMEOUT):
            logger.warning("%r was still in use after %s s as the process forked", obj,
                           QUIESCE_TIMEOUT)  # fmt: skip


def _after_fork_in_parent() -> None:
    held, _quiesced[:] = list(_quiesced), []
    try:
        for obj in held:
            obj._resume()
    finally:
        _forking.release()


def _after_fork_in_child() -> None:
    global _open, _forking
    _forking = native_lock()  # the copy is held (by this fork)
    _quiesced.clear()
    inherited, _open = list(_open), weakref.WeakSet()
    for obj in inherited:
        obj._forked()


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)
