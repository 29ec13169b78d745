"""Sections a ``KeyboardInterrupt`` must not split.

A group commit's leader writes other callers' requests and hands leadership on;
interrupted halfway, it would leave them waiting for ever. Python raises
``KeyboardInterrupt`` in the main thread between any two bytecodes, so the
runtime's SIGINT handler asks :func:`defer_interrupt` first: while the main
thread's root greenlet is inside a :func:`critical` section, the interrupt is
only recorded, and raised when the outermost section ends.

Only the main thread counts: signals are handled there. How the recorded
interrupt is delivered when the section ends is the runtime's to say
(:func:`set_interrupt_delivery`; by default it is raised): on gevent it belongs in
the main thread's root greenlet, which the store does not know about.
"""

from __future__ import annotations

import _thread
import sys
import threading
from collections.abc import Callable
from contextlib import AbstractContextManager

__all__ = ["critical", "defer_interrupt", "set_interrupt_delivery"]


def _native_get_ident() -> Callable[[], int]:
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("_thread"):
        original: Callable[[], int] = monkey.get_original("_thread", "get_ident")
        return original
    return _thread.get_ident


# The main thread object is made at startup, before any monkey-patching: its
# ident is the native one.
_MAIN: int | None = threading.main_thread().ident
_get_ident = _native_get_ident()


def _raise() -> None:
    raise KeyboardInterrupt


class _State:
    depth = 0
    pending = False
    deliver: Callable[[], None] = _raise


class _Critical:
    __slots__ = ("_counted",)

    def __enter__(self) -> None:
        # Not a generator-based context manager: this is on every store write.
        self._counted = counted = _get_ident() == _MAIN
        if counted:
            _State.depth += 1

    def __exit__(self, *exc: object) -> None:
        if self._counted:
            _State.depth -= 1
            if _State.depth == 0 and _State.pending:
                _State.pending = False
                _State.deliver()


def critical() -> AbstractContextManager[None]:
    """``with critical():`` holds off a ``KeyboardInterrupt`` of the main thread until
    the block ends (then raises it)."""
    return _Critical()


def set_interrupt_delivery(deliver: Callable[[], None]) -> None:
    """How an interrupt held off by a section is delivered when it ends."""
    _State.deliver = deliver


def defer_interrupt() -> bool:
    """For a SIGINT handler: True (and the interrupt recorded, to be delivered when
    the section ends) while the main thread is in a critical section."""
    if _State.depth > 0:
        _State.pending = True
        return True
    return False
