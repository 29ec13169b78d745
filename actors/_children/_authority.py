"""The registry's decisions of authority: drain cutoffs and interrupts.

Mixed into the registry actor (:class:`~._admission.Registry`), whose state they
read and write -- in its own context, like every other handler of it.
"""

from __future__ import annotations

from typing import Any

from subagents.actors._agents import Agent, AgentRegistry
from subagents.protocol import ErrorCode, SessionId, SubagentError
from subagents.supervision import INTERRUPTIBLE, Activation, Phase, Trigger, advance
from subagents.supervision import Latch as ActivationLatch

from ._requests import RemoteAncestor
from ._types import AncestorAuthority, UserAuthority

__all__ = ["Authority"]


class Authority:
    """Cutoffs and interrupt authority (the registry provides the members below)."""

    index: dict[SessionId, Activation]
    _cutoffs: dict[SessionId, Agent]
    _agents: AgentRegistry

    # -- drain cutoffs -----------------------------------------------------------------

    def _cutoff(
        self, parents: tuple[Agent, ...], inclusive: bool = False
    ) -> tuple[list[Activation], list[tuple[Activation, ActivationLatch]]]:
        for parent in parents:
            self._cutoffs[parent.session_id] = parent
        forest: list[Activation] = []
        pending: list[tuple[Activation, ActivationLatch]] = []
        # One pass over every Activation: the members an Enum class attribute lookup
        # would fetch (slowly, through EnumType's __getattr__) are taken once.
        reserved, resident = Phase.RESERVED, Phase.RESIDENT
        after = advance(resident, Trigger.CUTOFF)
        only = parents[0] if len(parents) == 1 else None
        for act in self.index.values():
            lineage = act.lineage
            below = only in lineage if only is not None else any(p in lineage for p in parents)
            if not below and not (inclusive and any(p is act.agent for p in parents)):
                continue
            phase = act.phase
            if phase is reserved:
                pending.append((act, act.admitted))  # (its latch: replaced once admitted)
                continue
            if phase is resident:
                act.drained = True
                act.phase = after
                act.agent.close_admission()  # after the phase: see the module docstring
            forest.append(act)
        return forest, pending

    def _end_cutoff(self, parent: Agent) -> None:
        if self._cutoffs.get(parent.session_id) is parent:
            del self._cutoffs[parent.session_id]

    # -- interrupt authority -----------------------------------------------------------

    def _interrupt(
        self, target: SessionId, authority: UserAuthority | AncestorAuthority | RemoteAncestor
    ) -> tuple[Any, str, SessionId | None] | None:
        act = self.index.get(target)
        if act is None or act.phase not in INTERRUPTIBLE:
            return None  # an absent target is an accepted no-op
        if isinstance(authority, RemoteAncestor):  # checked by the caller (interrupt_asked)
            return act.agent, "ancestor", authority.session_id
        if isinstance(authority, UserAuthority):
            try:
                ok = SessionId(authority.parent_session_id) == act.parent_session
            except SubagentError:
                ok = False
            kind, by = "user", act.parent_session if ok else None
        else:
            agent = authority.agent
            ok = (
                isinstance(agent, Agent)
                and agent is not act.agent
                and any(agent is a for a in act.lineage)
                and self._agents.is_live(agent)
            )
            kind, by = "ancestor", agent.session_id if ok else None
        if not ok:
            raise SubagentError(
                "not authorized to interrupt this child", code=ErrorCode.UNAUTHORIZED
            )
        return act.agent, kind, by
