"""The Activation record and the residency table.

An :class:`Activation` is one residency epoch of a continuable child: the
resident agent (whose actor mailbox is the child's FIFO inbox), the durable
parent it answers to, the materialization lineage (the exact agents above it when
it was materialized), the child session ids it owns, and the epoch's lifecycle
run id. It is born ``RESERVED`` when a materialization is admitted and ends
``RELEASED`` (see :mod:`._phase`).

Each field has exactly one writer, named in the class docstring; everyone else
only reads, and a reader that acts on what it read has the owner confirm it.

Residency is *derived*, never stored: :func:`residency` is the single table that
says whether an Activation is running, waiting or settled.

=============================================  ============
condition                                      residency
=============================================  ============
an admission in flight, or the agent not idle  ``running``
idle, owns at least one undisposed child       ``waiting``
idle, owns no undisposed child                 ``settled``
=============================================  ============
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from subagents.protocol import RunId, SessionId

from ._phase import Phase

__all__ = ["Activation", "Latch", "Residency", "ResidentAgent", "residency"]

Residency = Literal["running", "waiting", "settled"]


class ResidentAgent(Protocol):
    """What supervision needs from an agent (the actors layer provides it)."""

    @property
    def session_id(self) -> SessionId:
        """The agent's session id."""

    @property
    def idle(self) -> bool:
        """Whether no turn runs or waits."""

    def cancel(self, cause: Any = None, *, keep_inbox: bool = True) -> None:
        """Cancel the agent's running turn (``keep_inbox``: keep the queued ones)."""


class Latch(Protocol):
    """A one-shot event: set once, waited on by anyone."""

    def set(self) -> None:
        """Set it, waking every waiter."""

    def is_set(self) -> bool:
        """Whether it was set."""

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until it is set; False on timeout."""


class Activation:
    """One residency epoch of a continuable child.

    Writers:

    * fixed at construction: ``child_id``, ``parent_session``,
      ``parent_activation``, ``lineage``, ``depth``, ``admitted``, ``released``;
    * the **registry actor**: ``phase``, ``agent`` (set once, at publication),
      ``provider``, ``run_id``, ``admissions`` (materializations of its children
      in flight), ``owned`` (its published children not yet released: recorded
      at admission, before a child can run), ``drained``, ``waiters``
      (follow-ups queued behind a materialization or a release), ``replayed``
      (the ids of the pending messages its agent was resumed with);
    * latches, set once: ``admitted`` by the registry when the materialization
      publishes or rolls back, ``released`` once the end of the epoch is announced;
    * ``announced``: the actors layer's record of what of the epoch's lifecycle
      pair was announced (it orders ``subagent/start`` before ``subagent/end``);
      ``span``: the epoch's tracing span, when the runtime traces (written with
      ``announced``).

    The supervisor writes none of it: it *decides* from it (residency, keep-warm,
    release order) and the registry confirms against its own state.
    """

    __slots__ = (
        "admissions",
        "admitted",
        "agent",
        "announced",
        "child_id",
        "depth",
        "drained",
        "lineage",
        "owned",
        "parent_activation",
        "parent_session",
        "phase",
        "provider",
        "released",
        "replayed",
        "run_id",
        "span",
        "waiters",
    )

    def __init__(
        self,
        child_id: SessionId,
        *,
        parent_session: SessionId,
        parent_activation: Activation | None,
        lineage: tuple[Any, ...],
        admitted: Latch,
        released: Latch,
    ) -> None:
        self.child_id = child_id
        self.parent_session = parent_session
        self.parent_activation = parent_activation
        self.lineage = lineage  # exact agents above, nearest first
        self.depth = len(lineage)
        self.admitted = admitted
        self.released = released
        self.phase = Phase.RESERVED
        self.agent: Any = None
        self.provider = ""
        self.run_id: RunId | None = None
        self.admissions = 0
        self.drained = False
        self.waiters: list[Any] | None = None  # allocated when the first one queues
        self.replayed: frozenset[Any] = _NONE
        # Its published children not yet released: one shared empty frozenset
        # until it owns one (an empty set is 216 bytes, most children own none).
        self.owned: set[SessionId] | frozenset[SessionId] = _NONE
        self.announced = 0
        self.span: Any = None

    def own(self, child_id: SessionId) -> None:
        """Record a published child (the registry, before the child can run)."""
        owned = self.owned
        if type(owned) is not set:
            self.owned = owned = set()
        owned.add(child_id)

    def disown(self, child_id: SessionId) -> bool:
        """Drop a released child; True when it owns none any more."""
        owned = self.owned
        if type(owned) is set:
            owned.discard(child_id)
            if owned:
                return False
            self.owned = _NONE  # a set keeps its table when emptied
        return True

    def __repr__(self) -> str:
        state = residency(self) if self.agent is not None else "-"
        return f"<Activation {self.child_id} {self.phase.name} {state} owned={len(self.owned)}>"


_NONE: frozenset[Any] = frozenset()


def residency(activation: Activation) -> Residency:
    """The residency table (see the module docstring).

    Everything it reads belongs to the registry or the agent: the supervisor reads
    it as a hint, and the registry checks it again, atomically with the agent's
    own gate, before it lets an Activation retire.
    """
    agent = activation.agent
    if activation.admissions > 0 or agent is None or not agent.idle:
        return "running"
    if activation.owned:
        return "waiting"
    return "settled"
