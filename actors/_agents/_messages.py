"""The messages an agent's inbox takes, and the fast "the log holds it" check.

Each message is put into the pykka inbox as its own envelope (``message`` is
itself, ``reply_to`` is None: they are never asked), which saves an Envelope
allocation per follow-up. ``n`` is the message's acceptance number: a cancel
without ``keep_inbox`` discards every message numbered at or below its watermark.

* :class:`Deliver` -- one turn (a follow-up, the initial prompt, or a waking report);
* :class:`Quiet` -- a quiet report: kept as context for the next turn;
* :class:`Call` -- run a function in the agent's context, in inbox order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from subagents.protocol import Event, MessageId, MessageSource

if TYPE_CHECKING:
    from ._outcome import TurnOutcome

__all__ = ["OWN", "UNTAKEN", "Call", "Deliver", "Own", "Quiet", "plain"]

#: ``Deliver.redelivered`` of a message committed to the durable inbox and taken
#: by no activation yet (it reached this one through the registry): the turn
#: records it taken before running it, so a crash inside the turn replays it as a
#: redelivery.
UNTAKEN: Final = 2


class Own:
    """Base of the agent's own messages: each is its own pykka envelope."""

    __slots__ = ()
    reply_to = None

    @property
    def message(self) -> Own:
        return self


class Deliver(Own):
    # Using slots: one of these is allocated per follow-up on the hot path.
    __slots__ = ("content", "extra", "kind", "message_id", "n", "on_end", "redelivered", "source")

    def __init__(
        self,
        n: int,
        message_id: MessageId,
        content: Any,
        source: MessageSource | None,
        kind: str,
        extra: tuple[Event, ...],
        on_end: Callable[[TurnOutcome], object] | None,
        redelivered: bool | int = False,
    ) -> None:
        self.n = n
        self.message_id = message_id
        self.content = content
        self.source = source
        self.kind = kind
        self.extra = extra
        self.on_end = on_end
        self.redelivered = redelivered


class Quiet(Own):
    __slots__ = ("content", "message_id", "n", "source")

    def __init__(
        self, n: int, message_id: MessageId, content: Any, source: MessageSource | None
    ) -> None:
        self.n = n
        self.message_id = message_id
        self.content = content
        self.source = source


class Call(Own):
    __slots__ = ("fn", "n")

    def __init__(self, n: int, fn: Callable[[], object]) -> None:
        self.n = n
        self.fn = fn


#: The agent's own message types (the actor dispatches them before pykka's).
OWN: Final = frozenset({Deliver, Quiet, Call})

# Values the log always holds (str length aside, which packb checks): skipping the
# trial pack for them saves ~1.5 us per follow-up and per turn.
_SCALARS: Final[frozenset[type]] = frozenset({int, float, bool, type(None)})


def plain(value: Any) -> bool:
    """True for a value the session log certainly holds without a trial pack."""
    kind = type(value)
    if kind is str:
        # Only ASCII is certain (an O(1) flag in CPython): any other string may hold a
        # lone surrogate, which UTF-8 -- and so the log -- cannot.
        return len(value) < 65536 and value.isascii()
    if kind is int:
        return -(2**63) <= value < 2**64  # type: ignore[no-any-return]
    return kind in _SCALARS
