"""The dispatcher actor: user callbacks, run in order, outside every owner.

Lifecycle listeners are user code. Run inside the registry or the supervisor, a
listener that blocks would stall admission or release; run by whoever changed the
state, ``subagent/start`` of an epoch could race its own ``subagent/end``. So the
owners only *post* callbacks here, after their state change, and this one actor
runs them one at a time in posting order: an epoch's end is posted when the
registry learns of its release (after its start, see ``_children/_announce.py``),
and a slow listener delays only other announcements.

A callback that raises is logged and the next one runs. The mailbox also takes
plain callables to ``ask`` (barriers).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

from subagents.supervision import NoticeBox, NoticeLoop

__all__ = ["DispatchBox", "Dispatcher"]


class DispatchBox(NoticeBox):
    """Callbacks for the dispatcher, posted from any thread or greenlet, kept in order."""

    __slots__ = ("_tokens",)

    def __init__(self) -> None:
        super().__init__(("call",))
        self._tokens = itertools.count()

    def call(self, fn: Callable[..., object], *args: Any) -> None:
        """Run ``fn(*args)`` in the dispatcher after everything posted before it.

        Pass the arguments rather than a closure: a drain posts one call a child,
        and what a busy dispatcher holds queued should be one small tuple each.
        """
        self.post("call", next(self._tokens), (fn, args))


class Dispatcher(NoticeLoop):
    """The dispatcher actor's behaviour (see the module docstring)."""

    def __init__(self, notices: DispatchBox) -> None:
        super().__init__()
        self.notices = notices

    def __repr__(self) -> str:
        return "<Dispatcher>"

    def on_notice(self, kind: str, key: Any, value: Any) -> None:
        fn, args = value
        fn(*args)

    def on_message(self, message: Any) -> Any:
        return message()
