"""``start(name, request)``: a one-shot child through a named provider.

The service validates the request (types, the required signal, the capabilities
it asks for) and snapshots the one-shot descriptor *before* any provider work,
hands both to the provider -- which publishes the child or raises after rolling
back -- and opens the run's ``subagent/start`` / ``subagent/end`` pair. When the
runtime traces, the run is a ``subagents.run`` span, current while the provider
starts it (the child's prompt carries it) and ended when the result settles.
"""

from __future__ import annotations

from typing import Any

from subagents.actors._agents import AgentRegistry
from subagents.actors._kernel import Telemetry
from subagents.protocol import (
    ErrorCode,
    OneShotDescriptor,
    SubagentError,
    error_text,
    snapshot_subagent_descriptor,
)

from ._events import EventBus
from ._provider_registry import ProviderRegistry
from ._types import SubagentRun, SubagentStartRequest
from ._validate import bad, check_start_request

__all__ = ["start_oneshot"]


def start_oneshot(
    agents: AgentRegistry,
    providers: ProviderRegistry,
    events: EventBus,
    telemetry: Telemetry | None,
    name: str,
    request: SubagentStartRequest,
) -> SubagentRun:
    """See :meth:`SubagentService.start`."""
    if type(name) is not str:
        raise bad("a provider name is a str")
    check_start_request(request)
    if not agents.is_live(request.parent):
        raise SubagentError("request.parent is not a live agent", code=ErrorCode.AGENT_DISPOSED)
    provider = providers.require(name)
    missing = _requested_capabilities(request) - provider.capabilities
    if missing:
        raise SubagentError(
            f"provider {name!r} does not support {sorted(missing)}",
            code=ErrorCode.CAPABILITY_UNSUPPORTED,
            hint=sorted(missing),
        )
    descriptor = snapshot_subagent_descriptor(OneShotDescriptor(provider=name, label=request.label))
    assert request.signal is not None
    request.signal.raise_if_aborted()
    parent = request.parent.session_id
    if telemetry is None:
        run = provider.start(request, descriptor)  # type: ignore[arg-type]
    else:
        attrs = {"parent_session_id": parent, "provider": name, "label": request.label}
        span = telemetry.start("subagents.run", attrs)
        try:
            with telemetry.current(span):
                run = provider.start(request, descriptor)  # type: ignore[arg-type]
        except BaseException as exc:
            Telemetry.end(span, "failed", error_text(exc))
            raise
        _end_with(span, run)
    if not isinstance(run, SubagentRun):
        raise SubagentError(f"provider {name!r} returned {type(run).__name__}, not a SubagentRun")
    events.open_run(name, run, parent, "one-shot")
    return run


def _end_with(span: Any, run: Any) -> None:
    """End the run's span when its result settles, with its stop reason."""
    if not isinstance(run, SubagentRun):
        Telemetry.end(span, "failed", "the provider returned no SubagentRun")
        return
    span.set_attribute("subagents.child_id", str(run.id))
    span.set_attribute("subagents.run_id", str(run.id))  # the same id, by its name

    def settled(future: Any) -> None:
        exc = future.exception(0)
        if exc is not None:
            Telemetry.end(span, "failed", error_text(exc))
        else:
            Telemetry.end(span, future.get(0).stop_reason)

    run.result.add_done_callback(settled)


def _requested_capabilities(request: SubagentStartRequest) -> frozenset[str]:
    wanted = set()
    if request.output_schema is not None:
        wanted.add("output_schema")
    if request.max_depth is not None:
        wanted.add("depth_limit")
    if request.tool_filter is not None:
        wanted.add("tool_filter")
    if request.persona is not None:
        wanted.add("persona")
    return frozenset(wanted)
