"""The agent's actor: its mailbox is the agent's FIFO inbox (see :mod:`._agent`).

It runs the agent's own messages (:mod:`._messages`) before pykka's dispatch, a
run of queued turns in one pass, and the agent's disposal in ``on_stop``.
"""

from __future__ import annotations

from typing import Any

import greenlet
from subagents.actors._kernel._loop import ForgetfulLoop

from ._messages import OWN, Deliver
from ._run import run_queued

__all__ = ["_AgentActor"]  # (its name names its threads: `_AgentActor[...]`)


class _AgentActor(ForgetfulLoop):
    """The agent's actor behaviour; built into an actor class per backend. Its loop
    holds no message while it waits (an idle child its last follow-up: ``_loop``)."""

    actor_inbox: Any  # the backend actor's (ThreadActor's or GeventActor's): a deque

    def __init__(self, agent: Any) -> None:
        super().__init__()
        self._agent = agent

    def on_start(self) -> None:
        self._agent._loop = greenlet.getcurrent()

    def _handle_receive(self, message: Any) -> Any:
        # Our own messages first: pykka's dispatch tests four of its own types
        # before it reaches on_receive (kernel/_pykka.py lists this override).
        if type(message) in OWN:
            agent = self._agent
            try:
                if type(message) is Deliver:
                    # The turns queued right behind it run here, in order, without a
                    # pass through pykka's loop each (no stop, call or other message
                    # is taken out of turn: the run ends at the first not a turn).
                    run_queued(agent, message, self.actor_inbox.queued)
                else:
                    agent._handle(message)
            except greenlet.GreenletExit:
                # Killed mid-turn on gevent (or the behaviour raised it): this actor
                # stops -- out of here, pykka would stop every actor of the process.
                self._stop()  # type: ignore[attr-defined]
            return None
        return super()._handle_receive(message)  # type: ignore[misc]

    def on_receive(self, message: Any) -> Any:
        self._agent._handle(message)

    def on_stop(self) -> None:
        self._agent._finish_dispose()
