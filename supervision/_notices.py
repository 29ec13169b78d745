"""Notices to one actor from any thread, batched into few mailbox messages.

A busy runtime tells its owners many small things at once: a drain that quiets
10,000 children posts 10,000 quiescence notices to the supervisor, and as many
retirements travel between the supervisor and the registry. Queued as pykka
envelopes, 20,000 of them outlived young garbage collections and set off a full
one. A :class:`NoticeBox` keeps them in one insertion-ordered dict per *kind*
instead, and schedules a single :data:`DRAIN` message whenever none is pending:
the owner swaps the dicts out under the box's lock (clearing the pending flag
there too), so every notice is either in a swapped-out dict or schedules a drain.

Posting a key that is already queued coalesces (the latest value wins): a
notice asks the owner to look again, it is not an event log. Kinds are handled
in the order they were declared, so an owner can rely on, say, "retired" being
seen before "quiescent" when both were posted in that order.

:class:`NoticeLoop` is the owner's side, a mixin for a pykka actor class: every
message first drains the notices posted before it (so a callable sent after some
notices -- a test barrier -- runs after them), then goes to ``on_message``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterable, Sequence
from typing import Any, Final

import pykka

__all__ = ["DRAIN", "NoticeBox", "NoticeLoop"]

logger = logging.getLogger("subagents")


class _Drain:
    """The one mailbox message a box schedules: drain the notices queued so far."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DRAIN"


DRAIN: Final = _Drain()


class NoticeBox:
    """Notices for one actor, from any thread or greenlet (see the module docstring)."""

    __slots__ = ("_kinds", "_lock", "_queued", "_ref", "_scheduled")

    def __init__(self, kinds: Sequence[str]) -> None:
        self._kinds = tuple(kinds)
        self._queued: dict[str, dict[Any, Any]] = {kind: {} for kind in self._kinds}
        # A native lock held for a few bytecodes, never across a call out or a
        # greenlet switch: it excludes threads and greenlets alike.
        self._lock = threading.Lock()
        self._scheduled = False
        self._ref: Any = None

    def bind(self, ref: Any) -> None:
        """The owner's actor ref (set once, before the first notice)."""
        self._ref = ref

    def post(self, kind: str, key: Any, value: Any = None) -> None:
        """Queue ``key`` (with ``value``) under ``kind``; coalesces a queued ``key``."""
        with self._lock:
            self._queued[kind][key] = value
            if self._scheduled:
                return
            self._scheduled = True
        with contextlib.suppress(pykka.ActorDeadError):  # closing: nobody listens now
            self._ref.tell(DRAIN)

    def take(self) -> list[tuple[str, Iterable[tuple[Any, Any]]]]:
        """Swap out what was posted so far: ``(kind, items)`` in declaration order."""
        if not self._scheduled:
            # Nothing posted since the last take (a post sets it, under the lock,
            # with its notice): every message an owner handles takes once more to
            # find the box empty, and a post racing this read schedules a drain.
            return []
        taken: list[tuple[str, Iterable[tuple[Any, Any]]]] = []
        with self._lock:
            self._scheduled = False
            queued = self._queued
            for kind in self._kinds:
                items = queued[kind]
                # Never hand out a live dict, not even an empty one: a poster adding
                # to it while the owner iterates would break the iteration.
                if items:
                    queued[kind] = {}
                    taken.append((kind, items.items()))
        return taken


class NoticeLoop:
    """Mixin for an actor that owns a :class:`NoticeBox` (set ``self.notices``).

    Subclasses implement ``on_notice(kind, key, value)`` and ``on_message(message)``.
    A notice handler that raises is logged: one bad notice must not stop the owner.
    """

    notices: NoticeBox

    def on_receive(self, message: Any) -> Any:
        """pykka's entry point: drain the notices, then :meth:`on_message`."""
        while True:
            taken = self.notices.take()
            if not taken:
                break
            for kind, items in taken:
                for key, value in items:
                    try:
                        self.on_notice(kind, key, value)
                    except Exception:
                        logger.exception("%s failed on a %s notice for %r", self, kind, key)
        if message is DRAIN:
            return None
        return self.on_message(message)

    def on_notice(self, kind: str, key: Any, value: Any) -> None:
        """Handle one notice ``(kind, key, value)``."""
        raise NotImplementedError

    def on_message(self, message: Any) -> Any:
        """Handle one ordinary message (the notices are drained before it)."""
        raise NotImplementedError
