"""The agent registry (``runtime.agents``): the live agent of each session.

The agent registry maps a session id to the one live :class:`Agent` for it. "Exact
live" checks in the service compare identity: a disposed agent, or an older agent
for a session that has since been resumed by another, is not live.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from subagents.protocol import (
    ContinuableDescriptor,
    DescriptorFold,
    ErrorCode,
    Event,
    SessionHeader,
    SessionId,
    SubagentError,
    TurnStart,
    parse_descriptor_payload,
    try_fold_subagent_descriptor,
)

from ._agent import Agent
from ._behaviours import Behaviour, ModelRegistry, as_behaviour
from ._host import AgentHost
from ._live import LiveSession
from ._options import AgentOptions
from ._turn import Turn

__all__ = ["AgentRegistry"]


def _as_session_id(value: Any) -> SessionId:
    return value if type(value) is SessionId else SessionId(value)


class AgentRegistry:
    """Live agents by session id (the seed's ``ctx.agents``). Thread-safe."""

    def __init__(self, host: AgentHost, models: ModelRegistry) -> None:
        self._host = host
        self._models = models
        self._lock = threading.Lock()
        self._agents: dict[SessionId, Agent] = {}

    def create(
        self,
        *,
        header: SessionHeader,
        options: AgentOptions,
        behaviour: Behaviour | Callable[[Turn], Any] | None = None,
        seed: Sequence[Event] = (),
        output_schema: Any = None,
    ) -> Agent:
        """Open a new session and start its agent, registered and live.

        ``seed`` becomes the first part of the log (a fork's parent history).

        Raises:
            SubagentError: ``MODEL_NOT_FOUND``, ``SESSION_EXISTS``.
        """
        built = (
            as_behaviour(behaviour)
            if behaviour is not None
            else self._models.create(options.model, options)
        )
        with self._lock:
            if header.id in self._agents:
                raise SubagentError(
                    f"an agent for {header.id} is live", code=ErrorCode.SESSION_EXISTS
                )
        sessions = self._host.sessions
        next_turn = sum(1 for e in seed if isinstance(e, TurnStart))
        agent = self._start(
            sessions.open(header, seed), built, options, next_turn, output_schema, sessions.discard
        )
        self._register(agent)
        return agent

    def resume(
        self,
        session_id: SessionId | str,
        *,
        behaviour: Behaviour | Callable[[Turn], Any] | None = None,
        options: AgentOptions | None = None,
        output_schema: Any = None,
    ) -> Agent:
        """Rebuild a persisted agent from its log and make it live again.

        A subagent's options come from its folded descriptor (model, provider,
        persona, tool filter); a top-level agent needs ``options`` or
        ``behaviour``.

        Raises:
            SubagentError: ``PERSISTENCE_UNAVAILABLE``, ``SESSION_NOT_FOUND``,
                ``SESSION_EXISTS`` (already live), ``DESCRIPTOR_CORRUPT`` /
                ``DESCRIPTOR_UNSUPPORTED``, ``MODEL_NOT_FOUND``.
        """
        sid = _as_session_id(session_id)
        if self.get(sid) is not None:
            raise SubagentError(
                f"an agent for {sid} is already live", code=ErrorCode.SESSION_EXISTS
            )
        header, next_seq, state, records = self._host.sessions.load_state(sid)
        events = [r.event for r in records]
        fold = _fold(state, events)
        if options is None:
            options = self._options_from_fold(fold, sid, behaviour)
        built = (
            as_behaviour(behaviour)
            if behaviour is not None
            else self._models.create(options.model, options)
        )
        next_turn = (state or {}).get("next_turn", 0) + sum(
            1 for e in events if isinstance(e, TurnStart)
        )
        sessions = self._host.sessions
        agent = self._start(
            sessions.attach(header, next_seq),
            built,
            options,
            next_turn,
            output_schema,
            sessions.release,
        )
        if fold.verdict == "ok" and isinstance(fold.descriptor, ContinuableDescriptor):
            agent._descriptor = fold.descriptor
        if state is not None and not any(isinstance(e, TurnStart) for e in events):
            agent._restore_context(state.get("context"))
        try:
            self._register(agent)
        except BaseException:
            agent.dispose(flush=False)
            raise
        return agent

    def _start(
        self,
        session: LiveSession,
        behaviour: Behaviour,
        options: AgentOptions,
        next_turn: int,
        output_schema: Any,
        undo: Callable[[LiveSession], object],
    ) -> Agent:
        """Start the agent of ``session``; ``undo(session)`` if it cannot start."""
        try:
            return Agent(
                self._host,
                session,
                behaviour,
                options,
                next_turn=next_turn,
                output_schema=output_schema,
            )
        except BaseException:
            undo(session)
            raise

    def resume_continuable(self, session_id: SessionId) -> tuple[Agent, ContinuableDescriptor]:
        """Cold-resume a continuable child from its folded descriptor alone.

        Raises:
            SubagentError: ``DESCRIPTOR_CORRUPT`` / ``DESCRIPTOR_UNSUPPORTED``, or
                ``UNAUTHORIZED`` when the session is not a continuable child.
        """
        agent = self.resume(session_id)
        if not isinstance(agent._descriptor, ContinuableDescriptor):
            agent.dispose(flush=False)
            raise SubagentError(
                f"session {session_id} is not a continuable child", code=ErrorCode.UNAUTHORIZED
            )
        return agent, agent._descriptor

    @staticmethod
    def _options_from_fold(fold: Any, sid: SessionId, behaviour: Any) -> AgentOptions:
        if fold.verdict == "ok" and isinstance(fold.descriptor, ContinuableDescriptor):
            d = fold.descriptor
            return AgentOptions(
                model=d.model,
                provider=d.agent_provider,
                persona=d.persona,
                tool_filter=d.tool_filter,
            )
        if fold.verdict in ("corrupt", "unsupported"):
            code = (
                ErrorCode.DESCRIPTOR_CORRUPT
                if fold.verdict == "corrupt"
                else ErrorCode.DESCRIPTOR_UNSUPPORTED
            )
            raise SubagentError(
                f"session {sid} has a {fold.verdict} descriptor: {fold.reason}", code=code
            )
        if behaviour is not None:
            return AgentOptions()
        raise SubagentError(
            f"session {sid} records no model; pass options= or behaviour=",
            code=ErrorCode.MODEL_NOT_FOUND,
        )

    def _register(self, agent: Agent) -> None:
        with self._lock:
            if agent.session_id in self._agents:
                raise SubagentError(
                    f"an agent for {agent.session_id} is live", code=ErrorCode.SESSION_EXISTS
                )
            self._agents[agent.session_id] = agent

    def _unregister(self, agent: Agent) -> None:
        with self._lock:
            if self._agents.get(agent.session_id) is agent:
                del self._agents[agent.session_id]

    def get(self, session_id: SessionId | str) -> Agent | None:
        """The live agent for ``session_id``, or None."""
        try:
            sid = _as_session_id(session_id)
        except SubagentError:
            return None
        return self._agents.get(sid)

    def is_live(self, agent: object) -> bool:
        """True when ``agent`` is exactly the registered agent of its session."""
        return (
            isinstance(agent, Agent)
            and self._agents.get(agent.session_id) is agent
            and not agent.disposed
        )

    def list(self) -> list[Agent]:
        """Every live agent."""
        with self._lock:
            return list(self._agents.values())


def _fold(state: dict[str, Any] | None, events: list[Event]) -> DescriptorFold:
    """Fold the descriptor from a checkpoint plus the events after it (last wins)."""
    fold = try_fold_subagent_descriptor(events)
    if fold.verdict != "absent" or state is None or state.get("descriptor") is None:
        return fold
    try:
        return DescriptorFold(
            verdict="ok", descriptor=parse_descriptor_payload(state["descriptor"])
        )
    except SubagentError as exc:
        if exc.code == ErrorCode.DESCRIPTOR_UNSUPPORTED:
            return DescriptorFold(verdict="unsupported", reason=str(exc))
        return DescriptorFold(verdict="corrupt", reason=str(exc))
