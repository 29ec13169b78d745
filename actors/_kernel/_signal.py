"""Cancellation: the seed's ``AbortController`` / ``AbortSignal``, for both backends.

An :class:`AbortController` owns one :class:`AbortSignal`; ``abort(reason)`` flips
the signal once (the first reason wins) and runs each listener exactly once, in the
aborting thread or greenlet, outside any lock. The signal is read-only to whoever
holds it: ``aborted``, ``reason``, ``raise_if_aborted()``, ``wait(timeout)`` and
``add_listener(fn)``.

Thread-safety: the signal's state is guarded by a native OS lock that is held only
for a few bytecodes and never across a call out or a greenlet switch, so ``abort``
may come from any OS thread or greenlet, with or without monkey-patching.

``wait`` picks how to block at the moment it is called (:func:`current_backend`):
an OS event in a plain thread, a gevent event in a thread with a hub. An abort from
another OS thread (a threadpool worker, a ``ThreadingActor``) reaches a waiting
greenlet through ``loop.run_callback_threadsafe``.

This module never starts threads or greenlets and never imports other actors.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from typing import Any, Final

import gevent
from subagents.protocol import ErrorCode, SubagentError

from ._backend import GEVENT, current_backend
from ._checks import check_listener
from ._gevent import native_allocate_lock, native_get_ident

__all__ = ["AbortController", "AbortSignal"]

logger = logging.getLogger("subagents")

Listener = Callable[[Any], object]


def _noop() -> None:
    return None


class AbortSignal:
    """A read-only cancellation flag with a reason, waitable and observable.

    Get one from :class:`AbortController`, or use :meth:`never`,
    :meth:`aborted_with` and :meth:`any`. Do not construct it directly.
    """

    __slots__ = ("__weakref__", "_aborted", "_inert", "_listeners", "_lock", "_reason")

    def __init__(self, *, _inert: bool = False) -> None:
        self._lock = native_allocate_lock()
        self._aborted = False
        self._reason: Any = None
        # Insertion-ordered so listeners run in the order they were added; None
        # once aborted (the dict was handed to the aborting caller).
        self._listeners: dict[object, Listener] | None = {}
        # A signal nothing can abort stores no listeners at all.
        self._inert = _inert

    def __repr__(self) -> str:
        if self._aborted:
            return f"<AbortSignal aborted reason={self._reason!r}>"
        return "<AbortSignal never>" if self._inert else "<AbortSignal pending>"

    @property
    def aborted(self) -> bool:
        """Whether the signal has been aborted."""
        return self._aborted

    @property
    def reason(self) -> Any:
        """The first reason passed to ``abort`` (``None`` until aborted)."""
        return self._reason

    def raise_if_aborted(self) -> None:
        """Raise ``SubagentError`` (code ``CANCELLED``, hint = reason) when aborted.

        When the reason is an exception it is chained as the ``__cause__``.
        """
        if not self._aborted:
            return
        reason = self._reason
        # Raised without a local name: ``err = ...; raise err`` would leave the
        # error in this frame, which its own traceback holds -- a reference cycle
        # per cancelled turn that only the cyclic GC frees (a 10,000-child drain
        # spent a third of its time collecting them).
        if isinstance(reason, BaseException):
            raise SubagentError(
                f"cancelled: {reason!r}", code=ErrorCode.CANCELLED, hint=reason
            ) from reason
        raise SubagentError(f"cancelled: {reason!r}", code=ErrorCode.CANCELLED, hint=reason)

    def add_listener(self, fn: Listener) -> Callable[[], None]:
        """Call ``fn(reason)`` once when aborted; return a function that removes it.

        ``fn`` runs in the aborting thread or greenlet, or at once (here) when the
        signal is aborted already. An exception from ``fn`` is logged to the
        ``subagents`` logger and does not stop the other listeners. Removing is
        idempotent and harmless after the abort.

        Raises:
            SubagentError: ``INVALID_ARGUMENT`` when ``fn`` is not callable.
        """
        check_listener(fn)
        if self._inert:
            return _noop
        with self._lock:
            listeners = self._listeners
            if listeners is not None:
                token = object()
                listeners[token] = fn
                return lambda: self._remove(token)
        _call_listener(fn, self._reason)
        return _noop

    def wait(self, timeout: float | None = None) -> bool:
        """Block until aborted (``True``) or until ``timeout`` seconds pass (``False``).

        Blocks cooperatively where the caller is in a gevent hub's thread, on an OS
        event elsewhere (see :func:`subagents.actors.current_backend`).
        """
        if self._aborted:
            return True
        backend = current_backend()
        event = backend.event()
        if backend is GEVENT:
            hub = gevent.get_hub()

            def listener(_reason: Any) -> None:
                loop = hub.loop
                if hub.thread_ident == native_get_ident():
                    event.set()
                elif loop is not None:
                    loop.run_callback_threadsafe(event.set)

        else:

            def listener(_reason: Any) -> None:
                event.set()

        remove = self.add_listener(listener)
        try:
            event.wait(timeout)
        finally:
            remove()
        return self._aborted

    def _remove(self, token: object) -> None:
        with self._lock:
            if self._listeners is not None:
                self._listeners.pop(token, None)

    def _abort(self, reason: Any) -> None:
        with self._lock:
            listeners = self._listeners
            if listeners is None or self._inert:
                return
            self._reason = reason
            self._aborted = True
            self._listeners = None
        for fn in listeners.values():
            _call_listener(fn, reason)

    @staticmethod
    def never() -> AbortSignal:
        """The shared signal that is never aborted (stores no listeners)."""
        return _NEVER

    @staticmethod
    def aborted_with(reason: Any = None) -> AbortSignal:
        """A new signal that is aborted already, with ``reason``."""
        signal = AbortSignal()
        signal._abort(reason)
        return signal

    @staticmethod
    def any(*signals: AbortSignal) -> AbortSignal:
        """A signal aborted as soon as any input is, with that input's reason.

        Already-aborted inputs win at once (the first in argument order). Inputs that
        can never abort are skipped; with none left this is :meth:`never`, with one
        left it is that signal itself. Otherwise the result listens to its inputs
        and detaches from all of them when it aborts, or when it is garbage
        collected, so a long-lived input does not accumulate dead listeners.

        Raises:
            SubagentError: ``INVALID_ARGUMENT`` for an input that is no signal.
        """
        for signal in signals:
            if not isinstance(signal, AbortSignal):
                raise SubagentError(
                    f"AbortSignal.any takes signals, got {type(signal).__name__}",
                    code=ErrorCode.INVALID_ARGUMENT,
                )
        for signal in signals:
            if signal.aborted:
                return AbortSignal.aborted_with(signal.reason)
        live = list({id(s): s for s in signals if not s._inert}.values())
        if not live:
            return _NEVER
        if len(live) == 1:
            return live[0]

        combined = AbortSignal()
        combined_ref = weakref.ref(combined)

        def forward(reason: Any) -> None:
            target = combined_ref()
            if target is not None:
                target._abort(reason)

        removers: list[Callable[[], None]] = []
        detach = weakref.finalize(combined, _call_all, removers)
        combined.add_listener(lambda _reason: detach())
        for signal in live:
            removers.append(signal.add_listener(forward))
        if combined.aborted:
            # An input aborted while we were still attaching to the later ones.
            _call_all(removers)
        return combined


def _call_all(fns: list[Callable[[], None]]) -> None:
    for fn in fns:
        fn()


def _call_listener(fn: Listener, reason: Any) -> None:
    try:
        fn(reason)
    except Exception:
        logger.exception("AbortSignal listener %r failed", fn)


_NEVER: Final = AbortSignal(_inert=True)


class AbortController:
    """Owns an :class:`AbortSignal` and is the only way to abort it."""

    __slots__ = ("signal",)

    def __init__(self) -> None:
        self.signal: Final = AbortSignal()

    def __repr__(self) -> str:
        return f"<AbortController {self.signal!r}>"

    def abort(self, reason: Any = None) -> None:
        """Abort the signal. Idempotent: the first reason wins, listeners run once.

        Safe from any thread or greenlet; listeners run in the caller, after the
        signal reads as aborted.
        """
        self.signal._abort(reason)
