"""Waiting for room in a bounded inbox: ``followup(..., wait_for_room=seconds)``.

A follow-up to a child whose inbox is full (``max_inbox`` messages accepted and
not yet done) raises :class:`~subagents.protocol.InboxFullError` at once, having
accepted nothing. A caller that would rather wait passes ``wait_for_room``: the
follow-up is tried again, from scratch, until it is accepted, the time is up (the
last ``INBOX_FULL`` is raised), or the caller's signal aborts (``CANCELLED``).

The room may open in another process (the child's holder ends a turn there), so
the wait does not rely on a wake-up from this one: it tries again after a pause
that doubles from :data:`FIRST_PAUSE` to :data:`LONGEST_PAUSE`. The pause is the
signal's own wait, so it is cooperative on gevent and ends at once on an abort.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final, TypeVar

from subagents.actors._kernel import AbortSignal
from subagents.protocol import InboxFullError

__all__ = ["FIRST_PAUSE", "LONGEST_PAUSE", "until_room"]

#: Seconds before the first retry; each later pause doubles, up to LONGEST_PAUSE.
FIRST_PAUSE: Final = 0.001
LONGEST_PAUSE: Final = 0.025

T = TypeVar("T")


def until_room(attempt: Callable[[], T], timeout: float | None, signal: AbortSignal | None) -> T:
    """``attempt()``, tried again while it raises ``INBOX_FULL`` for up to ``timeout``
    seconds (``None``: no limit).

    Raises:
        InboxFullError: still full when the time is up.
        SubagentError: ``CANCELLED`` when ``signal`` aborts; whatever ``attempt`` raises.
    """
    try:
        return attempt()
    except InboxFullError:
        if timeout == 0:
            raise
    deadline = None if timeout is None else time.monotonic() + timeout
    waiter = signal if signal is not None else AbortSignal.never()
    pause = FIRST_PAUSE
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return attempt()  # the last try: its INBOX_FULL is the caller's
        if waiter.wait(pause if left is None else min(pause, left)):
            waiter.raise_if_aborted()
        pause = min(pause * 2, LONGEST_PAUSE)
        try:
            return attempt()
        except InboxFullError:
            continue
