"""What an agent and a runtime report of their work: :meth:`Agent.statistics`,
:meth:`Runtime.statistics`.

Counting costs the turn path one clock read on each side of the behaviour and
two appends (the agent's window and the runtime's); everything else is derived
when somebody asks: the inbox depth from the admission counters, the accepted
count from the admission sequence, percentiles by sorting a window of the last
:data:`WINDOW` turn times. An agent's counters join the runtime's retired totals
when it is disposed, so the runtime's totals survive its children settling.
"""

from __future__ import annotations

import collections
import math
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

from subagents.protocol import SessionId

__all__ = [
    "WINDOW",
    "AgentStatistics",
    "RuntimeCounters",
    "RuntimeStatistics",
    "agent_statistics",
    "percentiles",
    "runtime_statistics",
]

#: Turn times kept for percentiles, per agent and per runtime: sorting them is
#: most of a read's cost (about 8 us at 256, 31 us at 1,024).
WINDOW: Final = 256


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentStatistics:
    """A snapshot of one live agent (``agent.statistics()``).

    Attributes:
        session_id: the agent's session.
        inbox: messages accepted into its mailbox and not yet run (the running
            turn's excluded).
        durable_inbox: accepted messages the store still holds for the session
            (committed and not done, the running turn's included) under strict
            durability; ``None`` under relaxed durability (nothing is kept), and
            once the runtime closed (its store with it). It is what the store
            holds now: a message leaves it with its turn's end, which is written
            behind the turn.
        running: whether a turn runs now.
        turns: turns this activation ran to their end (a resumed session counts from
            its resume; the running turn is not counted yet).
        turn_p50_ms, turn_p99_ms: turn times over its last :data:`WINDOW` turns,
            nearest rank; ``None`` before the first turn.
        accepted: messages (follow-ups, prompts, reports) this activation accepted.
        replayed: turns that ran a message an earlier activation had taken (a
            replay after a crash or a close).
        deduplicated: follow-ups whose ``message_id`` was accepted before, answered
            without accepting them again.
        reports_pending: quiet reports waiting for the next turn.
    """

    session_id: SessionId
    inbox: int
    durable_inbox: int | None
    running: bool
    turns: int
    turn_p50_ms: float | None
    turn_p99_ms: float | None
    accepted: int
    replayed: int
    deduplicated: int
    reports_pending: int


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeStatistics:
    """A snapshot of one runtime (``runtime.statistics()``): its live agents summed,
    plus what agents disposed since it opened had counted.

    Attributes:
        live_agents: agents live here (top-level and children).
        activations: continuable children resident here.
        leases_held: sessions this runtime holds the lease of (durable store).
        inbox: messages accepted into live agents' mailboxes and not yet run.
        running: turns running now.
        turns, accepted, replayed, deduplicated: since the runtime opened (see
            :class:`AgentStatistics`).
        turn_p50_ms, turn_p99_ms: over the runtime's last :data:`WINDOW` turns.
        reports_pending: quiet reports waiting for live agents' next turns.
    """

    live_agents: int
    activations: int
    leases_held: int
    inbox: int
    running: int
    turns: int
    turn_p50_ms: float | None
    turn_p99_ms: float | None
    accepted: int
    replayed: int
    deduplicated: int
    reports_pending: int


class RuntimeCounters:
    """The runtime-wide part: its turn-time window and the totals of agents that
    were disposed. Written by turn loops (``times``) and disposals (the totals).

    An agent leaves the registry when its disposal starts and hands its totals
    over when it ends, maybe a turn later: in between it is *leaving*, still
    summed as live. Each step and :meth:`snapshot` take one lock, so a sum counts
    every agent once -- totals never go backwards."""

    __slots__ = ("_leaving", "_lock", "accepted", "replayed", "times", "turns")

    def __init__(self) -> None:
        self.times: collections.deque[float] = collections.deque(maxlen=WINDOW)
        self.turns = 0
        self.accepted = 0
        self.replayed = 0
        self._leaving: dict[int, Any] = {}
        self._lock = threading.Lock()  # actors of several threads retire at once

    def leave(self, agent: Any) -> None:
        """``agent``'s disposal starts (before it leaves the registry)."""
        with self._lock:
            self._leaving[id(agent)] = agent

    def retire(self, agent: Any, turns: int, accepted: int, replayed: int) -> None:
        """Keep a disposed agent's totals (called once per agent, from its actor)."""
        with self._lock:
            self._leaving.pop(id(agent), None)
            self.turns += turns
            self.accepted += accepted
            self.replayed += replayed

    def snapshot(self, live: Callable[[], list[Any]]) -> tuple[list[Any], int, int, int]:
        """The agents to sum -- ``live()`` and the leaving ones, each once -- and the
        retired totals ``(turns, accepted, replayed)``, in one step."""
        with self._lock:
            agents = {id(a): a for a in live()}
            agents.update(self._leaving)
            return list(agents.values()), self.turns, self.accepted, self.replayed


def percentiles(seconds: Iterable[float]) -> tuple[float | None, float | None]:
    """(p50, p99) of ``seconds`` in milliseconds, nearest rank; ``(None, None)``
    when empty. Sorting a deque or a list copies it in one C call: a consistent
    snapshot."""
    data = sorted(seconds)
    if not data:
        return None, None
    n = len(data)
    return (
        data[math.ceil(0.50 * n) - 1] * 1000.0,
        data[math.ceil(0.99 * n) - 1] * 1000.0,
    )


def agent_statistics(
    session_id: SessionId,
    counts: tuple[bool, int, int, int, int, int],
    times: Iterable[float],
    durable: int | None,
    session: Any,
) -> AgentStatistics:
    """One agent's :class:`AgentStatistics` from its counters (``Inbox._counts``),
    turn times, durable inbox depth and live session."""
    running, inbox, turns, accepted, replayed, reports = counts
    p50, p99 = percentiles(times)
    return AgentStatistics(
        session_id=session_id,
        inbox=inbox,
        durable_inbox=durable,
        running=running,
        turns=turns,
        turn_p50_ms=p50,
        turn_p99_ms=p99,
        accepted=accepted,
        replayed=replayed,
        deduplicated=session.deduplicated,
        reports_pending=reports,
    )


def runtime_statistics(
    live: Callable[[], list[Any]],
    counters: RuntimeCounters,
    *,
    activations: int,
    leases_held: int,
    deduplicated: int,
) -> RuntimeStatistics:
    """Sum the ``live()`` agents (their counters, read without the store) with the
    totals of the disposed ones in ``counters``."""
    agents, retired_turns, retired_accepted, retired_replayed = counters.snapshot(live)
    n = inbox = running = turns = accepted = replayed = reports = 0
    for agent in agents:
        counts = agent._counts()
        n += 1
        running += counts[0]
        inbox += counts[1]
        turns += counts[2]
        accepted += counts[3]
        replayed += counts[4]
        reports += counts[5]
    p50, p99 = percentiles(counters.times)
    return RuntimeStatistics(
        live_agents=n,
        activations=activations,
        leases_held=leases_held,
        inbox=inbox,
        running=running,
        turns=turns + retired_turns,
        turn_p50_ms=p50,
        turn_p99_ms=p99,
        accepted=accepted + retired_accepted,
        replayed=replayed + retired_replayed,
        deduplicated=deduplicated,
        reports_pending=reports,
    )
