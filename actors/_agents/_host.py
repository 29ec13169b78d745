"""What an agent needs from the runtime that hosts it, and nothing more.

An :class:`Agent` never sees the ``Runtime``: the composition root hands it an
:class:`AgentHost`, a frozen record of the few services and callbacks a live agent
uses. That is how the agent core stays below the children layer (the subagent
service reaches a turn only through ``bind``) and free of import circles, as
supervision knows agents only through ``ResidentAgent``.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from subagents.actors._kernel._backend import Backend
from subagents.actors._kernel._telemetry import Telemetry

from ._live import LiveSession
from ._sessions import SessionService
from ._stats import RuntimeCounters
from ._tools import ToolRegistry

__all__ = ["AgentHost"]


@dataclass(frozen=True, slots=True, eq=False)
class AgentHost:
    """The services and callbacks of one runtime, as its agents see them.

    Attributes:
        backend: the runtime's primitives and actor base.
        sessions: live sessions and their persistence.
        tools: runtime-wide tools (filtered per agent).
        clock: aware UTC ``datetime`` for event times.
        check_thread: raises ``WRONG_THREAD`` where a blocking call may not wait.
        forget: the agent (the argument) is disposing: drop it from the registry
            (the :class:`~._registry.AgentRegistry` sets it, and ``released``).
        leaving: its session leaves the live set (``(session, descriptor)``).
        bind: the subagent service bound with ``(agent, turn or None)`` as parent.
        counters: the runtime's turn times and its disposed agents' totals.
        telemetry: the runtime's tracing (``None``: off).
        released: the agent finished disposing (its session released).

    The callbacks take the agent untyped: this module sits below the Agent.
    """

    backend: Backend
    sessions: SessionService
    tools: ToolRegistry
    clock: Callable[[], _dt.datetime]
    check_thread: Callable[[], None]
    leaving: Callable[[LiveSession, Any], None]
    bind: Callable[[Any, Any], Any]
    forget: Callable[[Any], None] = lambda _agent: None
    counters: RuntimeCounters = field(default_factory=RuntimeCounters)
    telemetry: Telemetry | None = None
    released: Callable[[Any], None] = lambda _agent: None
