"""What the inbox counts of steered messages (see :mod:`~._steering`).

A steered message is accepted and not done until the turn that took it ends, or
-- never taken -- until its own turn ends: it takes a place in the inbox bound
all along, as its pending row does in the store under strict durability. The
inbox counts it in flight from :meth:`~._inbox.Inbox.steer_in` (``_inflight``,
and ``_steering``: of those, steered and not settled, which the statistics'
``inbox`` leaves out); these settle it with the turn it was steered into. Only
a turn that had steering comes here: a plain follow-up or turn does no more.
"""

from __future__ import annotations

import logging
from typing import Any

from ._steering import SteerBox, discard_leftovers, run_next

__all__ = ["discard_steered", "requeue_steered", "settle_steered"]

logger = logging.getLogger("subagents")


def discard_steered(inbox: Any, box: SteerBox) -> None:
    """:func:`~._steering.discard_leftovers` (what a cancel that dropped the inbox
    covered), and they are done. The turn has ended (``current`` is None), so no
    steer appends to ``box`` once the lock was taken after that: the count holds."""
    lock = inbox._lock
    with lock:
        before = len(box.messages)
    discard_leftovers(box, lock, inbox._turns.discard)
    with lock:  # still in flight: the turn's own message (it settles next)
        done = before - len(box.messages)
        inbox._inflight -= done
        inbox._steering -= done


def settle_steered(inbox: Any, box: SteerBox) -> list[tuple[int, Any]]:
    """Under ``inbox``'s lock, as the turn ``box`` was steered into settles: what it
    took is done; what it never took (returned, for :func:`requeue_steered`) stays
    counted in flight, as turns of their own."""
    rest = box.leftovers()
    n = len(rest)
    inbox._accepted += n
    inbox._requeued += n
    done = len(box.messages)
    inbox._inflight -= done
    inbox._steering -= done + n
    return rest


def requeue_steered(inbox: Any, rest: list[tuple[int, Any]]) -> None:
    """The leftovers of :func:`settle_steered` as turns of their own, in the actor
    (``_steering.run_next``); disposed meanwhile, each is settled as queued ones are."""
    if inbox._ref.actor_stopped.is_set():
        for _, m in rest:
            inbox._settle_one()
            logger.warning("steered message %s of %s not run", m.message_id, inbox.session_id)
        return
    run_next(inbox._ref.actor_inbox, rest)
