"""The threading runtime's actor: pykka's ``ThreadingActor`` with a cheaper inbox.

pykka's threading inbox is a ``queue.Queue``: every ``put`` and ``get`` runs
Python code under one mutex and signals a condition. With a producer thread and a
busy actor thread sharing the GIL, the two keep meeting on that mutex (a GIL
switch inside a critical section parks the other thread), which cost a follow-up
about half a context switch each.

:class:`_ThreadInbox` is a ``deque`` (append and popleft are atomic under the GIL)
plus a parking lock that only a *sleeping* consumer needs: a producer pays one
attribute read unless the actor is parked. Locks are looked up at construction,
so under gevent's monkey-patching they are the patched, cooperative ones.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import pykka
from pykka._envelope import Envelope

from ._actorinit import init_actor
from ._sigint import start_blocking_sigint

__all__ = ["ThreadActor"]


class _ThreadInbox:
    """One consumer thread, any number of producers.

    The consumer publishes ``_sleeping`` under ``_guard`` and then re-checks the
    deque before parking on ``_wake``; a producer appends *before* it reads
    ``_sleeping``. Under the GIL either the producer sees the flag (and releases
    ``_wake`` exactly once, under the guard, clearing the flag), or the consumer's
    re-check sees the item. ``_wake`` is held except between such a release and
    the consumer's next acquire, so it is released at most once per parking.
    """

    __slots__ = ("_guard", "_sleeping", "_wake", "queued")

    def __init__(self) -> None:
        #: The envelopes not yet taken, oldest first. Producers append; the one
        #: consumer may also pop from the left itself (an agent's run of turns).
        self.queued: collections.deque[Envelope[Any]] = collections.deque()
        self._sleeping = False
        self._guard = threading.Lock()
        self._wake = threading.Lock()
        self._wake.acquire()

    def put(self, envelope: Envelope[Any], /) -> None:
        self.queued.append(envelope)
        if self._sleeping:
            with self._guard:
                if self._sleeping:
                    self._sleeping = False
                    self._wake.release()

    def get(self) -> Envelope[Any]:
        items = self.queued
        while True:
            if items:
                return items.popleft()  # the only consumer: non-empty stays non-empty
            with self._guard:
                if items:
                    continue
                self._sleeping = True
            self._wake.acquire()

    def empty(self) -> bool:
        return not self.queued

    def qsize(self) -> int:
        return len(self.queued)


class ThreadActor(pykka.ThreadingActor):
    """:class:`pykka.ThreadingActor` with the deque inbox above; used identically."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        init_actor(self, threading.Event())  # pykka.Actor.__init__'s fields, cheaper

    @staticmethod
    def _create_actor_inbox() -> Any:
        return _ThreadInbox()

    def _start_actor_loop(self) -> None:
        # Ctrl-C is the main thread's (see _sigint): the actor's thread blocks it.
        start_blocking_sigint(super()._start_actor_loop)
