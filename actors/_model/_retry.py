"""When to retry a refused model request, and after how long, as the ``openai``
package decides it: :func:`retry_delay` (``retry-after-ms``, ``retry-after`` in
seconds or as an HTTP date, else exponential backoff with jitter) and
:func:`should_retry` (``x-should-retry`` first, then the status)."""

from __future__ import annotations

import email.utils
import random
import time
from collections.abc import Mapping
from typing import Final

__all__ = ["INITIAL_RETRY_DELAY", "MAX_RETRY_DELAY", "retry_delay", "should_retry"]

INITIAL_RETRY_DELAY: Final = 0.5
MAX_RETRY_DELAY: Final = 8.0


def retry_delay(headers: Mapping[str, str] | None, retries_done: int, max_retries: int) -> float:
    """Seconds to wait before the next try, as the ``openai`` package computes it:
    the server's ``retry-after-ms`` or ``retry-after`` when it is within 60 s,
    else ``0.5 * 2**n`` capped at 8 s, less up to 25 % jitter."""
    if headers is not None:
        wait: float | None = None
        ms = headers.get("retry-after-ms")
        if ms is not None:
            try:
                wait = float(ms) / 1000
            except ValueError:
                wait = None
        if wait is None and (after := headers.get("retry-after")) is not None:
            try:
                wait = float(after)
            except ValueError:
                parsed = email.utils.parsedate_tz(after)
                if parsed is not None:
                    wait = email.utils.mktime_tz(parsed) - time.time()
        if wait is not None and 0 < wait <= 60:
            return wait
    n = min(retries_done, max_retries)
    delay = min(INITIAL_RETRY_DELAY * 2.0**n, MAX_RETRY_DELAY)
    return float(delay * (1 - 0.25 * random.random()))


def should_retry(status: int, headers: Mapping[str, str]) -> bool:
    """Whether a refused request is worth trying again (``x-should-retry`` first)."""
    hint = headers.get("x-should-retry")
    if hint == "true":
        return True
    if hint == "false":
        return False
    return status in (408, 409, 429) or status >= 500
