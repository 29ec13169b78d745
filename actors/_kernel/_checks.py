"""Argument checks every public call of the actor layer shares."""

from __future__ import annotations

import math

from subagents.protocol import ErrorCode, SubagentError

__all__ = ["check_timeout"]


def check_timeout(value: object, name: str = "timeout") -> float | None:
    """A wait's timeout, checked: ``None`` or ``inf`` (no limit: returned as None) or a
    finite number of seconds >= 0.

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` for anything else (a bool, a string,
            NaN, a negative number).
    """
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
        if seconds >= 0:  # False for NaN
            return None if math.isinf(seconds) else seconds
    raise SubagentError(
        f"{name} is None or a number of seconds >= 0, got {value!r}",
        code=ErrorCode.INVALID_ARGUMENT,
    )
