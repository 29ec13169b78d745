"""Hand-overs in doubt: messages a take of this runtime may have taken.

A hand-over (``SessionService.hand_over``: untaken inbox rows taken into a live
activation by compare-and-swap) whose connection was lost at its COMMIT may have
committed all the same (``_write_faults.unsure``): its rows are then taken by the
activation, which never queued them, and no later take can take them again.
What such a take leaves unsettled is registered here -- by the mail pickup
(``_mail.Mailman``), or by a follow-up's take-ahead (``_ahead.take_ahead``) that
could not settle it at once (:func:`taken_after_all`) -- and the pickup settles
it in the agent's loop: those the store shows taken by the activation are
queued, in acceptance order; those still untaken are taken then. (A turn's take
of its own message stops the activation instead: ``_loop.TurnRunner._take``.)
One registry per runtime (on its ``SessionService``), which every taker clears:
a message that a later take did take (its compare-and-swap said so) is no doubt
any more (:meth:`HandOverDoubts.forget`), whoever took it queues it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Final

from subagents.protocol import MessageId, SessionId

__all__ = ["DOUBT_GRACE", "HandOverDoubts", "taken_after_all"]

#: Seconds a message in doubt that the store does not show (or shows untaken, and a
#: take now does not take) stays in doubt: the server may still be finishing the
#: COMMIT whose answer was lost (a connection the deadline's watchdog cut while the
#: server waited on its disk), invisible to other connections until it ends.
DOUBT_GRACE: Final = 60.0


class HandOverDoubts:
    """By session, the messages a hand-over may have taken and nobody queued, each
    with when it was first in doubt (on the monotonic clock); a session with no
    such message may be *watched* (an empty entry): its agent's own acceptances
    are in doubt (``Agent._in_doubt``), and every sweep of the pickup looks at it.
    Thread-safe (a native lock, held for no call out)."""

    def __init__(self) -> None:
        self._by: dict[SessionId, dict[MessageId, float]] = {}
        self._lock = threading.Lock()

    def add(self, session_id: SessionId, message_ids: Iterable[MessageId]) -> None:
        """``message_ids`` may have been taken into ``session_id``'s activation."""
        now = time.monotonic()
        with self._lock:
            doubts = self._by.setdefault(session_id, {})
            for mid in message_ids:
                doubts.setdefault(mid, now)

    def held(self, session_id: SessionId) -> dict[MessageId, float]:
        """A copy of ``session_id``'s messages in doubt."""
        with self._lock:
            return dict(self._by.get(session_id, {}))

    def sessions(self) -> list[SessionId]:
        """The sessions with messages in doubt, or watched."""
        with self._lock:
            return list(self._by)

    def watch(self, session_id: SessionId, watched: bool) -> None:
        """Keep ``session_id`` looked at by every sweep (``watched``), or stop when
        none of its messages is in doubt any more."""
        with self._lock:
            if watched:
                self._by.setdefault(session_id, {})
            elif not self._by.get(session_id):
                self._by.pop(session_id, None)

    def forget(self, session_id: SessionId, message_ids: Iterable[MessageId] | None = None) -> None:
        """``message_ids`` (all of the session's by default) are no doubt any more:
        a take took them now, or their taker queued them, or the activation went
        (its next one replays what the store holds)."""
        with self._lock:
            doubts = self._by.get(session_id)
            if doubts is None:
                return
            if message_ids is None:
                del self._by[session_id]
                return
            for mid in message_ids:
                doubts.pop(mid, None)

    def settle(
        self, session_id: SessionId, held: dict[MessageId, float], settled: set[MessageId]
    ) -> None:
        """After a look at the store: of ``held`` (a copy taken before it), the
        ``settled`` ones, and those in doubt for :data:`DOUBT_GRACE` seconds, are
        no doubt any more; the session is dropped once none is left."""
        now = time.monotonic()
        with self._lock:
            left = self._by.get(session_id)
            if left is None:
                return
            for mid, since in held.items():
                if mid in settled or now - since >= DOUBT_GRACE:
                    left.pop(mid, None)
            if not left:
                del self._by[session_id]


def taken_after_all(sessions: Any, live: Any, message_ids: Sequence[MessageId]) -> set[MessageId]:
    """After a hand-over of ``message_ids`` into ``live``'s activation whose answer
    was lost: those of them that are this activation's to queue, read from the store.

    Called with the agent's taking lock held since ``message_ids`` were read
    untaken, before the lost hand-over; every taker of the activation holds it: so
    nobody else of the activation took any of them meanwhile, and none of them ran.
    The hand-over is made again first -- it takes what the first did not, and
    waits out a COMMIT the server is still finishing (it waits for the rows'
    locks) -- so that every one the store then shows taken by the activation, and
    not done, was taken by one of the two (or by an earlier take whose answer was
    lost too: it is forgotten as a doubt, queued by the caller).

    Raises:
        SubagentError: the store's: still unsure (the caller registers them).
    """
    sid = live.id
    sessions.hand_over(sid, message_ids, live)
    epoch = live.token[1]
    wanted = set(message_ids)
    mine = {e.message_id for e in sessions.pending(sid) if e.epoch == epoch} & wanted
    sessions.doubts.forget(sid, mine)
    return mine
