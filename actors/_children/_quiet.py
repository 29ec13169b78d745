"""``Runtime.wait_idle``: every agent idle, and the settling their idleness set off done.

An idle continuable child settles on its own (``keep_warm`` 0): its idle listener
tells the supervisor, which asks the registry to retire it, which has it disposed
-- its checkpoint written, its lease released -- and then announced. All of that
happens after the child is *seen* idle. A script that waited for idleness and
then listed the tree saw the child still ``running``; one that closed the runtime
then disposed the child first, without its checkpoint.

So :func:`wait_quiet` waits for both, in passes: every agent idle
(``wait_all_idle``), then :func:`settle_pass` -- the quiescence of every quiet
child is posted again (its own listener's notice may still be on its way), a
barrier goes twice through the supervisor and the registry (each handles what
was posted before it: the supervisor's retirement, the registry's, the
supervisor's disposal), and each child settling then is waited for until its
agent is disposed (checkpoint written, lease released). A disposal's release
reaches the index in a later pass, and may let the parent settle too (a waiting
parent's last child), so passes repeat until one finds nothing new settling.

Not waited for: children kept warm (``keep_warm`` > 0), which stay resident; a
placed child's settling at its host; and the ``subagent/end`` announcements,
which a blocking listener may hold up as long as it likes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import pykka
from subagents.actors._agents import Agent, AgentRegistry, Rung, wait_all_idle
from subagents.protocol import SessionId
from subagents.supervision import Activation, Phase

__all__ = ["barrier", "settle_pass", "wait_quiet"]

#: Seconds between looks at the pickup's owed rings (a pickup takes milliseconds).
_PICKUP_POLL = 0.002


def barrier() -> None:
    """Asked of an owner actor: answered once what was queued before it is done."""


def _left(deadline: float | None) -> float | None:
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def settle_pass(
    index: dict[SessionId, Activation],
    quiescent: Callable[[Activation], object],
    owners: Sequence[Any],
    keep_warm: float,
    deadline: float | None,
    waited: set[Activation],
) -> int | None:
    """One pass (see the module docstring), after every agent went idle: how many
    children settled (None: ``deadline``, a ``time.monotonic()`` value, passed) --
    those it waited for that no earlier pass did (``waited``, updated), and those
    gone from ``index`` meanwhile (a release that ended during the barrier may let
    a parent settle too: another pass looks)."""
    before = index.copy()  # (one C call: atomic while the registry writes)
    if not before:
        return 0  # no child here: nothing settles (and no barrier to pay for)
    for act in before.values():
        agent = act.agent
        if not isinstance(agent, Agent) or not agent.idle:
            continue  # (a placed child's host settles it: waited for below)
        if act.phase is Phase.DRAINING or (act.phase is Phase.RESIDENT and keep_warm <= 0):
            quiescent(act)
    for ref in (*owners, *owners):
        try:
            ref.ask(barrier, timeout=_left(deadline))
        except pykka.ActorDeadError:
            return 0  # the runtime closed: nothing settles any more
        except Exception:
            return None  # (the ask's timeout)
    after = index.copy()
    settling = [
        (a, a.agent)
        for a in after.values()
        if a.phase is Phase.SETTLING and isinstance(a.agent, Agent) and a not in waited
    ]
    for act, agent in settling:
        if not agent.wait_disposed(_left(deadline)):
            return None
        waited.add(act)
    return len(settling) + sum(1 for sid, act in before.items() if after.get(sid) is not act)


def wait_quiet(
    agents: AgentRegistry,
    settle: Callable[[float | None, set[Activation]], int | None],
    timeout: float | None,
    rung: Rung,
    sleep: Callable[[float], object],
) -> bool:
    """Wait until no ring of the mail pickup is owed (``rung``: messages accepted
    for a live agent that only the pickup hands to it), every agent is idle, and
    ``settle`` (a :func:`settle_pass` given a deadline and the set of what earlier
    passes waited for) finds nothing new settling; False when ``timeout`` seconds
    (None: no limit) ran out first. ``sleep``: the backend's, between looks."""
    deadline = None if timeout is None else time.monotonic() + timeout
    waited: set[Activation] = set()
    while True:
        # Before the agents: a pickup answers its ring once what it found is in
        # the agent's loop, counted in flight -- where the wait below sees it.
        while rung:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            sleep(_PICKUP_POLL)
        if not wait_all_idle(agents, _left(deadline)):
            return False
        settled = settle(deadline, waited)
        if settled is None:
            return False
        if not settled:
            return True
