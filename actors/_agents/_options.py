"""The options of one agent."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AgentOptions"]


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
