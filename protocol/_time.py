"""Durations as whole microseconds (exact: no float in between)."""

from __future__ import annotations

import datetime as _dt

__all__ = ["micros"]


def micros(delta: _dt.timedelta) -> int:
    """``delta`` in whole microseconds."""
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
