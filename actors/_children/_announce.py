"""Announcing a continuable epoch: ``subagent/start`` strictly before ``subagent/end``.

The start of an epoch is announced by whoever published it, in its own thread,
once the registry has published it -- before ``start_continuable`` or the
follow-up that cold-resumed the child returns, as a one-shot run's start is
announced before ``start`` returns. The end is announced by the dispatcher when
the supervisor has released it. A child can settle before its publisher gets to
announce the start; then the end waits for the start and is announced right
after it, by the publisher. Either way the epoch's ``released`` latch is set once
its end was announced, so a drain that returns has announced its whole forest.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from subagents.actors._kernel import Telemetry
from subagents.protocol import SessionId
from subagents.supervision import Activation

from ._types import SubagentEvent

__all__ = ["Announcer"]

_STARTED = 1
_END_WAITING = 2


class Announcer:
    """Orders each epoch's lifecycle pair (see the module docstring)."""

    def __init__(
        self,
        emit: Callable[[SubagentEvent, SessionId | None], object],
        telemetry: Telemetry | None = None,
    ) -> None:
        self._emit = emit
        self._telemetry = telemetry
        self._lock = threading.Lock()  # held for a flag, never across a call out

    def start(self, act: Activation) -> None:
        """Announce ``subagent/start`` (the publisher, after publication); when
        tracing, the epoch's span starts, below the publisher's current span."""
        tel = self._telemetry
        if tel is not None:
            act.span = tel.start(
                "subagents.activation",
                {"child_id": act.child_id, "parent_session_id": act.parent_session,
                 "run_id": act.run_id, "provider": act.provider},
            )  # fmt: skip
        try:
            self._emit(self._event(act, "subagent/start", None), act.parent_session)
        finally:
            with self._lock:
                end_waiting = act.announced == _END_WAITING
                act.announced = _STARTED
            if end_waiting:
                self._end(act)

    def end(self, act: Activation) -> None:
        """Announce ``subagent/end`` (the dispatcher, after release)."""
        with self._lock:
            if act.announced != _STARTED:
                act.announced = _END_WAITING  # the publisher announces it after the start
                return
        self._end(act)

    def _end(self, act: Activation) -> None:
        stop = "cancelled" if act.drained else "completed"
        try:
            self._emit(self._event(act, "subagent/end", stop), act.parent_session)
        finally:
            if act.span is not None:
                Telemetry.end(act.span, stop)
            act.released.set()

    @staticmethod
    def _event(act: Activation, kind: str, stop_reason: str | None) -> SubagentEvent:
        return SubagentEvent(
            type=kind,
            provider=act.provider,
            run_id=act.run_id,
            local=True,
            parent_session=act.parent_session,
            child_id=str(act.child_id),
            mode="continuable",
            stop_reason=stop_reason,
        )
