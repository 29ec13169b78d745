"""A run of queued turns: the follow-ups waiting in an agent's mailbox, run in one pass.

A pipelined producer leaves many :class:`~._messages.Deliver` in a child's
mailbox. The actor takes them here one after the other, without a pass through
pykka's loop each, and keeps the per-message bookkeeping a run does not need per
turn out of it: the inbox settles the run's turns in one locked step (one
decrement of what is in flight, one idle check), and an inline-written store (the
memory store) takes their records in one write, both every ``RUN`` turns and at
the run's end -- always before the agent can be seen idle, so whoever waits for
idleness finds every turn settled and stored. Each turn is still its own turn:
its ``turn/start`` and message are in the live log (what every read merges)
before its behaviour runs, its end is in it before the next turn starts.

A turn whose settling is not just a count (something was steered into it) and any
message that is no plain turn (a discard below a cancel's watermark, a call, a
quiet report, a turn of a closing runtime that keeps what it accepted) settle
what the run deferred first and take the inbox's usual path. An agent with an
inbox bound (``max_inbox``) settles every turn at its end, so a producer never
finds the bound taken by turns that already ended.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Any, Final

from ._messages import Deliver

if TYPE_CHECKING:
    from ._inbox import Inbox

__all__ = ["RUN", "run_queued"]

logger = logging.getLogger("subagents")

#: Turns settled and stored together at most: what a reader of the statistics may
#: find still counted in flight, and what an inline store's write may lag by.
RUN: Final = 64


def run_queued(agent: Inbox, message: Deliver, queued: deque[Any]) -> None:
    """Handle ``message`` and then each :class:`Deliver` at the head of ``queued``
    (the actor's mailbox), in order, until the head is something else or empty."""
    turns = agent._turns
    run = 0 if agent._session.header.max_inbox is not None else RUN
    deferred = 0  # turns run and not settled yet (nor, inline, stored)
    try:
        while True:
            if (
                message.n > agent._discard_through
                and not turns.keep_accepted
                and type(message) is Deliver
            ):
                deferred += 1  # (settled by the finally clause if the turn raises)
                more = bool(queued) and deferred < run and type(queued[0]) is Deliver
                turns.run_turn(message, None, more)
                ended = turns.ended
                turns.ended = None
                if more and (ended is None or ended._steer is None):
                    message = queued.popleft()  # (only this loop takes from the head)
                    continue
                # Not more: its end wrote them -- unless it was no turn to run (not
                # ours: taken already, the lease lost), which wrote nothing.
                _settle(agent, ended, deferred, more or ended is None)
                deferred = 0
            else:
                if deferred:
                    _settle(agent, None, deferred, True)
                    deferred = 0
                agent._handle(message)
            if not queued or type(queued[0]) is not Deliver:
                return
            message = queued.popleft()
    finally:
        if deferred:
            ended, turns.ended = turns.ended, None
            _settle(agent, ended, deferred, True)


def _settle(agent: Inbox, ended: Any, count: int, tail: bool) -> None:
    """Store what the run left in the live tail (``tail``: its last turn's end did
    not), then settle ``count`` messages (the last ``ended``)."""
    if tail:
        try:
            agent._host.sessions.write_tail(agent._session)
        except Exception:  # (the store closed under it): as a turn's own end would be
            logger.exception("recording the last %d turns of %s failed", count, agent.session_id)
    agent._settle_and_tell(ended, False, count)
