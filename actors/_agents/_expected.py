"""Messages a session is owed, kept across its activations (``message/expected``).

A behaviour that promises its agent a later message -- the model layer's
background ``delegate``, whose result arrives as a follow-up under an id known
when the run starts -- records the promise inside its turn (:meth:`Turn.expect
<._turn.Turn.expect>`): an :class:`~subagents.protocol.ExpectedEvent` holding the
message's id and a stand-in for it. The promise lives in memory only as long as
the activation does (a background run is the process's), so the log keeps it:

* it counts once its turn ended, unless that turn runs again (a crash cut it
  short, or the closing runtime kept its messages, under strict durability): the
  turn makes its promises anew then;
* it is kept while no message with its id reached the session: the message's
  turn, logged, settles it; an agent disposed with promises open checkpoints them
  (``expected``, an empty list when none is: a checkpoint without it is an older
  runtime's, which kept the events verbatim but not their promises, so the log
  behind it is read), as it does the quiet reports no turn saw;
* the session's next activation (:func:`~._resume.restore`) delivers the stand-in
  of each open promise under the promised id, as a message accepted then -- or the
  promised message itself, where the behaviour reads it from the store
  (:func:`settled`: a run that ended, its delivery lost) -- : where
  the durable inbox already accepted that id (the promised message arrived and did
  not run yet, or ran) nothing new is queued, so the model hears of each promise
  once -- the real message, or the stand-in;
* the store keeps a row for each open promise (``subagents.store._promises``):
  written before the turn's end, forgotten when the promise is kept or an
  activation delivers it (:meth:`SessionService.owe`), so a session owed a
  message is accepted work a sweep adopts when its holder died.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from subagents.protocol import (
    ExpectedEvent,
    MessageEvent,
    MessageId,
    MessageSource,
    ReportEvent,
    TurnEnd,
    TurnStart,
)
from subagents.store import InboxEntry, LogRecord

logger = logging.getLogger("subagents")

__all__ = [
    "Owed",
    "arrived",
    "behind",
    "checkpointed",
    "fold_owed",
    "forsaken",
    "settled",
    "stand_ins",
    "to_checkpoint",
    "unstored",
]

#: The open promises of a session, by the promised message's id.
Owed = dict[MessageId, ExpectedEvent]


def fold_owed(
    records: Sequence[LogRecord],
    seed_len: int,
    kept: Owed,
    runs_again: Callable[[tuple[MessageId, ...], TurnEnd | None], bool],
) -> Owed:
    """The promises open after ``records`` (from ``kept``, a checkpoint's): a fork
    seed's (before ``seed_len``) are another session's; ``runs_again(ids, end)``:
    whether the turn of messages ``ids`` that ended with ``end`` (None: left open,
    cut short by a crash) runs again at this activation -- it then makes its
    promises anew."""
    owed: Owed = dict(kept)
    turn: Owed | None = None  # the promises of the turn the log is inside
    mids: tuple[MessageId, ...] = ()
    for record in records:
        if record.seq < seed_len:
            continue
        event = record.event
        kind = type(event)
        if kind is ExpectedEvent:
            assert isinstance(event, ExpectedEvent)
            (owed if turn is None else turn)[event.message_id] = event
        elif kind is MessageEvent or kind is ReportEvent:
            mid = event.message_id  # type: ignore[attr-defined]
            owed.pop(mid, None)
            if turn is not None:
                turn.pop(mid, None)
        elif kind is TurnStart:
            assert isinstance(event, TurnStart)
            if turn and not runs_again(mids, None):
                owed.update(turn)  # an earlier turn left open
            turn, mids = {}, tuple(event.message_ids)
        elif kind is TurnEnd:
            assert isinstance(event, TurnEnd)
            if turn and not runs_again(mids, event):
                owed.update(turn)
            turn = None
    if turn and not runs_again(mids, None):
        owed.update(turn)
    return owed


def arrived(owed: Owed, message_ids: Iterable[MessageId]) -> list[MessageId]:
    """Messages ``message_ids`` run in a turn: the promises of their ids are kept
    (returned: the store forgets them, :meth:`SessionService.owe`)."""
    return [mid for mid in message_ids if owed.pop(mid, None) is not None]


def to_checkpoint(owed: Owed) -> list[list[Any]]:
    """The open promises as checkpoint data (``[id, stand-in, *source]``, the source
    as ``kind, session_id[, trace]``: the stand-in continues the trace of the turn
    that made the promise, as the promised message would have)."""
    return [[e.message_id, e.content, *_source_row(e.source)] for e in owed.values()]


def _source_row(source: MessageSource | None) -> tuple[Any, ...]:
    if source is None:
        return ()
    if source.trace is None:
        return (source.kind, source.session_id)
    return (source.kind, source.session_id, source.trace)


def checkpointed(state: Mapping[str, Any] | None) -> Owed | None:
    """The open promises a checkpoint kept (none without a checkpoint); None for a
    checkpoint without ``expected``, which a runtime from before promises wrote: it
    kept their events verbatim but not in its checkpoint, so those made before it
    are read from the log behind it (see :func:`behind`)."""
    if state is not None and "expected" not in state:
        return None
    owed: Owed = {}
    for mid, content, *source in (state or {}).get("expected") or ():
        src = None
        if source:  # (a checkpoint of a runtime from before traces has two)
            trace = source[2] if len(source) > 2 else None
            src = MessageSource(kind=source[0], session_id=source[1], trace=trace)
        owed[mid] = ExpectedEvent(message_id=mid, content=content, source=src)
    return owed


def behind(
    state: Mapping[str, Any], log: Callable[[], Sequence[LogRecord]], records: Sequence[LogRecord]
) -> list[LogRecord]:
    """What the promises are folded from past checkpoint ``state`` of an older runtime
    (:func:`checkpointed` is None): the log through its seq (``log()``, the whole
    log; read once, the next checkpoint carries them), then ``records``, the rest."""
    seq = state.get("seq", -1)
    return [r for r in log() if r.seq <= seq] + list(records)


def settled(owed: Owed, behaviour: Any, sessions: Any) -> Owed:
    """``owed`` with the message of each promise that was kept after all in place of
    its stand-in: ``behaviour.promised_message(sessions, promise)`` (a behaviour that
    makes promises may say) returns the promised message's content where the store
    holds it -- a background run that ended, its result never delivered -- else None
    (what it raises is logged: the stand-in then)."""
    read = getattr(behaviour, "promised_message", None)
    if not owed or read is None:
        return owed
    out: Owed = {}
    for mid, event in owed.items():
        try:
            content = read(sessions, event)
        except Exception:
            logger.exception("reading the message promised as %s failed", mid)
            content = None
        out[mid] = event if content is None else dataclasses.replace(event, content=content)
    return out


def forsaken(agent: Any) -> None:
    """``agent``'s activation ends with promises open: where it was disposed -- not
    settling (a continuable child's promises wait for a sweep, which delivers them),
    not the runtime closing (kept, as its inbox is), not its lease lost -- the store
    forgets them (``SessionService.owe``): no sweep brings a disposed agent back for
    them. Its checkpoint keeps them, for its next activation to deliver."""
    turns = agent._turns
    kept = turns.keep_accepted or agent._checkpoint_on_stop or not agent._flush_on_stop
    if turns.owed and not kept:
        agent._host.sessions.owe(agent._session, clear=True)


def stand_ins(owed: Owed) -> list[MessageEvent]:
    """The messages an activation delivers for the open promises, in promise order."""
    return [
        MessageEvent(message_id=e.message_id, content=e.content, source=e.source)
        for e in owed.values()
    ]


def unstored(owed: Owed) -> list[InboxEntry]:
    """The stand-ins as inbox entries of a session with no durable inbox (a memory
    store): handed to the activation as if accepted, in promise order."""
    return [InboxEntry(n=-1, event=event, epoch=None) for event in stand_ins(owed)]
