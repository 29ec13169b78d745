"""The options of one agent."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from subagents.protocol import (
    MAX_NAME_LEN,
    ErrorCode,
    Event,
    RecordedOptions,
    SubagentError,
    agent_options_event,
    check_name,
)

__all__ = ["AgentOptions", "recorded_model"]


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentOptions:
    """Options of one agent.

    ``provider``/``model``/``persona``/``tool_filter`` are recorded explicitly in a
    continuable child's descriptor. ``subagent_depth`` may raise the persisted
    delegation depth, never lower it. ``depth_cap`` is the absolute delegation cap
    this agent and its descendants live under (set by a one-shot ``max_depth``).
    ``extensions`` is merge-extensible and never persisted.

    Checked when built: a value the log or the depth rules cannot use raises
    ``SubagentError`` ``INVALID_ARGUMENT`` here, not in a later turn or write. A
    ``tool_filter`` given as a list is kept as a tuple.
    """

    model: str = "echo"
    provider: str = "local"
    persona: str | None = None
    tool_filter: tuple[str, ...] | None = None
    subagent_depth: int | None = None
    depth_cap: int | None = None
    extensions: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        model, provider = self.model, self.provider
        if (  # the usual options, in one test: short ASCII names and nothing else
            type(model) is str
            and type(provider) is str
            and 0 < len(model) <= MAX_NAME_LEN
            and 0 < len(provider) <= MAX_NAME_LEN
            and model.isascii()
            and provider.isascii()
            and self.persona is None
            and self.tool_filter is None
            and self.subagent_depth is None
            and type(self.extensions) is dict
        ):
            depth = self.depth_cap
            if depth is None or (type(depth) is int and 0 <= depth <= _MAX_DEPTH):
                return
        for name in ("model", "provider"):
            value = getattr(self, name)
            if type(value) is not str or not value:
                raise _invalid(f"{name} must be a non-empty str, got {type(value).__name__}")
            check_name(value, name)
        check_name(self.persona, "persona")
        tools: Any = self.tool_filter  # the annotation is what it must be, not what it is
        if tools is not None:
            if isinstance(tools, list):
                tools = tuple(tools)
                object.__setattr__(self, "tool_filter", tools)
            if not isinstance(tools, tuple):
                raise _invalid("tool_filter must be a tuple of tool names, or None")
            for tool in tools:
                check_name(tool, "a tool_filter name")
                if tool is None:
                    raise _invalid("tool_filter must not hold None")
        for name in ("subagent_depth", "depth_cap"):
            depth = getattr(self, name)
            if depth is not None and (
                type(depth) is not int or not 0 <= depth <= _MAX_DEPTH  # not a bool either
            ):
                shown = depth if type(depth) is int else type(depth).__name__
                raise _invalid(f"{name} must be an int in [0, 2**63 - 1] or None, got {shown}")
        if not isinstance(self.extensions, Mapping):
            raise _invalid("extensions must be a mapping")


_MAX_DEPTH = 2**63 - 1  # what a session header's delegation depth can hold


def _invalid(message: str) -> SubagentError:
    return SubagentError(message, code=ErrorCode.INVALID_ARGUMENT)


def recorded_model(
    model: str, options: AgentOptions | None, output_schema: Mapping[str, Any] | None = None
) -> tuple[AgentOptions, tuple[Event, ...]]:
    """``options`` naming ``model``, and the ``agent/options`` record of them (and of
    ``output_schema``) that lets a new process resume the agent without being given
    the model, or the schema, again."""
    options = options or AgentOptions(model=model)
    if options.model != model:
        values = {f.name: getattr(options, f.name) for f in fields(options)}
        options = AgentOptions(**{**values, "model": model})
    recorded = RecordedOptions(
        model=options.model,
        provider=options.provider,
        persona=options.persona,
        tool_filter=options.tool_filter,
        output_schema=output_schema,
    )
    return options, (agent_options_event(recorded),)
