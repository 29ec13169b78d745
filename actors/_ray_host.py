"""The body of each Ray actor of a :class:`~subagents.actors.ray.RayPlacement`: a
:class:`PlacementHost`, and the actor class that forwards to it. Nothing here
needs Ray: a host is a runtime of its own on the shared store."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from subagents.actors._children import Hosting
from subagents.actors._runtime import Runtime
from subagents.protocol import SessionId

__all__ = ["PlacementHost"]


class PlacementHost:
    """A host of placed children: a runtime on the shared store (threads backend).

    The body of each Ray actor of a :class:`RayPlacement`; it needs no Ray itself.

    Args:
        store: the store every process shares (a path or a ``postgresql://`` URL).
        setup: ``setup(runtime)`` registers the models and tools children need.
        lease_ttl: the host runtime's lease ttl (see :class:`Runtime`).
        lease_wait: seconds a run waits for a lease another process still holds
            (a host that died: until its lease expires); default ``2 * lease_ttl``.
        tracing: trace the children's turns here, with the tracer provider
            ``setup`` configures (set after the runtime is built, so it is
            reached through OpenTelemetry's global proxy).
    """

    def __init__(
        self,
        store: str,
        setup: Callable[[Runtime], object] | None = None,
        *,
        lease_ttl: float = 30.0,
        lease_wait: float | None = None,
        tracing: bool = False,
    ) -> None:
        # It adopts nothing: a session nobody holds (a root whose runtime closed,
        # a child between runs) is the parent's runtime's to activate, not a host's.
        self.runtime = Runtime(store, lease_ttl=lease_ttl, adopt=False, tracing=tracing)
        if setup is not None:
            setup(self.runtime)
        wait = 2 * lease_ttl if lease_wait is None else lease_wait
        self._hosting = Hosting(self.runtime, self.runtime.continuation.hosted, wait)

    def run(
        self,
        child_id: str,
        call: int | None = None,
        wake: Sequence[str] = (),
        drop: Sequence[Any] | None = None,
        attempt: int = 0,
    ) -> None:
        """Hold the child, run what waits for it (and for ``wake``, sessions below
        it), return once it is quiet (a run asked before a release carried out
        already: nothing; before a cancel that dropped what waits -- carried out
        here, or ``drop``, its ``(call, cause)`` -- what waits is dropped;
        ``attempt``: the hosts it was sent to before)."""
        dropped = None if drop is None else (int(drop[0]), str(drop[1]))
        wakes = [SessionId(w) for w in wake]
        self._hosting.run(SessionId(child_id), call, wakes, dropped, int(attempt))

    def settle(self, child_id: str, call: int | None = None) -> bool:
        """Release it if it is quiet (True), else False (numbered ``call``: a run
        asked before it and carried out after it does nothing)."""
        return self._hosting.settle(SessionId(child_id), call)

    def cancel(self, child_id: str, cause: str, keep_inbox: bool, call: int | None = None) -> None:
        """Cancel its running turn (``keep_inbox=False``: and what waits, and what a
        run asked before ``call`` finds)."""
        self._hosting.cancel(SessionId(child_id), cause, keep_inbox, call)

    def interrupt(self, child_id: str, kind: str, by: str | None) -> None:
        """An authorized interrupt: cancel the turn, keep the inbox, log it."""
        self._hosting.interrupt(SessionId(child_id), kind, None if by is None else SessionId(by))

    def release(self, child_id: str, cause: str, call: int | None = None) -> None:
        """Cancel it, keeping what it accepted, and release it."""
        self._hosting.release(SessionId(child_id), cause, call=call)

    def let_go(self, child_id: str, call: int, attempt: int) -> None:
        """The placement took this host for dead in that attempt of run ``call``:
        that attempt does nothing here, and what it holds of the child is released."""
        self._hosting.let_go(SessionId(child_id), int(call), int(attempt))

    def forget(self, children: Sequence[Sequence[Any]]) -> None:
        """Each ``(child_id, call)``: forget the child's markers up to ``call`` (its
        parent's placement asks nothing lower of it)."""
        self._hosting.forget([(SessionId(c), int(n)) for c, n in children])

    def held(self) -> list[str]:
        """The children this host holds now."""
        return [str(s) for s in self._hosting.held()]

    def pid(self) -> int:
        """This host's process id."""
        return os.getpid()

    def close(self) -> None:
        """Release every child and close the runtime."""
        self._hosting.close()
        self.runtime.close()


def _forward(name: str) -> Callable[..., Any]:
    def call(self: Any, *args: Any) -> Any:
        return getattr(self.host, name)(*args)

    call.__name__ = call.__qualname__ = name
    return call


def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    self.host = PlacementHost(*args, **kwargs)


#: The Ray actor class: it forwards to a PlacementHost. (``ray.remote`` rewrites the
#: signatures of the class it is given, function objects included: never ours.)
_RayHost: type = type(
    "_RayHost",
    (),
    {
        "__init__": _init,
        **{
            n: _forward(n)
            for n in (
                "run",
                "settle",
                "cancel",
                "interrupt",
                "release",
                "let_go",
                "forget",
                "held",
                "pid",
                "close",
            )
        },
    },
)
