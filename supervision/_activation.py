"""The Activation record and the residency table.

An :class:`Activation` is one residency epoch of a continuable child: the
resident agent (whose actor mailbox is the child's FIFO inbox), the durable
parent it answers to, the materialization lineage (the exact agents above it when
it was materialized), the set of child session ids it owns, and the epoch's
lifecycle run id.

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

__all__ = ["Activation", "Residency", "ResidentAgent", "residency"]

Residency = Literal["running", "waiting", "settled"]


class ResidentAgent(Protocol):
    """What supervision needs from an agent (the actors layer provides it)."""

    @property
    def session_id(self) -> SessionId: ...

    @property
    def idle(self) -> bool: ...

    def cancel(self, cause: Any = None, *, keep_inbox: bool = True) -> None: ...


class Activation:
    """One residency epoch of a continuable child (mutated under the registry lock)."""

    __slots__ = (
        "admissions",
        "agent",
        "depth",
        "draining",
        "lineage",
        "owned",
        "parent_activation",
        "parent_session",
        "provider",
        "released",
        "run_id",
        "settling",
    )

    def __init__(
        self,
        agent: Any,
        *,
        parent_session: SessionId,
        parent_activation: Activation | None,
        lineage: tuple[Any, ...],
        provider: str,
        run_id: RunId,
        released: Any,
    ) -> None:
        self.agent = agent
        self.parent_session = parent_session
        self.parent_activation = parent_activation
        self.lineage = lineage  # exact agents above, nearest first
        self.depth = len(lineage)
        self.provider = provider
        self.run_id = run_id
        self.owned: set[SessionId] = set()
        self.admissions = 0
        self.settling = False
        self.draining = False
        self.released = released  # an event set once the agent handle is disposed

    @property
    def child_id(self) -> SessionId:
        sid: SessionId = self.agent.session_id
        return sid

    def __repr__(self) -> str:
        return f"<Activation {self.child_id} {residency(self)} owned={len(self.owned)}>"


def residency(activation: Activation) -> Residency:
    """The residency table (see the module docstring)."""
    if activation.admissions > 0 or not activation.agent.idle:
        return "running"
    if activation.owned:
        return "waiting"
    return "settled"
