"""A whole turn, held as one compact record until a reader asks for its events.

A turn stands for ``turn/start``, the turn's extra events, the quiet reports it
took as context, the delivered message (a ``message``, or a waking ``report``)
and ``turn/end``. Building those objects on every turn cost about as much as the
mailbox itself, and most are never read back in the process that wrote them. A
:class:`TurnRecord` keeps the values the turn already has -- what the delivered
envelope held (copied: the envelope itself is not kept alive with the log), the
context, one wall-clock time and the turn's elapsed time -- and
occupies one slot per event it stands for in a session's log (the same object in
each slot), so seq arithmetic over the log is unchanged. :meth:`TurnRecord.event`
builds the event of one seq on first demand, equal to what the turn would have
appended, so its encoding -- and a log's bytes on disk -- are the same.

Who writes one: the agent's turn loop (``begin``: the head's slots; the end's
slot once the turn ended). Who reads one: :func:`materialise` wherever a log is
handed out as events (reads, a store that is not compact-aware).
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, final

from ._ids import MessageId
from ._trusted import trusted_message, trusted_turn_end, trusted_turn_start
from ._vocabulary import Event, MessageSource, ReportEvent, TurnEnd

__all__ = ["Delivered", "TurnRecord", "materialise"]

_delta = _dt.timedelta
_new_str = str.__new__
_fromtimestamp = _dt.datetime.fromtimestamp
_UTC = _dt.UTC


class Delivered(Protocol):
    """What a turn was handed: its message and how it came (the inbox envelope)."""

    message_id: MessageId
    content: Any
    source: MessageSource | None
    kind: str  # "message", or "report" for a waking report
    extra: tuple[Event, ...]  # logged between turn/start and the context
    redelivered: Any  # ``True``: the turn's start records it


@final  # readers tell it from an event by type identity (store/_memory.py)
class TurnRecord:
    """One turn of a log (see the module docstring).

    ``seq`` is the seq of its ``turn/start``; its head (start, extra, context,
    delivered) fills ``size`` slots from there. ``end_seq`` is the seq of its
    ``turn/end`` (``-1`` until the turn ended; other events -- an interrupt, a
    steered message -- may lie between head and end). ``end`` is ``(stop_reason,
    output, structured, error, usage, at)``, where ``at`` is ``None`` when the
    end's time is the start's plus ``elapsed`` seconds (one wall-clock read a turn).
    The start time ``at`` may be given as POSIX seconds (``time.time()``): it is
    dated when first read.

    What was delivered is copied from the envelope (:class:`Delivered`):
    ``message_id``, ``content``, ``source``, ``kind``, ``extra`` and
    ``redelivered`` (a bool).

    The owner sets ``seq``, ``end`` and ``end_seq`` before it publishes the slots
    they describe; after that a record only caches what it built.
    """

    __slots__ = (
        "_at",
        "_end",
        "_given",
        "_head",
        "_mid",
        "content",
        "context",
        "elapsed",
        "end",
        "end_seq",
        "extra",
        "kind",
        "redelivered",
        "seq",
        "size",
        "source",
        "turn",
    )

    def __init__(
        self,
        turn: int,
        at: _dt.datetime | float,
        delivered: Delivered,
        context: tuple[Any, ...] = (),
    ) -> None:
        self.turn = turn
        # A float is the system clock's POSIX seconds (time.time), dated only when
        # read: building a datetime was a fifth of a turn's bookkeeping, and most
        # records are never read back in the process that wrote them.
        self._given: _dt.datetime | float = at
        self._at: _dt.datetime | None = None
        # What was delivered, copied: the envelope itself is not kept alive (one
        # object fewer a turn for the cycle collector to walk while the log lives).
        # The id as a plain str: a str subclass is one more object the cycle
        # collector walks for as long as the log lives (see ``message_id``).
        self._mid = str(delivered.message_id)
        self.content = delivered.content
        self.source = delivered.source
        self.kind = delivered.kind
        self.extra = extra = delivered.extra
        self.redelivered = delivered.redelivered is True
        # Quiet reports taken as context: values with message_id, content, source.
        self.context = context
        self.size = 2 + len(context) + len(extra) if context or extra else 2
        self.seq = -1
        self.end_seq = -1
        self.elapsed = 0.0
        self.end: tuple[str, Any, Any, str | None, Mapping[str, int] | None, Any] | None = None
        self._head: tuple[Event, ...] | None = None
        self._end: TurnEnd | None = None

    @property
    def message_id(self) -> MessageId:
        """The delivered message's id."""
        return _new_str(MessageId, self._mid)

    @property
    def at(self) -> _dt.datetime:
        """The turn's start time (``turn/start``'s), an aware UTC datetime."""
        at = self._at
        if at is None:
            given = self._given  # two readers may both date it: equal values
            at = _fromtimestamp(given, _UTC) if isinstance(given, float) else given
            self._at = at
        return at

    def event(self, seq: int) -> Event:
        """The event at ``seq`` (one of this record's slots)."""
        if seq == self.end_seq:
            return self.end_event()
        head = self._head
        if head is None:
            head = self.head()
        return head[seq - self.seq]

    def head(self) -> tuple[Event, ...]:
        """The events from ``turn/start`` to the delivered message, in log order."""
        head = self._head
        if head is not None:
            return head
        mid = _new_str(MessageId, self._mid)
        events: list[Event] = [trusted_turn_start(self.turn, self.at, (mid,), self.redelivered)]
        events.extend(self.extra)
        for q in self.context:
            events.append(
                ReportEvent(
                    message_id=q.message_id, content=q.content, source=q.source, delivery="quiet"
                )
            )
        if self.kind == "report":
            events.append(
                ReportEvent(
                    message_id=mid, content=self.content, source=self.source, delivery="waking"
                )
            )
        else:
            events.append(trusted_message(mid, self.content, self.source))
        head = self._head = tuple(events)  # two readers may both build it: equal values
        return head

    def end_event(self) -> TurnEnd:
        """The ``turn/end`` (``end`` must be set)."""
        built = self._end
        if built is None:
            end = self.end
            if end is None:
                raise ValueError(f"turn {self.turn} has not ended")
            stop, output, structured, error, usage, at = end
            if at is None:
                at = self.at + _delta(seconds=self.elapsed)
            built = self._end = trusted_turn_end(
                self.turn, at, stop, output, structured, error, usage
            )
        return built

    def ended(
        self,
        stop: str,
        output: Any,
        structured: Any,
        error: str | None,
        usage: Mapping[str, int] | None,
        at: _dt.datetime | None = None,
    ) -> None:
        """Set (or, before its slot is published, replace) how the turn ended."""
        self.end = (stop, output, structured, error, usage, at)
        self._end = None

    def __repr__(self) -> str:
        return f"TurnRecord(turn={self.turn}, seq={self.seq}, size={self.size})"


def materialise(first_seq: int, items: Iterable[Any]) -> list[Event]:
    """The events of a log's slots from ``first_seq`` on (records built as needed)."""
    return [
        item.event(seq) if type(item) is TurnRecord else item
        for seq, item in enumerate(items, first_seq)
    ]
