"""A session's state as its durable log tells it: the ``session_state`` unit.

``subagents tree`` and ``subagents show`` read a database with no runtime, so a
session's state is what its log says (and, on a store with a durable inbox, the
messages accepted and not yet run):

* ``running`` -- a turn started and has not ended, in a process that holds the
  session (a turn whose process ended -- its lease free or expired -- runs again
  at the next activation: its session is ``waiting``, or, with nothing in its
  durable inbox -- relaxed durability -- idle like any other);
* ``waiting`` -- messages were accepted that no turn has taken yet;
* ``cancelled`` -- the last turn was cancelled (an interrupt), nothing waits;
* ``ended`` -- a one-shot child whose run ended: it takes no more work;
* ``settled`` -- idle: its last turn ended (or none ran) and a follow-up would
  wake it.

``last_activity`` is the latest time the log holds (a turn's start or end, an
interrupt; the session's creation before any), ``last_turn`` the last turn's stop
reason (``completed``, ``cancelled``, ``failed``; None before any). A turn the log
shows open in a process that ended is ``failed``: cut short, as the session's next
activation records it (a one-shot child's has none: it stays open in the log).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from subagents.protocol import (
    Event,
    InterruptEvent,
    MessageEvent,
    MessageId,
    ReportEvent,
    SubagentDescriptorEvent,
    TurnEnd,
    TurnStart,
)

from ._projections import ProjectionUnit

__all__ = ["STATES", "SessionState", "session_state", "session_state_unit"]

#: The states a session can be in, as ``tree`` and ``show`` print them.
STATES: Final = ("running", "waiting", "cancelled", "ended", "settled")


class _Fold(NamedTuple):
    open: bool  # a turn started and has not ended
    pending: frozenset[MessageId]  # accepted, taken by no turn yet
    taking: frozenset[MessageId]  # the last turn's messages (logged after its start)
    stop: str | None  # the last turn's stop reason
    at: dt.datetime | None  # the latest time an event carries
    one_shot: bool  # the newest descriptor is a one-shot child's
    interrupted: bool  # an interrupt after the last turn ended


_INITIAL: Final = _Fold(False, frozenset(), frozenset(), None, None, False, False)


def _later(at: dt.datetime | None, when: dt.datetime) -> dt.datetime:
    return when if at is None or when > at else at


def _step(state: _Fold, seq: int, event: Event) -> _Fold:
    if isinstance(event, TurnStart):
        taking = frozenset(event.message_ids)
        return state._replace(
            open=True,
            pending=state.pending - taking if state.pending else state.pending,
            taking=taking,
            at=_later(state.at, event.at),
            interrupted=False,
        )
    if isinstance(event, TurnEnd):
        return state._replace(open=False, stop=event.stop_reason, at=_later(state.at, event.at))
    if isinstance(event, MessageEvent) or (
        isinstance(event, ReportEvent) and event.delivery == "waking"
    ):
        if state.open or event.message_id in state.taking:
            # Its turn logs it after the turn's start; a message logged while a
            # turn is open and not among its own was steered into it: taken too.
            return state
        return state._replace(pending=state.pending | {event.message_id})
    if isinstance(event, InterruptEvent):
        return state._replace(at=_later(state.at, event.at), interrupted=not state.open)
    if isinstance(event, SubagentDescriptorEvent):
        # The mode alone (the identity unit validates the rest): a one-shot child's
        # descriptor says so in every version.
        payload = event.payload
        one_shot = isinstance(payload, Mapping) and payload.get("mode") == "one-shot"
        return state._replace(one_shot=one_shot)
    return state


class SessionState(NamedTuple):
    """A session's state (one of :data:`STATES`), the latest time its log holds,
    and its last turn's stop reason."""

    state: str
    last_activity: dt.datetime | None
    last_turn: str | None

    def to_json(self) -> dict[str, Any]:
        """``{"state", "last_activity" (ISO 8601 or None), "last_turn"}``."""
        at = self.last_activity
        return {
            "state": self.state,
            "last_activity": None if at is None else at.isoformat(),
            "last_turn": self.last_turn,
        }


def session_state(
    fold: Any, *, inbox: int = 0, created_at: dt.datetime | None = None, held: bool = True
) -> SessionState:
    """The :class:`SessionState` of a folded ``session_state`` unit.

    ``inbox``: how many accepted messages the store's durable inbox still holds
    for the session (they wait as messages logged and not yet run do);
    ``created_at``: the last activity of a session whose log holds no time;
    ``held``: False when no live process holds the session (its lease is free or
    expired): a turn its log shows open is not running.
    """
    if not isinstance(fold, _Fold):
        fold = _INITIAL
    if fold.open and held:
        state = "running"
    elif fold.pending or inbox:  # (an ended process's open turn: its message waits)
        state = "waiting"
    elif fold.interrupted or fold.stop == "cancelled":
        state = "cancelled"
    elif fold.one_shot and (fold.stop is not None or fold.open):  # (its process ended)
        state = "ended"
    else:
        state = "settled"
    stop = "failed" if fold.open and not held else fold.stop  # (cut short: see above)
    return SessionState(state, fold.at or created_at, stop)


#: The unit: its value is :meth:`SessionState.to_json` of the log alone; a reader
#: that knows the inbox passes the raw state to :func:`session_state`.
session_state_unit = ProjectionUnit(
    name="session_state",
    initial=lambda: _INITIAL,
    step=_step,
    value=lambda state: session_state(state).to_json(),
)
