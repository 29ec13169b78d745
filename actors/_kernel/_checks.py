"""Argument checks every public call of the actor layer shares."""

from __future__ import annotations

import math

from subagents.protocol import ErrorCode, SubagentError

__all__ = ["check_runtime_arguments", "check_timeout"]


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


def check_runtime_arguments(
    *,
    projections: object,
    default_providers: object,
    durability: object,
    lease_ttl: object,
    max_delegation_depth: object,
    clock: object,
) -> None:
    """The ``Runtime`` constructor's arguments, checked before anything is built.

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` naming the first bad one.
    """
    for flag, value in (("projections", projections), ("default_providers", default_providers)):
        if type(value) is not bool:
            raise SubagentError(f"{flag} is a bool", code=ErrorCode.INVALID_ARGUMENT)
    if durability not in ("strict", "relaxed"):
        raise SubagentError("durability is 'strict' or 'relaxed'", code=ErrorCode.INVALID_ARGUMENT)
    if (
        type(lease_ttl) not in (int, float)
        or not math.isfinite(lease_ttl)  # type: ignore[arg-type]
        or lease_ttl <= 0  # type: ignore[operator]
    ):
        raise SubagentError(
            "lease_ttl is a finite number of seconds > 0", code=ErrorCode.INVALID_ARGUMENT
        )
    if max_delegation_depth is not None and (
        type(max_delegation_depth) is not int or max_delegation_depth < 1
    ):
        raise SubagentError(
            "max_delegation_depth is an int >= 1 or None", code=ErrorCode.INVALID_ARGUMENT
        )
    if clock is not None and not callable(clock):
        raise SubagentError("clock must be callable", code=ErrorCode.INVALID_ARGUMENT)
