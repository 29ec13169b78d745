"""The built-in providers: ``local`` (spawn, fresh history) and ``fork``.

Both run the child in this process as an ordinary agent with its own session.
``fork`` seeds the child's log with the parent's completed history (every event
through the parent's last ``turn/end``); ``local`` starts it empty.
``inherits_parent_context`` only describes that difference: it grants nothing.

``start`` publishes the child (session live, agent registered), delivers the
prompt with the descriptor appended inside the initial turn, and returns the run.
Until it returns, every failure -- including an abort of the request's signal --
rolls the child back completely (agent disposed and unregistered, session
discarded from the live set and from persistence) before the error propagates.

A request with a ``message_id`` takes effect once: the child's id derives from
the parent's and the message id, and a start again finds the earlier child --
its recorded outcome when its run completed, else it runs once more
(:mod:`._once`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from subagents.actors._agents import Agent, TurnOutcome
from subagents.actors._kernel import ResultFuture
from subagents.protocol import (
    ErrorCode,
    Event,
    MessageId,
    OneShotDescriptor,
    SessionId,
    SubagentError,
    descriptor_event,
    new_session_id,
)

from ._child import ChildContext, child_options, completed_history, create_child
from ._once import earlier_run
from ._types import (
    ContinuableCreateSpec,
    ContinuableStartSpec,
    RunResult,
    SubagentRun,
    SubagentStartRequest,
)

__all__ = ["ForkProvider", "LocalProvider"]

logger = logging.getLogger("subagents")

#: How long a rollback waits for the child's turn to end at its cancellation.
ROLLBACK_TIMEOUT = 30.0


class LocalProvider:
    """Runs one-shot children in this process with a fresh history."""

    capabilities = frozenset({"output_schema", "depth_limit", "tool_filter", "persona"})
    inherits_parent_context = False

    def __init__(self, runtime: ChildContext, name: str = "local") -> None:
        self.name = name
        self._runtime = runtime

    def _step(self, step: str) -> None:
        """A named point of the start sequence (tests inject faults here)."""

    def _seed(self, parent: Agent | SessionId) -> tuple[Event, ...]:
        return ()

    def prepare_continuable(self, request: ContinuableStartSpec) -> ContinuableCreateSpec:
        """Data for a continuable child: the seed of its log (empty here, the
        parent's completed history for ``fork``). The manager does the rest.
        ``request.parent`` is the parent's id when the parent lives in another
        process (a start by its id): ``fork`` then reads its stored history."""
        parent = request.parent
        seed = self._seed(parent if isinstance(parent, Agent) else SessionId(parent))
        return ContinuableCreateSpec(seed=seed or None)

    def start(self, request: SubagentStartRequest, descriptor: OneShotDescriptor) -> SubagentRun:
        """Run the request as a one-shot child in this runtime (see :class:`SubagentProvider`)."""
        runtime = self._runtime
        parent = request.parent
        signal = request.signal
        assert signal is not None
        options, depth = child_options(
            parent,
            model=request.model,
            persona=request.persona,
            tool_filter=request.tool_filter,
            max_depth=request.max_depth,
            ceiling=runtime.max_delegation_depth,
        )
        runtime.models.require(options.model)
        mid = None if request.message_id is None else MessageId(request.message_id)
        child_id = new_session_id()
        if mid is not None:  # the start once per id (see ``_once.py``)
            earlier, child_id = earlier_run(runtime.sessions, parent.session_id, mid)
            if earlier is not None:
                return earlier
        seed = self._seed(parent)
        self._step("create")
        child = create_child(
            runtime,
            parent,
            child_id=child_id,
            label=descriptor.label,
            depth=depth,
            options=options,
            seed=seed,
            output_schema=request.output_schema,
            now=False,  # best-effort, as the specification has a one-shot session
        )
        # Its prompt is in no inbox and nobody resumes it: a closing runtime keeps
        # nothing of it (its turn's end says it does not run again).
        child._turns.one_shot = True
        result: ResultFuture[RunResult] = ResultFuture()
        remove_listener: Callable[[], None] | None = None
        try:
            self._step("published")

            def on_end(outcome: TurnOutcome) -> None:
                result.set_result(
                    RunResult(outcome.output, outcome.structured, outcome.stop_reason)
                )

            child.deliver(
                request.prompt,
                parent.parent_source,
                extra=(descriptor_event(descriptor),),
                on_end=on_end,
                message_id=mid,
            )
            self._step("delivered")
            remove_listener = signal.add_listener(
                lambda reason: child.cancel(reason, keep_inbox=False)
            )
            signal.raise_if_aborted()
            self._step("return")
        except BaseException:
            if remove_listener is not None:
                remove_listener()
            _rollback(runtime, child)
            raise
        return SubagentRun(
            id=child.session_id,
            local_agent=child,
            result=result,
            dispose=_disposer(child, result, remove_listener),
        )


class ForkProvider(LocalProvider):
    """Runs one-shot children that see the parent's completed history."""

    inherits_parent_context = True

    def __init__(self, runtime: ChildContext, name: str = "fork") -> None:
        super().__init__(runtime, name)

    def _seed(self, parent: Agent | SessionId) -> tuple[Event, ...]:
        return completed_history(self._runtime.sessions, parent)


def _rollback(runtime: ChildContext, child: Agent) -> None:
    """Undo a published-but-not-returned child: nothing may remain. Its session is
    deleted even when its turn outlives the cancel (the dispose's ``TIMEOUT``,
    logged: the caller raises what made it roll back); that turn's last writes
    then fail, as a deleted session's do."""
    try:
        child.dispose(flush=False, timeout=ROLLBACK_TIMEOUT)
    except SubagentError as exc:
        if exc.code != ErrorCode.TIMEOUT:
            raise
        logger.warning("rolling back %s: %s; its session is deleted now", child.session_id, exc)
    finally:
        runtime.sessions.discard(child._session)


def _disposer(
    child: Agent, result: ResultFuture[RunResult], remove_listener: Callable[[], None] | None
) -> Callable[[float | None], None]:
    """The run's release. :class:`SubagentRun` calls it once (a concurrent dispose
    waits for the first), so it takes no lock: it waits for the result and for the
    child's stop, and a plain lock held across those waits would stop the whole
    thread under gevent as soon as another greenlet of it asked for the lock."""

    def dispose(timeout: float | None) -> None:
        if remove_listener is not None:
            remove_listener()
        child.cancel("disposed", keep_inbox=False)
        if not result.wait(timeout):
            raise SubagentError(
                f"run {child.session_id} did not settle within {timeout} s",
                code=ErrorCode.TIMEOUT,
            )
        child.dispose(timeout=timeout)

    return dispose
