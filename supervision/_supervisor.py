"""The supervisor actor: residency decisions and child-first release order.

Theory of operation
-------------------
The supervisor owns *residency and release order*: when a quiescent Activation
settles, keep-warm delays, disposal of settled handles, and the order in which
releases are announced and propagate to parents. It never blocks and never runs
user code: every step is a notice, disposal is asynchronous (an agent's handle
is released in its own actor's ``on_stop``, which reports back), and the end of
an epoch is announced through the dispatcher.

Notices it takes (:class:`SupervisorInbox`, handled in this order within a batch):

* ``retired(activation)`` -- the registry agreed that it settles: dispose the handle;
* ``released(activation)`` -- the handle is disposed: announce the end of the
  epoch and tell the registry, which drops the child from its parent's ``owned``
  set and makes the parent quiescent again -- so a parent settles strictly after
  all of its children (child-first);
* ``quiescent(activation)`` -- something changed that may let it settle (its agent
  went idle, an admission ended, a child was released, a drain began);
* ``tick`` -- a keep-warm delay may have run out.

Settling is a handshake with the registry, the owner of admission and of the
ownership records: when :func:`residency` says ``settled`` and no keep-warm delay
holds it, the supervisor asks the registry to *retire* the Activation. The
registry agrees only if no materialization below it is in flight, it owns no
child, and the agent itself confirms it is idle while closing its inbox -- one
atomic step in the agent, so no follow-up can slip in between. A refusal needs no
retry: whatever made it (a turn, an admission, a child) posts a new notice when
it ends.

What it never does: cancel a turn (teardown and drains cancel top-down first,
then quiescence drives release bottom-up), write an Activation's fields, or touch
top-level agents and one-shot children, which have no Activation.
"""

from __future__ import annotations

from typing import Any, Protocol

from ._activation import Activation, residency
from ._notices import NoticeBox, NoticeLoop
from ._phase import MAY_SETTLE

__all__ = ["Supervisor", "SupervisorHooks", "SupervisorInbox"]


class SupervisorInbox(NoticeBox):
    """The supervisor's notices, posted from any thread or greenlet."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(("retired", "released", "quiescent", "tick"))

    def retired(self, activation: Activation) -> None:
        """The registry retired ``activation``: dispose its handle."""
        self.post("retired", activation)

    def released(self, activation: Activation) -> None:
        """``activation``'s agent handle is disposed."""
        self.post("released", activation)

    def quiescent(self, activation: Activation) -> None:
        """Something changed that may let ``activation`` settle."""
        self.post("quiescent", activation)

    def tick(self) -> None:
        """A keep-warm delay may have run out."""
        self.post("tick", None)


class SupervisorHooks(Protocol):
    """What the supervisor asks of the rest of the runtime (all non-blocking)."""

    def retire(self, activation: Activation) -> None:
        """Ask the registry to retire ``activation``."""

    def dispose(self, activation: Activation) -> None:
        """Start disposing the agent handle; a ``released`` notice follows."""

    def announce_release(self, activation: Activation) -> None:
        """The epoch ended: ``subagent/end``, the latch, the registry's notice."""

    def warm_until(self, activation: Activation) -> float | None:
        """A deadline (``now()`` units) before which a settled Activation stays
        resident, or None to settle at once."""

    def wake_at(self, deadline: float) -> None:
        """Post ``tick`` once ``deadline`` has passed."""

    def now(self) -> float:
        """The clock of keep-warm deadlines."""


class Supervisor(NoticeLoop):
    """The supervisor actor's behaviour; built into an actor class per backend.

    Its mailbox also takes callables, run in its context (used as barriers).
    """

    def __init__(self, hooks: SupervisorHooks, notices: SupervisorInbox) -> None:
        super().__init__()
        self.hooks = hooks
        self.notices = notices
        self._warm: dict[Activation, float] = {}  # held resident until (keep-warm)

    def __repr__(self) -> str:
        return "<Supervisor>"

    def on_notice(self, kind: str, key: Any, value: Any) -> None:
        """Apply one child-lifecycle notice to the ownership table."""
        if kind == "quiescent":
            self._consider(key)
        elif kind == "retired":
            self._warm.pop(key, None)
            self.hooks.dispose(key)
        elif kind == "released":
            self._released(key)
        elif kind == "tick":
            now = self.hooks.now()
            for activation, until in list(self._warm.items()):
                if until <= now:
                    del self._warm[activation]
                    self._consider(activation)

    def on_message(self, message: Any) -> Any:
        """Handle one request of the supervisor's protocol (see the module docstring)."""
        return message()

    def _released(self, activation: Activation) -> None:
        self._warm.pop(activation, None)
        self.hooks.announce_release(activation)

    def _consider(self, activation: Activation) -> None:
        """Ask for retirement if ``activation`` is settled and nothing holds it."""
        if activation.phase not in MAY_SETTLE or residency(activation) != "settled":
            return
        if not activation.drained:
            until = self.hooks.warm_until(activation)
            if until is not None and until > self.hooks.now():
                if self._warm.get(activation) != until:
                    self._warm[activation] = until
                    self.hooks.wake_at(until)
                return
        self._warm.pop(activation, None)
        self.hooks.retire(activation)
