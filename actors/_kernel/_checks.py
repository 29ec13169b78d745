"""Argument checks every public call of the actor layer shares."""

from __future__ import annotations

import datetime as _dt
import logging
import math
import reprlib
from collections.abc import Callable
from typing import Final

from subagents.protocol import ErrorCode, SubagentError, storable_datetime

__all__ = [
    "check_listener",
    "check_max_inbox",
    "check_runtime_arguments",
    "check_timeout",
    "checked_clock",
    "stamping_clock",
    "utcnow",
]

logger = logging.getLogger("subagents")

Clock = Callable[[], _dt.datetime]

_now = _dt.datetime.now
_UTC = _dt.UTC


def utcnow() -> _dt.datetime:
    """The system's UTC time: the runtime's clock unless one is injected. With it,
    a turn reads the time once and dates its end by the time it took."""
    return _now(_UTC)


def check_listener(fn: object, what: str = "a listener") -> None:
    """Refuse a listener that cannot be called (``INVALID_ARGUMENT``): taken, it
    would fail at every event it was meant to hear, far from the mistake."""
    if not callable(fn):
        raise SubagentError(
            f"{what} is callable, got {type(fn).__name__}", code=ErrorCode.INVALID_ARGUMENT
        )


_EXACT = 2**53  # ints below convert to float exactly (and never overflow)


def check_timeout(value: object, name: str = "timeout") -> float | None:
    """A wait's timeout, checked: ``None`` or ``inf`` (no limit: returned as None) or a
    finite number of seconds >= 0.

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` for anything else (a bool, a string,
            NaN, a negative number).
    """
    if value is None:
        return None
    if type(value) is float and 0.0 <= value < math.inf:  # the usual case, one test
        return value
    if type(value) is int and 0 <= value < _EXACT:  # the other usual one: get(10)
        return float(value)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            seconds = float(value)
        except OverflowError:  # an int past float's range: no limit, or negative
            seconds = math.inf if value > 0 else -math.inf
        if seconds >= 0:  # False for NaN
            return None if math.isinf(seconds) else seconds
    raise SubagentError(
        f"{name} is None or a number of seconds >= 0, got {reprlib.repr(value)}",
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
    max_inbox: object = None,
    adopt: object = True,
    keep_warm: object = 0.0,
    adopted_grace: object = 30.0,
) -> None:
    """The ``Runtime`` constructor's arguments, checked before anything is built.

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` naming the first bad one.
    """
    for flag, value in (
        ("projections", projections),
        ("default_providers", default_providers),
        ("adopt", adopt),
    ):
        if type(value) is not bool:
            raise SubagentError(f"{flag} is a bool", code=ErrorCode.INVALID_ARGUMENT)
    if durability not in ("strict", "relaxed"):
        raise SubagentError("durability is 'strict' or 'relaxed'", code=ErrorCode.INVALID_ARGUMENT)
    if (
        type(lease_ttl) not in (int, float) or not 0 < lease_ttl <= MAX_LEASE_TTL  # type: ignore[operator]
    ):
        # (Bounded: its renewals wait a third of it, and a wait has a longest.)
        raise SubagentError(
            f"lease_ttl is a number of seconds > 0 and <= {MAX_LEASE_TTL:g}",
            code=ErrorCode.INVALID_ARGUMENT,
        )
    check_keep_warm(keep_warm)
    check_keep_warm(adopted_grace, "adopted_grace")
    if max_delegation_depth is not None and (
        type(max_delegation_depth) is not int or max_delegation_depth < 1
    ):
        raise SubagentError(
            "max_delegation_depth is an int >= 1 or None", code=ErrorCode.INVALID_ARGUMENT
        )
    if clock is not None and not callable(clock):
        raise SubagentError("clock must be callable", code=ErrorCode.INVALID_ARGUMENT)
    check_max_inbox(max_inbox, "max_inbox")


#: The longest lease (seconds; some 31 years).
MAX_LEASE_TTL: Final = 1e9


def check_keep_warm(value: object, name: str = "keep_warm") -> None:
    """Seconds an idle agent stays resident (``name``: ``keep_warm``, a child's;
    ``adopted_grace``, an adoption's): a number >= 0 (``inf``: for good),
    ``INVALID_ARGUMENT`` otherwise -- an int past a float's range too."""
    if type(value) not in (int, float) or value != value or value < 0:  # type: ignore[operator]
        raise SubagentError(f"{name} is a number of seconds >= 0", code=ErrorCode.INVALID_ARGUMENT)


def check_max_inbox(value: object, name: str) -> None:
    """An inbox bound: an int from 1 to 2**63 - 1 (what the log holds), or None
    (``INVALID_ARGUMENT``)."""
    if value is not None and (type(value) is not int or not 1 <= value < 2**63):
        raise SubagentError(
            f"{name} is an int from 1 to 2**63 - 1, or None", code=ErrorCode.INVALID_ARGUMENT
        )


def checked_clock(clock: Clock) -> Clock:
    """``clock`` whose every value is checked as the log checks a time: an aware
    ``datetime`` the log reads back (``protocol.storable_datetime``).

    Raises (the returned clock):
        SubagentError: ``INVALID_ARGUMENT`` for another value, or when ``clock``
            raises -- so a call that stamps what it creates (a session's header)
            refuses before anything is created.
    """

    def now() -> _dt.datetime:
        try:
            value = clock()
        except Exception as exc:
            raise SubagentError(
                f"the runtime's clock raised {type(exc).__name__}", code=ErrorCode.INVALID_ARGUMENT
            ) from exc
        if type(value) is not _dt.datetime or not storable_datetime(value):
            raise SubagentError(
                f"the runtime's clock returned a {type(value).__name__} the log cannot hold"
                " (a clock returns an aware datetime within the UTC range)",
                code=ErrorCode.INVALID_ARGUMENT,
            )
        return value

    return now


def stamping_clock(checked: Clock) -> Clock:
    """For the times nobody waits on (a turn's start and end, a resume's repair): the
    system's UTC time stands in for a value ``checked`` refuses, so the turn is
    recorded and the session goes on; said once, as a warning."""
    said = False

    def now() -> _dt.datetime:
        nonlocal said
        try:
            return checked()
        except SubagentError as exc:
            if not said:
                said = True
                logger.warning("%s; the system's UTC time stands in", exc)
            return _dt.datetime.now(_dt.UTC)

    return now
