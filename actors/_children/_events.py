"""Lifecycle events: listeners, their containment, and a run's start/end order.

Listeners subscribe service-wide or scoped to a delegating parent. Every listener
runs independently: a raise, or a returned future that later fails, is logged and
changes nothing (the seed's listener containment). One-shot run events are
emitted by the caller of ``start`` (``subagent/start``, synchronously) and by the
child's result observer (``subagent/end``); :meth:`EventBus.open_run` orders the
two whatever the settle timing. Continuable epochs are announced through the
dispatcher actor instead (see :mod:`._residency`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from subagents.actors._agents import Agent
from subagents.actors._kernel._listeners import RAISED, hear
from subagents.protocol import ErrorCode, RunId, SessionId, SubagentError, new_run_id

from ._types import SubagentEvent, SubagentRun

__all__ = ["EventBus", "Listener", "Subscription"]

logger = logging.getLogger("subagents")

Listener = Callable[[SubagentEvent], object]


class Subscription:
    """Returned by ``subscribe``; ``dispose()`` stops delivery."""

    def __init__(self, bus: EventBus, entry: tuple[Listener, Any]) -> None:
        self._bus = bus
        self._entry = entry

    def dispose(self) -> None:
        """Stop delivering events to this listener. Idempotent."""
        self._bus._unsubscribe(self._entry)


class _RunEvents:
    """Orders ``subagent/start`` before ``subagent/end`` whatever the settle timing."""

    __slots__ = ("ended", "lock", "started")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started = False
        self.ended: SubagentEvent | None = None


class EventBus:
    """Lifecycle listeners of one runtime. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listeners: list[tuple[Listener, Any]] = []

    def subscribe(self, listener: Listener, *, scope: Any = None) -> Subscription:
        """Add ``listener``: scoped to a parent (an agent or its session id), or all.

        Raises:
            SubagentError: ``INVALID_ARGUMENT`` for a non-callable or a bad scope.
        """
        if not callable(listener):
            raise SubagentError("a listener is callable", code=ErrorCode.INVALID_ARGUMENT)
        key: Any = None
        if isinstance(scope, Agent):
            key = scope.session_id
        elif scope is not None:
            key = SessionId(scope)
        entry = (listener, key)
        with self._lock:
            self._listeners.append(entry)
        return Subscription(self, entry)

    def _unsubscribe(self, entry: tuple[Listener, Any]) -> None:
        # By identity: the same listener subscribed twice makes two equal entries,
        # and a second dispose of one must not remove the other.
        with self._lock:
            for i, held in enumerate(self._listeners):
                if held is entry:
                    del self._listeners[i]
                    return

    def listening(self) -> bool:
        """Whether any listener is subscribed (one read: no lock)."""
        return bool(self._listeners)

    def emit(self, event: SubagentEvent, scope: SessionId | None) -> None:
        """Run every listener of ``scope`` (and the service-wide ones), contained."""
        if not self._listeners:  # one read: a listener added meanwhile hears the next event
            return
        with self._lock:
            targets = [
                fn
                for fn, key in self._listeners
                if key is None or (scope is not None and key == scope)
            ]
        for fn in targets:
            returned = hear(fn, event, f"subagent listener (on {event.type})")
            if returned is not RAISED:
                _contain(returned, fn, event)

    def open_run(
        self, provider: str, run: SubagentRun, parent: SessionId, mode: str
    ) -> RunId | None:
        """Emit a one-shot run's ``subagent/start`` now and its ``subagent/end`` when
        its result settles -- never the other way round. Returns the run id.

        With no listener subscribed it emits nothing, then either, and returns
        None: a listener hears the pairs of the runs started after it subscribed,
        whole (and a runtime nobody listens to builds no events, 7% of a one-shot
        cycle)."""
        if not self._listeners:  # one read, as in emit
            return None
        run_id = new_run_id()
        start = SubagentEvent(
            type="subagent/start",
            provider=provider,
            run_id=run_id,
            local=run.local_agent is not None,
            parent_session=parent,
            child_id=str(run.id),
            mode=mode,
        )
        record = _RunEvents()

        def on_settled(future: Any) -> None:
            exc = future.exception(0)
            stop = "failed" if exc is not None else future.get(0).stop_reason
            end = SubagentEvent(
                type="subagent/end",
                provider=provider,
                run_id=run_id,
                local=start.local,
                parent_session=parent,
                child_id=start.child_id,
                mode=mode,
                stop_reason=stop,
            )
            with record.lock:
                if not record.started:
                    record.ended = end  # emitted right after start
                    return
            self.emit(end, parent)

        run.result.add_done_callback(on_settled)  # attached before start is emitted
        self.emit(start, parent)
        with record.lock:
            record.started = True
            pending, record.ended = record.ended, None
        if pending is not None:
            self.emit(pending, parent)
        return run_id


def _contain(returned: Any, fn: Any, event: SubagentEvent) -> None:
    """Log a listener's returned future when it later fails (never re-raise)."""
    if returned is None:
        return

    def log_failure(exc: BaseException | None) -> None:
        if exc is not None:
            logger.error("subagent listener %r failed later on %s: %r", fn, event.type, exc)

    if hasattr(returned, "add_done_callback"):

        def done(fut: Any) -> None:
            try:
                log_failure(fut.exception())
            except Exception as exc:
                log_failure(exc)

        try:
            returned.add_done_callback(done)
        except Exception:
            logger.exception("could not observe the future returned by listener %r", fn)
    elif hasattr(returned, "rawlink"):  # gevent Greenlet / AsyncResult
        returned.rawlink(lambda g: log_failure(g.exception))
    elif hasattr(returned, "close") and hasattr(returned, "send"):  # a coroutine nobody will run
        returned.close()
        logger.error("subagent listener %r returned a coroutine; listeners must be synchronous", fn)
