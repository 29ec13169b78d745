"""The options of one agent."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from subagents.protocol import Event, RecordedOptions, agent_options_event

__all__ = ["AgentOptions", "recorded_model"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentOptions:
    """Options of one agent.

    ``provider``/``model``/``persona``/``tool_filter`` are recorded explicitly in a
    continuable child's descriptor. ``subagent_depth`` may raise the persisted
    delegation depth, never lower it. ``depth_cap`` is the absolute delegation cap
    this agent and its descendants live under (set by a one-shot ``max_depth``).
    ``extensions`` is merge-extensible and never persisted.
    """

    model: str = "echo"
    provider: str = "local"
    persona: str | None = None
    tool_filter: tuple[str, ...] | None = None
    subagent_depth: int | None = None
    depth_cap: int | None = None
    extensions: Mapping[str, Any] = field(default_factory=dict)


def recorded_model(
    model: str, options: AgentOptions | None
) -> tuple[AgentOptions, tuple[Event, ...]]:
    """``options`` naming ``model``, and the ``agent/options`` record of them that
    lets a new process resume the agent without being given the model again."""
    options = options or AgentOptions(model=model)
    if options.model != model:
        values = {f.name: getattr(options, f.name) for f in fields(options)}
        options = AgentOptions(**{**values, "model": model})
    recorded = RecordedOptions(
        model=options.model,
        provider=options.provider,
        persona=options.persona,
        tool_filter=options.tool_filter,
    )
    return options, (agent_options_event(recorded),)
