"""What the supervisor asks of the runtime: retirement, disposal, the end of an epoch.

:class:`ResidencyHooks` implements :class:`~subagents.supervision.SupervisorHooks`
for the continuation manager. Every hook is non-blocking: it posts a notice to the
registry, starts an asynchronous disposal, posts an announcement to the
dispatcher, or sets an alarm.
"""

from __future__ import annotations

import time

from subagents.actors._kernel import Alarm
from subagents.supervision import Activation

from ._announce import Announcer
from ._requests import RegistryInbox

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
        alarm: Alarm,
        announcer: Announcer,
        keep_warm: float,
    ) -> None:
        self._registry = registry
        self._alarm = alarm
        # Bound once: a drain queues one of each a child, held while the registry
        # and the dispatcher are busy (young garbage that outlives collections).
        self._announce = announcer.post_end
        self.keep_warm = keep_warm
        self.closing = False

    def retire(self, activation: Activation) -> None:
        self._registry.retire(activation)

    def dispose(self, activation: Activation) -> None:
        activation.agent.dispose(wait=False, checkpoint=True)

    def announce_release(self, activation: Activation) -> None:
        # The registry learns of the release, drops the child from its index and
        # then has the end announced (by the dispatcher, after everything posted to
        # it before), and only then drops it from its parent's owned set.
        self._registry.released(activation, self._announce)

    def warm_until(self, activation: Activation) -> float | None:
        if self.keep_warm <= 0 or self.closing:
            return None
        return float(activation.agent.idle_since) + self.keep_warm

    def wake_at(self, deadline: float) -> None:
        self._alarm.at(deadline)

    def now(self) -> float:
        return time.monotonic()
