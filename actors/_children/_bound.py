"""``turn.subagents``: the subagent service with the turn's agent bound as parent."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from subagents.actors._catalog import Listing
from subagents.actors._kernel import AbortSignal
from subagents.actors._kernel._checks import check_timeout
from subagents.protocol import ErrorCode, MessageId, SessionId, SubagentError

from ._types import (
    AncestorAuthority,
    ContinuableHandle,
    ContinuableStartSpec,
    RunResult,
    SubagentRun,
    SubagentStartRequest,
)

if TYPE_CHECKING:
    from subagents.actors._agents import Agent, Steered, Turn

    from ._service import SubagentService

__all__ = ["BoundSubagents"]


class BoundSubagents:
    """``runtime.subagents`` with an agent bound as parent.

    One-shot calls default their cancellation signal to the turn's signal, so
    cancelling the turn cancels the delegated run.
    """

    __slots__ = ("_agent", "_service", "_turn")

    def __init__(self, service: SubagentService, agent: Agent, turn: Turn | None = None) -> None:
        self._service = service
        self._agent = agent
        self._turn = turn

    def _signal(self, signal: AbortSignal | None) -> AbortSignal:
        if signal is not None:
            return signal
        return self._turn.signal if self._turn is not None else AbortSignal.never()

    def start(
        self, provider: str, prompt: Any, *, signal: AbortSignal | None = None, **fields: Any
    ) -> SubagentRun:
        """Start a one-shot child (see ``SubagentService.start``); ``fields`` are
        :class:`SubagentStartRequest`'s (``INVALID_ARGUMENT`` for another name)."""
        request = _built(
            SubagentStartRequest,
            parent=self._agent, prompt=prompt, signal=self._signal(signal), **fields,
        )  # fmt: skip
        return self._service.start(provider, request)

    def delegate(
        self,
        provider: str,
        prompt: Any,
        *,
        signal: AbortSignal | None = None,
        timeout: float | None = None,
        **fields: Any,
    ) -> RunResult:
        """Start a one-shot child, wait for its result, dispose it, return the result.

        Raises:
            SubagentError: ``INVALID_ARGUMENT`` for a bad ``timeout`` (before any
                child is started), ``TIMEOUT``, and the errors of ``start``.
        """
        timeout = check_timeout(timeout)
        run = self.start(provider, prompt, signal=signal, **fields)
        try:
            return run.result.get(timeout=timeout)
        finally:
            run.dispose()

    def start_continuable(
        self, provider: str, prompt: Any, *, label: str, **fields: Any
    ) -> ContinuableHandle:
        """Start a continuable child; returns ``(child_id, message_id)``. ``fields``
        are :class:`ContinuableStartSpec`'s (``INVALID_ARGUMENT`` for another name)."""
        spec = _built(
            ContinuableStartSpec,
            parent=self._agent, provider=provider, prompt=prompt, label=label, **fields,
        )  # fmt: skip
        return self._service.start_continuable(spec)

    def followup(
        self, child_id: SessionId | str, content: Any, **kwargs: Any
    ) -> MessageId | Steered:
        """Follow up a continuable child of this agent (``steer=``: a :class:`Steered`)."""
        result: MessageId | Steered = self._service.followup(
            self._agent, child_id, content, **kwargs
        )
        return result

    def report(self, content: Any, *, delivery: str = "quiet", **kwargs: Any) -> MessageId:
        """Report to this (continuable) agent's direct parent."""
        return self._service.report_from(self._agent, content, delivery=delivery, **kwargs)

    def interrupt(self, child_id: SessionId | str) -> None:
        """Interrupt a continuable descendant's current turn (as its ancestor)."""
        self._service.interrupt(child_id, AncestorAuthority(self._agent))

    def hold_residency(self) -> Callable[[], None] | None:
        """Keep this agent resident, if it is a resident continuable child or a
        live top-level agent (one the sweep adopted is not let go meanwhile),
        until the returned release is called: for work it started that outlives
        its turns (a background run whose result comes back as a message). None
        for any other agent. Release it once that work ended, and when the agent
        is cancelled without ``keep_inbox`` (``Agent.add_cancel_listener``): a
        drain waits for the release."""
        return self._service.hold_residency(self._agent)

    def list_children(self, *, signal: AbortSignal | None = None) -> Listing:
        """This agent's direct session-backed children (``SubagentService.list_children``).

        The signal defaults to the turn's.
        """
        return self._service.list_children(self._agent.session_id, self._signal(signal))

    def list_descendants(self, *, signal: AbortSignal | None = None) -> Listing:
        """This agent's whole subtree in pre-order (``SubagentService.list_descendants``).

        The signal defaults to the turn's.
        """
        return self._service.list_descendants(self._agent.session_id, self._signal(signal))


def _built(cls: Any, **fields: Any) -> Any:
    """``cls(**fields)``; a field it does not have is the caller's mistake
    (``INVALID_ARGUMENT``, not the dataclass's ``TypeError``)."""
    try:
        return cls(**fields)
    except TypeError as exc:
        raise SubagentError(f"{cls.__name__}: {exc}", code=ErrorCode.INVALID_ARGUMENT) from None
