"""Calling what users hand the runtime to hear of events: listeners, observers,
result callbacks.

What one raises is logged and goes no further -- ``SystemExit`` and the other
``BaseException``\\ s too: raised out of an actor (the dispatcher announcing a
child's end, an agent going idle), pykka stops every actor of the process, so one
listener's ``sys.exit()`` would dispose every agent. Three go on: ``GreenletExit``
(the greenlet the listener runs in is being killed), ``gevent.Timeout`` (a
caller's ``with Timeout(...)`` around code that calls it) and
``KeyboardInterrupt`` (a user's Ctrl-C is never swallowed).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Final

from gevent import Timeout
from greenlet import GreenletExit

__all__ = ["RAISED", "hear"]

logger = logging.getLogger("subagents")

#: What :func:`hear` returns for a listener that raised.
RAISED: Final[Any] = object()


def hear(fn: Callable[[Any], object], arg: Any, what: str) -> object:
    """``fn(arg)``'s return value, or :data:`RAISED` when it raised: logged as ``what``
    (``"idle listener"``) with ``fn`` and the traceback, and contained (see the
    module docstring for the three that go on)."""
    try:
        return fn(arg)
    except (GreenletExit, Timeout, KeyboardInterrupt):
        raise
    except BaseException:
        logger.exception("%s %r raised", what, fn)
        return RAISED
