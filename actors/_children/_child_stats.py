"""``runtime.subagents.statistics(child_id)``: one continuable child, as this runtime
sees it -- its Activation's phase, the children it owns, its durable inbox, and,
resident here, its agent's :class:`~subagents.actors.AgentStatistics`.

Read-only and unauthorised, as ``subagents tree`` reads the store: it changes
nothing and grants nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from subagents.actors._agents import Agent, AgentStatistics, SessionService
from subagents.protocol import ErrorCode, SessionId, SubagentError

from ._continuation import ContinuationManager
from ._placed import PlacedChild

__all__ = ["ChildStatistics", "child_statistics"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildStatistics:
    """A snapshot of one continuable child.

    Attributes:
        child_id: the child's session.
        phase: its Activation's phase here -- ``reserved``, ``resident``,
            ``draining``, ``settling``, ``released`` (its epoch just ended, the
            Activation not yet gone) -- or ``absent`` when this runtime has none
            (settled, or resident in another process).
        placed: it runs on another host (a placement), this runtime keeps its
            Activation.
        owned_children: its published children not yet released.
        durable_inbox: accepted messages the store holds for it (strict
            durability), whether or not it is resident; ``None`` under relaxed.
        max_inbox: its inbox's bound (``None``: unbounded).
        agent: its agent's statistics when it is resident in this process.
    """

    child_id: SessionId
    phase: str
    placed: bool
    owned_children: int
    durable_inbox: int | None
    max_inbox: int | None
    agent: AgentStatistics | None


def child_statistics(
    continuation: ContinuationManager, sessions: SessionService, child_id: SessionId | str
) -> ChildStatistics:
    """See the module docstring.

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` (not a session id, or not a subagent's
            session), ``SESSION_NOT_FOUND``.
    """
    sid = SessionId(child_id)
    header = sessions.header(sid)
    if header is None:
        raise SubagentError(f"no session {sid}", code=ErrorCode.SESSION_NOT_FOUND)
    if header.parent_session is None:
        raise SubagentError(
            f"session {sid} is a top-level agent: use its agent's statistics()",
            code=ErrorCode.INVALID_ARGUMENT,
        )
    act = continuation.index.get(sid)
    holder = act.agent if act is not None else None
    agent = holder.statistics() if isinstance(holder, Agent) and not holder.disposed else None
    if agent is not None:
        durable = agent.durable_inbox
    elif sessions.strict and sessions.persistence is not None:
        durable = len(sessions.pending(sid))
    else:
        durable = None
    return ChildStatistics(
        child_id=sid,
        phase="absent" if act is None else act.phase.name.lower(),
        placed=isinstance(holder, PlacedChild),
        owned_children=0 if act is None else len(act.owned),
        durable_inbox=durable,
        max_inbox=header.max_inbox,
        agent=agent,
    )
