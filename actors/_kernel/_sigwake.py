"""A signal caught by any thread wakes the main thread's gevent hub at once.

The kernel hands a process's signal to any one of its threads that does not block
it, and CPython's C-level handler, run by that thread, only marks the signal
pending: the Python handler (``KeyboardInterrupt`` for Ctrl-C) runs in the main
thread, the next time that thread runs bytecode. A main thread waiting on a gevent
runtime -- ``wait_idle``, ``close``, a future's ``get`` -- is parked in its hub,
in libev's ``epoll_wait``, and runs no bytecode until the hub's next timer: the
lease renewal, up to 10 s later, or libev's cap of about a minute. So a Ctrl-C
that landed on a thread of somebody else's (a library's, gevent's threadpool
worker) was raised that late.

:func:`watch_signals` sets the C handler's wakeup fd (``signal.set_wakeup_fd``)
to the write end of a pipe whose read end the main thread's hub watches: the
handler writes the signal's number there, from whichever thread runs it, the hub
wakes, and the drain that reads it is bytecode -- Python runs the pending handlers
right there, in the hub greenlet (``_exit.deliver_interrupt`` then throws the
``KeyboardInterrupt`` into the main greenlet, where the script waits). Nothing
polls: an idle hub sleeps exactly as long as before, and the watcher holds no
reference on the loop (``gevent.wait()`` still returns).

* Only from the main thread (the only one that may set a wakeup fd), and only for
  runtimes that wait in that thread's hub (gevent, or any backend under
  monkey-patching); elsewhere nothing changes.
* One pipe per process, shared by every open runtime; the last one closed stops
  watching and puts back the wakeup fd it found.
* A wakeup fd set before (asyncio's, the program's own) is chained: the bytes
  read are written on to it -- when this hub runs, so a loop of somebody else's
  running in the main thread meanwhile gets them when this hub next runs. One set
  after ours is left in place at the close, and our pipe then stays open (its
  owner may forward to it; a closed number could be reused by another file).
* In the child of a fork, the pipe is the parent's: the child stops watching it,
  puts back the wakeup fd the parent found, and closes its copies; a runtime the
  child makes sets up a pipe of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import weakref
from typing import Any

import gevent

from . import _fork  # noqa: F401 -- its fork hook (gevent.reinit) must run before ours

__all__ = ["unwatch_signals", "watch_signals"]

# One read drains this much; more pending bytes (a signal storm) wake the hub again.
_CHUNK = 512


class _Waker:
    """The pipe, its watcher in the main thread's hub, and the wakeup fd it replaced."""

    def __init__(self) -> None:
        self._read, self._write = os.pipe()  # not inherited by exec'd children
        try:
            os.set_blocking(self._read, False)
            # The C handler must never block: a full pipe means the hub wakes anyway.
            os.set_blocking(self._write, False)
            self.previous: int = signal.set_wakeup_fd(self._write, warn_on_full_buffer=False)
        except BaseException:
            os.close(self._read)
            os.close(self._write)
            raise
        self._watcher: Any = gevent.get_hub().loop.io(self._read, 1)  # 1: readable
        self._watcher.ref = False  # a wake-up source, not work: the loop may still end
        self._watcher.start(self._drain)

    def _drain(self) -> None:
        # Runs in the hub, in the main thread; the pending Python handlers ran on
        # entry here. One that raised (Python's own KeyboardInterrupt) left the
        # bytes unread: the level-triggered watcher comes back for them.
        try:
            data = os.read(self._read, _CHUNK)
        except OSError:  # EAGAIN: another wake-up read them already
            return
        if data and self.previous >= 0:
            # Chained: the owner of the wakeup fd we replaced hears of the signals too.
            with contextlib.suppress(OSError):
                os.write(self.previous, data)

    def close(self, *, forked: bool = False) -> None:
        """Stop watching, put the replaced wakeup fd back and close the pipe -- the
        pipe only if the wakeup fd was still ours. Main thread only."""
        with contextlib.suppress(Exception):  # a hub destroyed since: nothing to stop
            self._watcher.stop()
            self._watcher.close()
        try:
            current = signal.set_wakeup_fd(self.previous)
        except (ValueError, OSError):  # the replaced one was closed since: none then
            self.previous = -1
            current = signal.set_wakeup_fd(-1)
        if current != self._write:
            signal.set_wakeup_fd(current)  # set after ours: it stays, and our pipe open
            return
        if not forked:
            self._drain()  # what is left still reaches the chained wakeup fd
        os.close(self._read)
        os.close(self._write)


_lock = threading.Lock()
_waker: _Waker | None = None
#: The open runtimes that asked for the waker (weakly: one never closed and since
#: collected no longer counts).
_owners: weakref.WeakSet[Any] = weakref.WeakSet()


def watch_signals(owner: object) -> None:
    """While ``owner`` (a runtime) is open, a signal caught by any thread wakes the
    main thread's hub (see the module docstring). Call it from the thread that made
    ``owner``: anywhere but the main thread, and off POSIX (where a wakeup fd must be
    a socket), it does nothing. Idempotent per owner."""
    global _waker
    if os.name != "posix" or threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        if _waker is None:
            try:
                _waker = _Waker()
            except (ValueError, OSError):  # not the main interpreter; out of fds
                return
        _owners.add(owner)


def unwatch_signals(owner: object) -> None:
    """``owner`` closed: the last open one stops the watching (from the main thread;
    elsewhere the waker stays, idle, for a later close there)."""
    global _waker
    if threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        _owners.discard(owner)
        if _owners or _waker is None:
            return
        waker, _waker = _waker, None
    with contextlib.suppress(ValueError, OSError):
        waker.close()


def _forget_in_child() -> None:
    """After a fork, in the child: the pipe is the parent's (see the module docstring)."""
    global _waker, _lock, _owners
    waker, _waker = _waker, None
    _lock = threading.Lock()  # a thread of the parent's may have held it as it forked
    _owners = weakref.WeakSet()
    if waker is not None:
        with contextlib.suppress(ValueError, OSError):
            waker.close(forked=True)


os.register_at_fork(after_in_child=_forget_in_child)
