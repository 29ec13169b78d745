"""What a behaviour sees during one turn.

A :class:`Turn` is created by the agent's actor for each FIFO turn and handed to
the behaviour. It carries the delivered message (exactly one: a follow-up, the
initial prompt, or a waking report), the quiet reports injected as context since
the previous turn, the cancellation signal, the session history before the turn
(model history: descriptors are log-only and absent), and the agent's own service
bound as parent (:class:`BoundSubagents`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from subagents.actors._kernel._signal import AbortController, AbortSignal
from subagents.protocol import (
    Event,
    MessageId,
    MessageSource,
    SessionId,
    SubagentDescriptorEvent,
)

if TYPE_CHECKING:
    from subagents.actors._children._types import ContinuableHandle, RunResult, SubagentRun

    from ._agent import Agent

__all__ = ["BoundSubagents", "Message", "Turn"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One delivered message: ``kind`` is ``"message"`` or ``"report"``."""

    message_id: MessageId
    content: Any
    source: MessageSource | None = None
    kind: str = "message"


class Turn:
    """The behaviour's view of one running turn (valid only while it runs)."""

    __slots__ = ("_agent", "_controller", "_delivered", "_history_through", "context", "index")

    def __init__(
        self,
        agent: Agent,
        index: int,
        delivered: Any,
        context: tuple[Message, ...],
        history_through: int,
    ) -> None:
        self._agent = agent
        self.index = index
        self._delivered = delivered  # the inbox envelope: id, content, source, kind
        self.context = context
        self._history_through = history_through  # last seq before this turn began
        self._controller: AbortController | None = None

    @property
    def messages(self) -> tuple[Message, ...]:
        """The message(s) this turn claimed (one: a follow-up, prompt or waking report)."""
        d = self._delivered
        return (Message(message_id=d.message_id, content=d.content, source=d.source, kind=d.kind),)

    @property
    def agent(self) -> Agent:
        """The agent running this turn."""
        return self._agent

    @property
    def content(self) -> Any:
        """Content of the delivered message."""
        return self._delivered.content

    @property
    def signal(self) -> AbortSignal:
        """Aborted when the turn is cancelled (interrupt, dispose, run abort)."""
        return self._agent._turn_controller(self).signal

    @property
    def cancelled(self) -> bool:
        controller = self._controller
        return controller is not None and controller.signal.aborted

    @property
    def history(self) -> tuple[Event, ...]:
        """Session events before this turn, without log-only descriptor events."""
        records = self._agent._runtime.sessions.read(self._agent.session_id)
        return tuple(
            r.event
            for r in records
            if r.seq <= self._history_through and not isinstance(r.event, SubagentDescriptorEvent)
        )

    @property
    def persona(self) -> str | None:
        return self._agent.options.persona

    @property
    def tools(self) -> tuple[str, ...]:
        """Names of the tools this agent may call (after its tool filter)."""
        return self._agent._runtime.tools.visible(self._agent)

    def call_tool(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        """Call a tool registered on the runtime, if this agent's filter allows it.

        Raises:
            SubagentError: ``UNAUTHORIZED`` when filtered out, ``INVALID_ARGUMENT``
                when no such tool exists.
        """
        return self._agent._runtime.tools.call(self._agent, name, self, *args, **kwargs)

    @property
    def subagents(self) -> BoundSubagents:
        """This agent's service, bound as the delegating parent."""
        return BoundSubagents(self._agent, self)


class BoundSubagents:
    """``runtime.subagents`` with the turn's agent bound as parent.

    One-shot calls default their cancellation signal to the turn's signal, so
    cancelling the turn cancels the delegated run.
    """

    __slots__ = ("_agent", "_turn")

    def __init__(self, agent: Agent, turn: Turn | None = None) -> None:
        self._agent = agent
        self._turn = turn

    def _signal(self, signal: AbortSignal | None) -> AbortSignal:
        if signal is not None:
            return signal
        return self._turn.signal if self._turn is not None else AbortSignal.never()

    def start(
        self, provider: str, prompt: Any, *, signal: AbortSignal | None = None, **fields: Any
    ) -> SubagentRun:
        """Start a one-shot child (see ``SubagentService.start``)."""
        from subagents.actors._children._types import SubagentStartRequest

        request = SubagentStartRequest(
            parent=self._agent, prompt=prompt, signal=self._signal(signal), **fields
        )
        return self._agent._runtime.subagents.start(provider, request)

    def delegate(
        self,
        provider: str,
        prompt: Any,
        *,
        signal: AbortSignal | None = None,
        timeout: float | None = None,
        **fields: Any,
    ) -> RunResult:
        """Start a one-shot child, wait for its result, dispose it, return the result."""
        run = self.start(provider, prompt, signal=signal, **fields)
        try:
            return run.result.get(timeout=timeout)
        finally:
            run.dispose()

    def start_continuable(
        self, provider: str, prompt: Any, *, label: str, **fields: Any
    ) -> ContinuableHandle:
        """Start a continuable child; returns ``(child_id, message_id)``."""
        from subagents.actors._children._types import ContinuableStartSpec

        spec = ContinuableStartSpec(
            parent=self._agent, provider=provider, prompt=prompt, label=label, **fields
        )
        return self._agent._runtime.subagents.start_continuable(spec)

    def followup(self, child_id: SessionId | str, content: Any, **kwargs: Any) -> MessageId:
        """Follow up a continuable child of this agent."""
        return self._agent._runtime.subagents.followup(self._agent, child_id, content, **kwargs)

    def report(self, content: Any, *, delivery: str = "quiet", **kwargs: Any) -> MessageId:
        """Report to this (continuable) agent's direct parent."""
        return self._agent._runtime.subagents.report_from(
            self._agent, content, delivery=delivery, **kwargs
        )

    def interrupt(self, child_id: SessionId | str) -> None:
        """Interrupt a continuable descendant's current turn (as its ancestor)."""
        from subagents.actors._children._types import AncestorAuthority

        self._agent._runtime.subagents.interrupt(child_id, AncestorAuthority(self._agent))
