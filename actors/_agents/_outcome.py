"""How one turn ended."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from subagents.actors._kernel._listeners import hear

__all__ = ["CLOSED_ONE_SHOT", "DISCARDED", "KEPT", "TurnOutcome", "notify"]


class TurnOutcome:
    """How one turn ended: stop reason, output, structured output, error text."""

    __slots__ = ("error", "output", "stop_reason", "structured", "turn")

    def __init__(
        self, turn: int, stop_reason: str, output: Any, structured: Any, error: str | None
    ) -> None:
        self.turn = turn
        self.stop_reason = stop_reason
        self.output = output
        self.structured = structured
        self.error = error

    def __repr__(self) -> str:
        return f"TurnOutcome({self.turn}, {self.stop_reason!r}, {self.output!r})"


DISCARDED = "discarded unrun"
#: The error text of a turn the closing runtime cancelled (strict durability): its
#: messages stay accepted and run again at the next activation, as after a crash.
KEPT = "cancelled: the runtime closed; its messages run again"
#: The same for a one-shot child's turn: its run ends there, never to run again.
CLOSED_ONE_SHOT = "cancelled: the runtime closed; a one-shot run does not run again"


def notify(fn: Callable[[TurnOutcome], object], outcome: TurnOutcome) -> None:
    """Call a turn observer; what it raises is logged, never propagated."""
    hear(fn, outcome, "turn observer")
