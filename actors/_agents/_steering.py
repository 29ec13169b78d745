"""Steering: a follow-up delivered into the recipient's open turn (opt-in; L-5).

Without steering every accepted message is its own FIFO turn. With
``followup(..., steer=True)`` a message that arrives while a turn runs is handed
to *that* turn instead: the behaviour sees it at its next safe point -- where it
calls :meth:`~._turn.Turn.steering`, between model calls -- and the message is
recorded in the session log inside the turn (after the turn's own message), so
the history of later turns shows it there. A turn a crash cut short runs again
without it; the steered message, still accepted, runs after it as its own turn.

The outcome is reported (:class:`Steered`): ``steered`` (handed to the open turn)
or ``queued`` (no turn was open: it runs as a turn of its own, as a plain
follow-up would). ``steer="strict"`` refuses instead of queueing: a steer that
loses the race with the turn's end raises ``TURN_NOT_OPEN`` and delivers nothing
(under strict durability its acceptance is taken back -- or, when it cannot be,
the store refusing or a repeat of its id accepted since, it is ``queued``: see
``_kept.kept``). A message handed to a
turn that ends before another safe point is not lost: it runs as a turn of its
own, in acceptance order -- after what was queued before it was steered, before
what came after (as a crash replays it).

Who decides: the agent's inbox lock. A steer reads the running turn and appends
to its :class:`SteerBox` under it; the turn's end is observed under the same lock
(when the finished turn is settled), so a message is either in a box whose turn
sees or requeues it, or refused -- never both, never neither.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Literal, NamedTuple

from subagents.protocol import ErrorCode, MessageId, SubagentError

from ._messages import Deliver

__all__ = [
    "STEER_OUTCOMES",
    "SteerBox",
    "Steered",
    "check_steer",
    "discard_leftovers",
    "not_open",
    "run_next",
]

#: What a steering follow-up can report.
STEER_OUTCOMES: Final = ("steered", "queued", "duplicate")


class Steered(NamedTuple):
    """What ``followup(..., steer=...)`` did with a message.

    ``outcome``: ``"steered"`` -- handed to the recipient's open turn, which sees
    it at its next safe point (or, ending before one, runs it as a turn of its
    own, in acceptance order);
    ``"queued"`` -- no turn was open for it: it runs as a turn of its own;
    ``"duplicate"`` -- its ``message_id`` was accepted before: nothing new.
    """

    message_id: MessageId
    outcome: Literal["steered", "queued", "duplicate"]


class SteerBox:
    """The messages steered into one turn, oldest first; ``taken`` of them were seen
    by the turn; ``marks``, each message's place in acceptance order (the agent's
    count of accepted messages when it was steered). Guarded by the agent's inbox
    lock."""

    __slots__ = ("marks", "messages", "taken")

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self.marks: list[int] = []
        self.taken = 0

    def take(self) -> list[Any]:
        """The messages not seen yet, now seen (the caller holds the lock)."""
        fresh = self.messages[self.taken :]
        self.taken = len(self.messages)
        return fresh

    def leftovers(self) -> list[tuple[int, Any]]:
        """The messages the turn never saw, with their marks (the caller holds the
        lock); the box is emptied, so each is requeued once."""
        rest = list(zip(self.marks[self.taken :], self.messages[self.taken :]))
        del self.messages[self.taken :], self.marks[self.taken :]
        return rest


def discard_leftovers(box: SteerBox, lock: Any, discard: Callable[[Any], object]) -> None:
    """What was steered into a turn and never taken, when a cancel that dropped the
    inbox covered that turn: discarded as the queued messages were (``discard``, the
    turn runner's) -- in the actor, before the turn settles, so the agent stays
    busy until they are recorded."""
    with lock:
        rest = box.leftovers()
    for mark, m in rest:
        discard(_turn_of(mark, m))


def run_next(inbox: Any, rest: list[tuple[int, Any]]) -> None:
    """The steered messages a turn never took (:meth:`SteerBox.leftovers`), as turns
    of their own, each where acceptance puts it in the actor's deque ``inbox``:
    behind what was queued before it was steered, ahead of what came after -- the
    order a crash replays them in. Only the actor's loop -- the deque's one consumer
    -- calls this (producers only append)."""
    queued = inbox.queued
    i = 0
    for mark, m in rest:
        # An envelope of pykka's own (no number) stays behind them, as later ones do.
        while i < len(queued) and getattr(queued[i], "n", mark + 1) <= mark:
            i += 1
        queued.insert(i, _turn_of(mark, m))
        i += 1


def _turn_of(n: int, m: Any) -> Deliver:
    """A steered message as a turn of its own, numbered ``n`` in acceptance order."""
    return Deliver(n, m.message_id, m.content, m.source, "message", (), None, False)


def check_steer(steer: Any) -> bool:
    """Whether ``steer`` asks for strict steering (``"strict"``); ``True`` for plain
    steering. Anything else is ``INVALID_ARGUMENT``."""
    if steer is True:
        return False
    if steer == "strict" and type(steer) is str:
        return True
    raise SubagentError(
        f"steer must be False, True or 'strict', not {steer!r}", code=ErrorCode.INVALID_ARGUMENT
    )


def not_open(session_id: Any) -> SubagentError:
    """``TURN_NOT_OPEN``: a strict steer found no open turn to deliver into."""
    return SubagentError(
        f"session {session_id} has no open turn to steer (nothing was delivered)",
        code=ErrorCode.TURN_NOT_OPEN,
        hint={"session_id": session_id},
    )
