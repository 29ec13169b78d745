"""The checks of a :class:`~subagents.actors.ray.RayPlacement`'s arguments (before
Ray sees them: it raised ``ValueError``/``TypeError`` for some, and the hosts
died of others). Nothing here needs Ray."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from subagents.protocol import ErrorCode, SubagentError


def _bad(message: str) -> SubagentError:
    return SubagentError(message, code=ErrorCode.INVALID_ARGUMENT)


def _seconds(value: Any, name: str) -> float:
    if type(value) not in (int, float) or not (0 < value < math.inf):
        raise _bad(f"{name} is a number of seconds > 0")
    return float(value)


def _check_arguments(
    store: Any,
    hosts: Any,
    name: Any,
    num_cpus: Any,
    resources: Any,
    max_restarts: Any,
    lease_ttl: Any,
    options: Any,
) -> None:
    """``INVALID_ARGUMENT`` for what a RayPlacement cannot start hosts with (Ray
    itself raised ``ValueError``/``TypeError`` for some; the hosts died of others)."""
    if type(hosts) is not int or hosts < 1:
        raise _bad("hosts is an int >= 1")
    if type(store) is not str:
        raise _bad("store is a path or a postgresql:// URL")
    if type(name) is not str or not name.strip():
        raise _bad("name is a non-blank str")
    if type(num_cpus) not in (int, float) or not (0 <= num_cpus < math.inf):
        raise _bad("num_cpus is a number >= 0")
    if type(max_restarts) is not int or max_restarts < -1:
        raise _bad("max_restarts is an int >= -1 (-1: always)")
    _seconds(lease_ttl, "lease_ttl")
    if resources is not None and (
        not isinstance(resources, Mapping)
        or not all(
            type(k) is str and type(v) in (int, float) and 0 <= v < math.inf
            for k, v in resources.items()
        )
    ):
        raise _bad("resources maps names to numbers >= 0")
    if options is not None and (
        not isinstance(options, Mapping) or not all(type(k) is str for k in options)
    ):
        raise _bad("options maps ray.remote option names to values")
