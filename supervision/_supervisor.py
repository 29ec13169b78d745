"""The supervisor actor: owned children, settlement, child-first release.

Theory of operation
-------------------
The supervisor is the one owner of release order. It never blocks: every step is
a message, and disposal is asynchronous (an agent's handle is released in its own
actor's ``on_stop``, which then reports back).

Messages it accepts (through a :class:`Notices` bag: each is queued there, and one
mailbox message per batch tells the supervisor to drain it, so a drain that
quiets 10,000 children at once costs 10,000 queue entries, not 20,000 pykka
envelopes that outlive young garbage collections):

* ``Quiescent(activation)`` -- something changed that may let the Activation
  settle (its agent went idle, an owned child was released, an admission ended,
  a keep-warm delay ran out). If :func:`residency` says ``settled`` -- checked
  under the registry lock, so no admission can slip in between -- and no keep-warm
  delay holds it, the Activation leaves the registry and its agent is disposed
  (after a best-effort flush of its session).
* ``Released(activation)`` -- the agent handle is disposed. The supervisor
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
from collections import deque
from typing import Any, Protocol

import pykka

from ._activation import Activation, residency

__all__ = ["Notices", "Quiescent", "Released", "SupervisorHooks", "supervisor_actor_class"]

logger = logging.getLogger("subagents")


class Quiescent:
    __slots__ = ("activation",)

    def __init__(self, activation: Activation) -> None:
        self.activation = activation


class Released:
    __slots__ = ("activation",)

    def __init__(self, activation: Activation) -> None:
        self.activation = activation


class _Drain:
    """The one mailbox message: drain the notices queued so far."""

    __slots__ = ()


_DRAIN = _Drain()


class Notices:
    """``Quiescent``/``Released`` notices for one supervisor, FIFO, from any thread.

    ``post`` appends, then schedules a drain unless one is pending; the supervisor
    clears the pending flag *before* it pops. So a notice either lands in a drain
    already scheduled (its append precedes the flag read that saw it pending,
    which precedes the clear, which precedes the pops) or schedules its own.
    """

    __slots__ = ("_items", "_lock", "_ref", "_scheduled")

    def __init__(self) -> None:
        self._items: deque[Quiescent | Released] = deque()
        self._lock = threading.Lock()
        self._scheduled = False
        self._ref: Any = None

    def bind(self, ref: Any) -> None:
        """The supervisor's actor ref (set once, before the first ``post``)."""
        self._ref = ref

    def post(self, notice: Quiescent | Released) -> None:
        self._items.append(notice)
        with self._lock:
            already = self._scheduled
            self._scheduled = True
        if already:
            return
        with contextlib.suppress(pykka.ActorDeadError):  # closing: nobody settles now
            self._ref.tell(_DRAIN)

    def _take(self) -> deque[Quiescent | Released]:
        with self._lock:
            self._scheduled = False
        return self._items


class SupervisorHooks(Protocol):
    """What the supervisor needs from the continuation manager."""

    lock: Any

    def begin_settle(self, activation: Activation) -> None:
        """Remove from the registry (lock held) -- the Activation is settling."""

    def dispose_async(self, activation: Activation) -> None:
        """Start disposing the agent handle; ``Released`` follows."""

    def on_released(self, activation: Activation) -> None:
        """Contributions revoked, ``subagent/end`` emitted, registry updated."""

    def keep_warm(self, activation: Activation) -> bool:
        """True to keep a settled Activation resident a while longer (lock held);
        the hooks then send ``Quiescent`` again when the delay has passed."""


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

            def _handle(self, message: Any) -> None:
                if isinstance(message, Quiescent):
                    _settle_if_ready(self._hooks, message.activation)
                elif isinstance(message, Released):
                    parent = _release(self._hooks, message.activation)
                    if parent is not None:
                        _settle_if_ready(self._hooks, parent)

            def on_receive(self, message: Any) -> Any:
                # Every message first drains the notices posted before it, so a
                # callable sent after some notices (a test barrier) runs after them.
                items = self._notices._take()
                while items:
                    self._handle(items.popleft())
                if message is _DRAIN:
                    return None
                if callable(message):
                    message()
                else:
                    self._handle(message)
                return None

        _Supervisor.__name__ = f"Supervisor[{base.__name__}]"
        cls = _CLASSES[base] = _Supervisor
    return cls
