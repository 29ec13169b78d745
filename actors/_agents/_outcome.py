"""How one turn ended."""

from __future__ import annotations

from typing import Any

__all__ = ["TurnOutcome"]


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
