"""Native (OS-thread) locks, even under gevent monkey-patching.

The stores' locks are held only for a few statements and never across a
greenlet switch, and the SQLite store's callers run in gevent's threadpool (real
threads) where a patched lock would be wrong. So the stores always use the
unpatched ``_thread`` lock.
"""

from __future__ import annotations

import _thread
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["native_lock", "original_sleep"]


def _resolve() -> Callable[[], Any]:
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("_thread"):
        original: Callable[[], Any] = monkey.get_original("_thread", "allocate_lock")
        return original
    return _thread.allocate_lock


native_lock: Callable[[], _thread.LockType] = _resolve()


def original_sleep() -> Callable[[float], None]:
    """``time.sleep`` as the OS has it, even when gevent patched it (then it would
    switch to the hub)."""
    monkey = sys.modules.get("gevent.monkey")
    if monkey is not None and monkey.is_module_patched("time"):
        sleep: Callable[[float], None] = monkey.get_original("time", "sleep")
        return sleep
    return time.sleep
