"""Latches and gates: one-shot events any thread or greenlet can wait on.

A :class:`Latch` is set once and waited on by anyone, together with a caller's
own cancellation signal if need be (it is an abort signal underneath, so
:meth:`AbortSignal.any` combines them). A :class:`Gate` is a blocking point that
another party releases: a turn that reaches it announces that and waits. The
test kit and the demo use gates to force an order between tasks without sleeps.
"""

from __future__ import annotations

import threading

from subagents.protocol import ErrorCode, SubagentError

from ._checks import check_timeout
from ._signal import AbortController, AbortSignal

__all__ = ["Gate", "Latch"]


class Latch:
    """A one-shot event that a caller can also wait on together with its own signal."""

    __slots__ = ("_controller",)

    def __init__(self) -> None:
        self._controller = AbortController()

    def __repr__(self) -> str:
        return f"<Latch {'set' if self.is_set() else 'unset'}>"

    @property
    def signal(self) -> AbortSignal:
        """Aborted once the latch is set."""
        return self._controller.signal

    def set(self) -> None:
        self._controller.abort("set")

    def is_set(self) -> bool:
        return self._controller.signal.aborted

    def wait(self, timeout: float | None = None) -> bool:
        return self._controller.signal.wait(timeout)


class Gate:
    """A blocking point released by another party, honouring the waiter's cancellation."""

    def __init__(self, name: str = "gate") -> None:
        self.name = name
        self._released = Latch()
        self._reached = Latch()
        self._lock = threading.Lock()
        self.arrivals = 0

    def __repr__(self) -> str:
        return f"<Gate {self.name!r} arrivals={self.arrivals} released={self.released}>"

    def release(self) -> None:
        """Let every present and future waiter through."""
        self._released.set()

    @property
    def released(self) -> bool:
        """Whether the test released the gate."""
        return self._released.is_set()

    def wait_reached(self, timeout: float | None = 10.0) -> bool:
        """Block until some task has reached the gate."""
        return self._reached.wait(timeout)

    def pass_through(self, signal: AbortSignal | None = None, timeout: float | None = 30.0) -> None:
        """Announce arrival, then wait for release; ``CANCELLED`` if ``signal`` aborts first.

        Raises:
            SubagentError: ``TIMEOUT`` when not released within ``timeout``;
                ``INVALID_ARGUMENT`` for a timeout that is no number of seconds.
        """
        timeout = check_timeout(timeout)
        with self._lock:
            self.arrivals += 1
        self._reached.set()
        either = (
            AbortSignal.any(self._released.signal, signal)
            if signal is not None
            else self._released.signal
        )
        if not either.wait(timeout):
            raise SubagentError(
                f"gate {self.name!r} was not released within {timeout} s", code=ErrorCode.TIMEOUT
            )
        if not self.released and signal is not None:
            signal.raise_if_aborted()
