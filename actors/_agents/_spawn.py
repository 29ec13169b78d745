"""Top-level agents: ``Runtime.spawn``, ``Runtime.wait_idle`` and the disposal of
every agent at ``Runtime.close``, on the registry.

A top-level agent has origin ``"user"``, depth 0 and no Activation; a model name
is recorded in its log (``agent/options``, with its output schema) so any process
that registers the model can resume it.
"""

from __future__ import annotations

import datetime as _dt
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from subagents.protocol import (
    ErrorCode,
    Event,
    SessionHeader,
    SessionId,
    SubagentError,
    check_name,
    new_session_id,
)

from ._agent import Agent
from ._behaviours import ModelRegistry, as_behaviour
from ._options import AgentOptions, recorded_model
from ._output import check_agent_arguments
from ._registry import AgentRegistry
from ._sessions import SessionService

__all__ = ["close_agents", "dispose_by_depth", "spawn_agent", "wait_all_idle"]

logger = logging.getLogger("subagents")


def spawn_agent(
    agents: AgentRegistry,
    models: ModelRegistry,
    sessions: SessionService,
    clock: Callable[[], _dt.datetime],
    behaviour: Any,
    *,
    label: str | None,
    options: AgentOptions | None,
    output_schema: Mapping[str, Any] | None,
    session_id: SessionId | str | None,
) -> Agent:
    """Create a top-level agent (see ``Runtime.spawn``): arguments checked before
    anything is created."""
    check_name(label, "label")
    check_agent_arguments(options, output_schema)
    built = None
    seed: tuple[Event, ...] = ()
    if isinstance(behaviour, str):
        check_name(behaviour, "model")  # recorded in the log
        models.require(behaviour)
        options, seed = recorded_model(behaviour, options, output_schema)
    else:
        built = as_behaviour(behaviour)
        options = options or AgentOptions()
    sid = new_session_id() if session_id is None else SessionId(session_id)
    if session_id is not None and sessions.header(sid) is not None:
        raise SubagentError(f"session {sid} exists", code=ErrorCode.SESSION_EXISTS)
    header = SessionHeader(
        id=sid,
        parent_session=None,
        origin="user",
        delegation_depth=options.subagent_depth or 0,
        created_at=clock(),
        label=label,
    )
    return agents.create(
        header=header,
        options=options,
        behaviour=built,
        output_schema=output_schema,
        seed=seed,
        # A well-known id is committed before this returns, relaxed durability
        # too: of processes racing to create it, the store's unique insert picks
        # the one that does (written behind, each would run turns of its own and
        # the losers' logs be dropped by their writers).
        now=True if session_id is not None else None,
    )


def wait_all_idle(agents: AgentRegistry, timeout: float | None) -> bool:
    """Wait until every live agent is idle, checked again until nothing new started;
    False when ``timeout`` seconds (None: no limit) ran out first."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        busy = [a for a in agents.list() if not a.idle]
        if not busy:
            return True
        for agent in busy:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not agent.wait_idle(remaining) and not agent.disposed:
                return False


def dispose_by_depth(
    agents: list[Agent],
    timeout: float,
    checkpointed: frozenset[Agent] = frozenset(),
    *,
    flush: bool = True,
) -> None:
    """Dispose ``agents`` child-first: the deepest delegation depth first, its
    agents together, each depth once the deeper one ended (or ``timeout``
    seconds passed). Together, their stops and session releases overlap and share
    the store's commits (one by one, each waited for, a closing runtime paid a
    commit -- an fsync -- per agent). Those in ``checkpointed`` write their
    checkpoint, as a settling child does. ``flush=False``: a disposal queues its
    session's last writes and its release without waiting for them (the caller
    drains the writer after)."""
    by_depth: dict[int, list[Agent]] = {}
    for agent in agents:
        by_depth.setdefault(agent.delegation_depth, []).append(agent)
    for depth in sorted(by_depth, reverse=True):
        level = by_depth[depth]
        for agent in level:
            try:
                agent.dispose(wait=False, checkpoint=agent in checkpointed, flush=flush)
            except Exception:
                logger.exception("disposing %r while closing the runtime failed", agent)
        deadline = time.monotonic() + timeout
        for agent in level:
            if not agent.wait_disposed(max(0.0, deadline - time.monotonic())):
                logger.warning("%r was still disposing when the runtime closed", agent)


def close_agents(registry: AgentRegistry) -> None:
    """The agents' part of ``Runtime.close`` (after the mail's: no pickup may
    activate a session once the agents are listed): refuse every activation from
    now on, and wait for those begun before -- else an agent is in no list and
    its lease is kept --; then stop every live agent, deepest first, keeping what
    they accepted (an idle continuable child checkpointed), and wait for every
    stop. Their last writes and releases are queued, written as the session
    writer drains (``SessionService.close``, next)."""
    registry.close()
    if not registry.wait_activations(30.0):
        logger.warning("an activation was still in flight when the runtime closed")
    agents = registry.list()
    # An idle continuable child leaves its checkpoint, as if it settled: one kept
    # warm may never settle, and each restart's resume refolded its whole log.
    quiet = frozenset(a for a in agents if a._descriptor is not None and a.idle)
    for agent in agents:
        # What they accepted and did not run stays in their durable inboxes
        # (strict durability): it runs at each session's next activation.
        agent.cancel("runtime closing", keep_inbox=False, keep_accepted=True)
    # No disposal waits for its own writes: the writer keeps their order (a child's
    # last writes and release before its parent's), and the runtime's close drains
    # it next. A release behind a failed write goes back at the leases' close
    # (``Leases.release_later``). Each waiting cost a closing runtime as much as
    # the rest of its disposal: a wake-up, a switch, a turn of the writer's loop.
    dispose_by_depth(agents, 30.0, quiet, flush=False)
    # Children that settled on their own (disposing without a waiter) release
    # their sessions in their actors' on_stop: before the writer closes.
    if not registry.wait_stopped(30.0):
        logger.warning("an agent was still disposing when the runtime closed")
