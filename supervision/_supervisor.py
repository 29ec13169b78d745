"""The supervisor actor: owned children, settlement, child-first release.

Theory of operation
-------------------
The supervisor is the one owner of release order. It never blocks: every step is
a message, and disposal is asynchronous (an agent's handle is released in its own
actor's ``on_stop``, which then reports back).

Notices it takes, through :class:`Notices` (a notice is an Activation added to a
dict, and one mailbox message per batch tells the supervisor to drain them, so a
drain that quiets 10,000 children at once allocates no message objects -- 20,000
queued pykka envelopes used to outlive young garbage collections and set off a
full one); its mailbox otherwise takes only callables, run in its context:

* ``quiescent(activation)`` -- something changed that may let the Activation
  settle (its agent went idle, an owned child was released, an admission ended,
  a keep-warm delay ran out). If :func:`residency` says ``settled`` -- checked
  under the registry lock, so no admission can slip in between -- and no keep-warm
  delay holds it, the Activation leaves the registry and its agent is disposed
  (after a best-effort flush of its session).
* ``released(activation)`` -- the agent handle is disposed. The supervisor
  revokes the scope's contributions, emits ``subagent/end``, removes the child
  from its parent Activation's ``owned`` set, and re-evaluates that parent: a
  parent therefore settles strictly after all of its children (child-first).

What it never does: cancel a turn of an Activation that is running (teardown and
drain cancel top-down first, then let quiescence drive release bottom-up), or
touch top-level agents and one-shot children, which have no Activation.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable
from typing import Any, Protocol

import pykka

from ._activation import Activation, residency

__all__ = ["Notices", "SupervisorHooks", "supervisor_actor_class"]

logger = logging.getLogger("subagents")


class _Drain:
    """The one mailbox message: drain the notices queued so far."""

    __slots__ = ()


_DRAIN = _Drain()


class Notices:
    """Quiescence and release notices for one supervisor, from any thread.

    Neither kind needs a message object: a notice is its Activation, kept in an
    insertion-ordered dict per kind (a repeated ``quiescent`` coalesces: it only
    asks for a re-evaluation). Order across kinds does not matter -- a settling
    Activation ignores ``quiescent``, and ``released`` re-evaluates the parent
    itself. A poster schedules one drain message unless one is pending; the
    supervisor clears the pending flag as it swaps the dicts out, under the same
    lock, so every notice is either in the swapped-out dicts or schedules a drain.
    """

    __slots__ = ("_lock", "_quiet", "_ref", "_released", "_scheduled")

    def __init__(self) -> None:
        self._quiet: dict[Activation, None] = {}
        self._released: dict[Activation, None] = {}
        self._lock = threading.Lock()
        self._scheduled = False
        self._ref: Any = None

    def bind(self, ref: Any) -> None:
        """The supervisor's actor ref (set once, before the first notice)."""
        self._ref = ref

    def quiescent(self, activation: Activation) -> None:
        """Something changed that may let ``activation`` settle."""
        self._post(activation, released=False)

    def released(self, activation: Activation) -> None:
        """``activation``'s agent handle is disposed."""
        self._post(activation, released=True)

    def _post(self, activation: Activation, *, released: bool) -> None:
        with self._lock:
            (self._released if released else self._quiet)[activation] = None
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(pykka.ActorDeadError):  # closing: nobody settles now
            self._ref.tell(_DRAIN)

    def _take(self) -> tuple[Iterable[Activation], Iterable[Activation]]:
        """Swap out what was posted so far; the caller iterates without the lock."""
        released: Iterable[Activation] = ()
        quiet: Iterable[Activation] = ()
        with self._lock:
            self._scheduled = False
            # Never hand out a live dict, not even an empty one: a poster adding
            # to it while the supervisor iterates would break the iteration.
            if self._released:
                released, self._released = self._released, {}
            if self._quiet:
                quiet, self._quiet = self._quiet, {}
        return released, quiet


class SupervisorHooks(Protocol):
    """What the supervisor needs from the continuation manager."""

    lock: Any

    def begin_settle(self, activation: Activation) -> None:
        """Remove from the registry (lock held) -- the Activation is settling."""

    def dispose_async(self, activation: Activation) -> None:
        """Start disposing the agent handle; a ``released`` notice follows."""

    def on_released(self, activation: Activation) -> None:
        """Contributions revoked, ``subagent/end`` emitted, registry updated."""

    def keep_warm(self, activation: Activation) -> bool:
        """True to keep a settled Activation resident a while longer (lock held);
        the hooks then post ``quiescent`` again when the delay has passed."""


def _settle_if_ready(hooks: SupervisorHooks, activation: Activation) -> None:
    with hooks.lock:
        if activation.settling or residency(activation) != "settled":
            return
        if hooks.keep_warm(activation):
            return
        activation.settling = True
        hooks.begin_settle(activation)
    hooks.dispose_async(activation)


def _release(hooks: SupervisorHooks, activation: Activation) -> Activation | None:
    try:
        hooks.on_released(activation)
    except Exception:
        logger.exception("releasing %r failed", activation)
    parent = activation.parent_activation
    with hooks.lock:
        if parent is not None:
            parent.owned.discard(activation.child_id)
    return parent


_CLASSES: dict[type[pykka.Actor], type[pykka.Actor]] = {}


def supervisor_actor_class(base: type[pykka.Actor]) -> type[pykka.Actor]:
    """The supervisor actor class for a backend's actor base (built once per base)."""
    cls = _CLASSES.get(base)
    if cls is None:

        class _Supervisor(base):  # type: ignore[valid-type,misc]
            def __init__(self, hooks: SupervisorHooks, notices: Notices) -> None:
                super().__init__()
                self._hooks = hooks
                self._notices = notices

            def _on_released(self, activation: Activation) -> None:
                parent = _release(self._hooks, activation)
                if parent is not None:
                    _settle_if_ready(self._hooks, parent)

            def on_receive(self, message: Any) -> Any:
                # Every message first drains the notices posted before it, so a
                # callable sent after some notices (a test barrier) runs after them.
                while True:
                    released, quiet = self._notices._take()
                    if not released and not quiet:
                        break
                    for activation in released:
                        self._guarded(self._on_released, activation)
                    for activation in quiet:
                        self._guarded(_settle_if_ready, self._hooks, activation)
                if message is not _DRAIN:
                    message()
                return None

            @staticmethod
            def _guarded(fn: Any, *args: Any) -> None:
                # The supervisor is the one owner of release order: a failure
                # with one Activation is logged, it must not stop the actor.
                try:
                    fn(*args)
                except Exception:
                    logger.exception("the supervisor failed on %r", args[-1])

        _Supervisor.__name__ = f"Supervisor[{base.__name__}]"
        cls = _CLASSES[base] = _Supervisor
    return cls
