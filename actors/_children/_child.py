"""A new child of a parent agent: its options, depth, seed and session, made once.

Both the one-shot providers and the continuation manager create children here,
so a child's header, delegation depth and option inheritance cannot drift apart
between the two modes.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from subagents.actors._agents import (
    Agent,
    AgentOptions,
    AgentRegistry,
    ModelRegistry,
    SessionService,
)
from subagents.actors._kernel import Telemetry
from subagents.protocol import (
    AgentOptionsEvent,
    Event,
    SessionHeader,
    SessionId,
    TurnEnd,
    assert_subagent_max_depth,
    delegation_depth_of,
)

__all__ = [
    "ChildContext",
    "StoredParent",
    "child_header",
    "child_options",
    "completed_history",
    "create_child",
]


class ChildContext(Protocol):
    """What creating children needs from the runtime (a ``Runtime`` is one)."""

    @property
    def agents(self) -> AgentRegistry: ...
    @property
    def models(self) -> ModelRegistry: ...
    @property
    def sessions(self) -> SessionService: ...
    @property
    def clock(self) -> Callable[[], _dt.datetime]: ...
    @property
    def max_delegation_depth(self) -> int | None: ...
    @property
    def max_inbox(self) -> int | None: ...
    @property
    def telemetry(self) -> Telemetry | None: ...


class StoredParent:
    """A parent read from the store rather than live here (it runs in another
    process): what a child's options and delegation depth derive from, as for a
    live parent -- its options as a resume would rebuild them."""

    __slots__ = ("header_delegation_depth", "options", "session_id", "subagent_depth")

    def __init__(self, session_id: SessionId, header: SessionHeader, options: AgentOptions) -> None:
        self.session_id = session_id
        self.header_delegation_depth = header.delegation_depth
        self.options = options
        self.subagent_depth = options.subagent_depth


def child_options(
    parent: Agent | StoredParent,
    *,
    model: str | None,
    persona: str | None,
    tool_filter: Any,
    max_depth: int | None,
    ceiling: int | None,
) -> tuple[AgentOptions, int]:
    """Options and delegation depth of a new child of ``parent``.

    ``ceiling`` is the runtime-wide depth limit (``max_delegation_depth``).

    Raises:
        SubagentError: ``DEPTH_EXCEEDED`` when the parent's cap forbids a child.
    """
    parent_depth = delegation_depth_of(parent)
    depth = parent_depth + 1
    cap = parent.options.depth_cap
    assert_subagent_max_depth(depth, cap)
    # The runtime-wide ceiling: a behaviour that delegates to its own model would
    # otherwise recurse until threads or memory run out.
    assert_subagent_max_depth(depth, ceiling)
    if max_depth is not None:
        own = parent_depth + max_depth
        cap = own if cap is None else min(cap, own)
    tools: tuple[str, ...] | None = None
    if tool_filter is not None:
        tools = tuple(tool_filter)
        if parent.options.tool_filter is not None:
            tools = tuple(t for t in tools if t in parent.options.tool_filter)
    elif parent.options.tool_filter is not None:
        tools = parent.options.tool_filter
    options = AgentOptions(
        model=model if model is not None else parent.options.model,
        provider=parent.options.provider,
        persona=persona,
        tool_filter=tools,
        depth_cap=cap,
    )
    return options, depth


def completed_history(sessions: SessionService, parent: Agent | SessionId) -> tuple[Event, ...]:
    """The parent's log through its last ``turn/end`` (what a fork child sees), without
    the parent's ``agent/options`` (the child's options are its own). ``parent``:
    the agent, or the id of one live in another process (its stored log)."""
    sid = parent if isinstance(parent, SessionId) else parent.session_id
    events = [r.event for r in sessions.read(sid) if not isinstance(r.event, AgentOptionsEvent)]
    last_end = max((i for i, e in enumerate(events) if isinstance(e, TurnEnd)), default=-1)
    return tuple(events[: last_end + 1])


def child_header(
    ctx: ChildContext,
    parent_id: SessionId,
    child_id: SessionId,
    label: str | None,
    depth: int,
    seed_len: int,
    max_inbox: int | None,
) -> SessionHeader:
    """A new child's session header (``seed_len``: where a fork seed ends)."""
    return SessionHeader(
        id=child_id,
        parent_session=parent_id,
        origin="subagent",
        delegation_depth=depth,
        created_at=ctx.clock(),
        label=label,
        seed_len=seed_len,
        max_inbox=max_inbox,
    )


def create_child(
    ctx: ChildContext,
    parent: Agent,
    *,
    child_id: SessionId,
    label: str | None,
    depth: int,
    options: AgentOptions,
    seed: Sequence[Event],
    own: Sequence[Event] = (),
    output_schema: Any = None,
    inbox: Sequence[Event] = (),
    now: bool | None = None,
    max_inbox: int | None = None,
) -> Agent:
    """Open the child's session (``seed``, then its ``own`` first events) and start it
    (``inbox`` and ``now`` as for ``AgentRegistry.create``).

    ``seed_len`` records where the parent's history ends, so a fork seed's events
    are never taken for the child's own.

    Raises:
        SubagentError: ``MODEL_NOT_FOUND``, ``SESSION_EXISTS``.
    """
    header = child_header(ctx, parent.session_id, child_id, label, depth, len(seed), max_inbox)
    return ctx.agents.create(
        header=header,
        options=options,
        seed=(*seed, *own),
        output_schema=output_schema,
        inbox=inbox,
        now=now,
    )
