"""One agent's background runs, for the dispatcher (:mod:`._dispatch`): the state
it keeps of them, and their disposal once they settled."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from subagents.actors._children import SubagentRun
from subagents.actors._kernel import AbortController
from subagents.protocol import SubagentError

__all__ = ["Background", "Countdown", "dispose_later", "dispose_quietly"]

logger = logging.getLogger("subagents")


class Background:
    """One agent's background runs (see :mod:`._dispatch`)."""

    __slots__ = ("backend", "controller", "one_shot", "release", "runs")

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.controller = AbortController()  # replaced after each cancel of them all
        self.runs: dict[str, SubagentRun] = {}
        self.release: Callable[[], None] | None = None  # the agent's residency hold
        self.one_shot: bool | None = None  # a one-shot child's (known once asked)


class Countdown:
    """Calls ``done`` once ``count`` runs were disposed (at once for none)."""

    __slots__ = ("_done", "_left", "_lock")

    def __init__(self, count: int, done: Callable[[], None] | None) -> None:
        self._lock = threading.Lock()
        self._left, self._done = count, done
        if count == 0:
            self._fire()

    def one(self) -> None:
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self._fire()

    def _fire(self) -> None:
        done, self._done = self._done, None
        if done is not None:
            done()


def dispose_later(backend: Any, run: SubagentRun, countdown: Countdown, _future: object) -> None:
    def dispose() -> None:
        dispose_quietly(run)
        countdown.one()

    backend.spawn(dispose, name="background-run-dispose")


def dispose_quietly(run: SubagentRun) -> None:
    try:
        run.dispose()
    except SubagentError as exc:
        logger.warning("disposing background run %s failed: %s", run.id, exc)
