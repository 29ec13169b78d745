"""What the supervisor asks of the runtime: retirement, disposal, the end of an epoch.

:class:`ResidencyHooks` implements :class:`~subagents.supervision.SupervisorHooks`
for the continuation manager. Every hook is non-blocking: it posts a notice to the
registry, starts an asynchronous disposal, posts an announcement to the
dispatcher, or sets an alarm.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

from subagents.actors._kernel import Alarm, DispatchBox
from subagents.protocol import SessionId
from subagents.supervision import Activation

from ._admission import RegistryInbox
from ._types import SubagentEvent

__all__ = ["ResidencyHooks"]


class ResidencyHooks:
    """The supervisor's hooks (see :class:`~subagents.supervision.SupervisorHooks`).

    ``keep_warm`` seconds hold a settled, idle Activation resident after its agent
    last went idle (0: settle at once, as the specification says; ``inf``: until
    drained or closed).
    """

    def __init__(
        self,
        registry: RegistryInbox,
        dispatch: DispatchBox,
        alarm: Alarm,
        emit: Callable[[SubagentEvent, SessionId | None], object],
        keep_warm: float,
    ) -> None:
        self._registry = registry
        self._dispatch = dispatch
        self._alarm = alarm
        self._emit = emit
        self.keep_warm = keep_warm
        self.closing = False

    def retire(self, activation: Activation) -> None:
        self._registry.retire(activation)

    def dispose(self, activation: Activation) -> None:
        activation.agent.dispose(wait=False, checkpoint=True)

    def announce_release(self, activation: Activation) -> None:
        # The end is announced after everything posted before it (its start
        # among them); the latch is set after the listeners ran, so a drain that
        # returns has had every end of its forest announced.
        self._dispatch.call(functools.partial(self._end, activation))
        self._registry.released(activation)

    def _end(self, activation: Activation) -> None:
        try:
            self._emit(
                SubagentEvent(
                    type="subagent/end",
                    provider=activation.provider,
                    run_id=activation.run_id,
                    local=True,
                    parent_session=activation.parent_session,
                    child_id=str(activation.child_id),
                    mode="continuable",
                    stop_reason="cancelled" if activation.drained else "completed",
                ),
                activation.parent_session,
            )
        finally:
            activation.released.set()

    def warm_until(self, activation: Activation) -> float | None:
        if self.keep_warm <= 0 or self.closing:
            return None
        return float(activation.agent.idle_since) + self.keep_warm

    def wake_at(self, deadline: float) -> None:
        self._alarm.at(deadline)

    def now(self) -> float:
        return time.monotonic()
