"""Durations as whole microseconds (exact: no float in between); datetimes a log holds."""

from __future__ import annotations

import datetime as _dt

__all__ = ["micros", "storable_datetime"]


def micros(delta: _dt.timedelta) -> int:
    """``delta`` in whole microseconds."""
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def storable_datetime(value: _dt.datetime) -> bool:
    """Whether a log holds ``value`` and reads it back: aware, with a UTC time a
    ``datetime`` can hold (msgpack's Timestamp is read back as UTC). Never raises:
    a ``tzinfo`` whose ``utcoffset`` raises or says None makes it False."""
    tz = value.tzinfo
    if tz is _dt.UTC:
        return True
    if tz is None:
        return False
    try:
        if value.utcoffset() is None:
            return False
        value.astimezone(_dt.UTC)  # OverflowError within a day of the range's ends
    except Exception:
        return False
    return True
