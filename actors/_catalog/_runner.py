"""What a listing needs to run reads and wait: a runner and a cancellation signal.

The catalog imports no actor runtime (so ``subagents tree`` starts without pykka
or gevent): it is handed a :class:`Runner` -- a runtime's ``Backend`` is one,
and :data:`THREADS` serves a reader of a database without a runtime -- and any
signal with ``aborted`` and ``reason``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Final, Protocol

from subagents.protocol import ErrorCode, SubagentError

__all__ = ["NOT_ABORTED", "THREADS", "Joinable", "Runner", "SignalLike", "check", "signal_of"]


class Joinable(Protocol):
    def join(self, timeout: float | None = None) -> bool: ...


class Runner(Protocol):
    """Runs blocking reads and concurrent inspections (``Backend`` is one)."""

    def run_blocking(self, fn: Callable[..., Any], /, *args: Any) -> Any: ...

    def spawn(self, fn: Callable[..., object], /, *, name: str | None = None) -> Joinable: ...


class _Thread:
    __slots__ = ("_thread",)

    def __init__(self, fn: Callable[..., object], name: str | None) -> None:
        self._thread = threading.Thread(target=fn, name=name, daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return not self._thread.is_alive()


class _Threads:
    """Blocking reads in the caller; inspections in plain threads."""

    def run_blocking(self, fn: Callable[..., Any], /, *args: Any) -> Any:
        return fn(*args)

    def spawn(self, fn: Callable[..., object], /, *, name: str | None = None) -> Joinable:
        return _Thread(fn, name)


THREADS: Final[Runner] = _Threads()


class SignalLike(Protocol):
    """A cancellation signal as the catalog reads it (``AbortSignal`` is one)."""

    @property
    def aborted(self) -> bool: ...
    @property
    def reason(self) -> Any: ...


class _NotAborted:
    __slots__ = ()
    aborted = False
    reason = None


NOT_ABORTED: Final[SignalLike] = _NotAborted()


def signal_of(signal: Any) -> SignalLike:
    """``signal``, or :data:`NOT_ABORTED` for None; ``INVALID_ARGUMENT`` otherwise."""
    if signal is None:
        return NOT_ABORTED
    if not (hasattr(signal, "aborted") and hasattr(signal, "reason")):
        raise SubagentError("signal must be an AbortSignal", code=ErrorCode.INVALID_ARGUMENT)
    return signal  # type: ignore[no-any-return]


def check(signal: SignalLike) -> None:
    """Raise ``CANCELLED`` once ``signal`` is aborted."""
    if signal.aborted:
        raise SubagentError("listing cancelled", code=ErrorCode.CANCELLED, hint=signal.reason)
