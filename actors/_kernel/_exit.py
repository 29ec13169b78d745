"""Process exit and Ctrl-C, for runtimes a script forgot or was interrupted in.

* :func:`close_at_exit` registers a runtime to be closed when the interpreter
  exits without its ``close()``: before the interpreter waits for its non-daemon
  threads (``threading._register_atexit``, the hook ``concurrent.futures`` uses),
  so a forgotten threading runtime neither hangs the exit nor loses what it
  accepted; a ``ResourceWarning`` names it, as an unclosed file does. The child
  of a fork closes none of the runtimes it inherited (they are its parent's:
  :mod:`._fork`), only those it made itself.
* :func:`install_sigint` makes Ctrl-C land where Python code expects it -- in
  the main thread's root greenlet, never inside an actor's greenlet on gevent
  (where it used to end one turn and leave the script running) -- and never
  inside a store section it would break (its ``defer`` says so; the store then
  delivers it with :func:`deliver_interrupt` when the section ends). It is
  installed only over Python's default handler: a program's own is left alone.
  For a runtime whose waits park the main thread in its gevent hub it also makes
  a signal caught by any other thread wake that hub at once (:mod:`._sigwake`),
  until :func:`closed`.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import threading
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Protocol

import greenlet
from gevent._hub_local import get_hub_if_exists

from ._sigwake import unwatch_signals, watch_signals

__all__ = ["close_at_exit", "closed", "deliver_interrupt", "install_sigint"]

logger = logging.getLogger("subagents")


class _Closeable(Protocol):
    def close(self) -> None: ...


_open: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()
_hooked = False


def close_at_exit(obj: _Closeable) -> None:
    """Close ``obj`` at interpreter exit unless :func:`closed` said it was closed."""
    global _hooked
    with _lock:
        _open.add(obj)
        if _hooked:
            return
        _hooked = True
    register = getattr(threading, "_register_atexit", None)
    try:
        if register is None:
            raise RuntimeError("no threading._register_atexit")
        register(_close_all)
    except RuntimeError:  # an old Python, or registered while the interpreter exits
        atexit.register(_close_all)


def _forget_inherited() -> None:
    """In the child of a fork: the runtimes so far are the parent's (and a thread
    of the parent's may have held the lock as it forked)."""
    global _open, _lock
    _open = weakref.WeakSet()
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_inherited)


def closed(obj: _Closeable) -> None:
    with _lock:
        _open.discard(obj)
    unwatch_signals(obj)


def _close_all() -> None:
    with _lock:
        left = list(_open)
        _open.clear()
    for obj in left:
        # Warnings turned into errors must not stop the close.
        with contextlib.suppress(Exception):
            warnings.warn(
                f"{obj!r} was never closed: closed at exit (use it as a context manager)",
                ResourceWarning,
                source=obj,
                stacklevel=1,
            )
        try:
            obj.close()
        except BaseException:
            logger.exception("closing %r at exit failed", obj)


# -- Ctrl-C ---------------------------------------------------------------------------


def _never() -> bool:
    return False


_defer: Callable[[], bool] = _never


def install_sigint(defer: Callable[[], bool], owner: _Closeable, in_hub: bool) -> None:
    """Install the handler (see the module docstring) if Ctrl-C still has Python's
    default one and this is the main thread; idempotent. ``defer()`` is True when
    the interrupt must wait (recorded by it, delivered later). ``in_hub``: the
    runtime ``owner`` waits in this thread's gevent hub, which then wakes for a
    signal any thread catches, until :func:`closed` (``owner``), whatever handler
    the signal has."""
    global _defer
    if threading.current_thread() is not threading.main_thread():
        return
    if in_hub:
        watch_signals(owner)
    _defer = defer
    try:
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            return
        signal.signal(signal.SIGINT, _on_sigint)
    except (ValueError, OSError):  # not the main interpreter / thread after all
        return


def _root(glet: Any) -> Any:
    while glet.parent is not None:
        glet = glet.parent
    return glet


def _on_sigint(signum: int, frame: Any) -> None:
    if _defer():
        return  # delivered when the store section ends
    deliver_interrupt()


def deliver_interrupt() -> None:
    """Raise ``KeyboardInterrupt`` here if this is the main thread's root greenlet,
    else throw it into that greenlet (parked in a wait) from the hub."""
    current = greenlet.getcurrent()
    if current.parent is None:
        raise KeyboardInterrupt
    hub = get_hub_if_exists()
    if hub is None:
        raise KeyboardInterrupt  # a greenlet of somebody else's: as Python would
    # An actor's greenlet (or the hub) is running: the root greenlet, parked in a
    # wait, is where the program expects the interrupt.
    hub.loop.run_callback(_throw, _root(current))


def _throw(root: Any) -> None:
    if root.dead or _defer():
        return
    root.throw(KeyboardInterrupt)
