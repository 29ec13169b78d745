"""One agent's background runs, for the dispatcher (:mod:`._dispatch`): the state
it keeps of them, the delivery of each one's result, and their disposal once they
settled.

A result's delivery is a follow-up of the agent under the id the turn promised
(``Turn.expect``), so it is accepted once however often it is tried. One the
store refused for a reason that may pass -- it was unavailable, or locked past its
busy timeout: ``PERSISTENCE_UNAVAILABLE`` (perhaps committed all the same: the
retry with its id settles that) or ``TIMEOUT`` -- is tried again, in a task of its
own, after :data:`RETRY_DELAYS` and then every :data:`RETRY_EVERY` seconds, for as
long as the agent and its runs live (the run stays counted, so the agent stays
resident). One
that could not be delivered at all says so where it would fit: a result the log
cannot hold (``ENCODE_ERROR``) is delivered as the run's failure to deliver it.
What did not arrive when the agent went (disposed, or its runtime closed) stays
promised: the agent's next activation reads the
run's end from its child's log (:func:`._delegated.kept_result`) and delivers
that, not a stand-in saying the run stopped.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any, Final

from subagents.actors._children import SubagentRun
from subagents.actors._kernel import AbortController, AbortSignal
from subagents.protocol import ErrorCode, MessageId, MessageSource, SubagentError

from ._delegated import failure, run_result

__all__ = [
    "Background",
    "Countdown",
    "deliver_result",
    "dispose_later",
    "dispose_quietly",
    "in_order",
]

logger = logging.getLogger("subagents")

#: Seconds between the first tries of a result's delivery the store refused for
#: a reason that may pass (about two minutes in all) ...
RETRY_DELAYS: Final = (0.05, 0.25, 1.0, 2.0, 4.0, *(8.0,) * 14)
#: ... and between the tries after those, for as long as the agent and its runs
#: live (an outage can outlast two minutes: a live top-level agent has no next
#: activation to deliver the result at).
RETRY_EVERY: Final = 8.0
#: Refusals that may pass (see the module docstring).
_PASSING: Final = frozenset({ErrorCode.PERSISTENCE_UNAVAILABLE, ErrorCode.TIMEOUT})


def deliver_result(
    agent: Any, run: SubagentRun, signal: AbortSignal, source: MessageSource, delivery: MessageId
) -> Callable[[], None] | None:
    """Deliver settled ``run``'s result to ``agent`` (from ``source``, under
    ``delivery``) unless the run was cancelled with the agent's work; the retries
    to run in a task of their own where the store refused it for a reason that
    may pass (None: nothing left to do). See the module docstring."""
    if agent.disposed or signal.aborted:
        return None  # cancelled with the agent's work: nobody waits for it
    try:
        done = run_result(agent.host.sessions, run.id, run.result.get(0), structured=False)
    except Exception as exc:
        done = {"id": str(run.id), "error": failure(exc)}
    content: dict[str, Any] = {"delegate_result": done}
    error = _offer(agent, content, source, delivery)
    if error is not None and error.code == ErrorCode.ENCODE_ERROR:
        # The log cannot hold it: the run's result, as far as the model can be told.
        unheld = {"id": str(run.id), "stop_reason": done.get("stop_reason"), "output": None}
        content = {"delegate_result": {**unheld, "error": failure(error)}}
        error = _offer(agent, content, source, delivery)
    if error is None or error.code not in _PASSING:
        return None

    def retries() -> None:
        for tries, delay in enumerate(_delays(), 1):
            if signal.wait(delay) or agent.disposed:
                return  # cancelled meanwhile: as above
            again = _offer(agent, content, source, delivery)
            if again is None or again.code not in _PASSING:
                return
            if tries == len(RETRY_DELAYS):
                logger.error(
                    "background result of %s not delivered after %d tries; tried every"
                    " %g s while its agent lives (its next activation delivers it)",
                    run.id,
                    tries,
                    RETRY_EVERY,
                )

    return retries


def _delays() -> Iterator[float]:
    yield from RETRY_DELAYS
    while True:
        yield RETRY_EVERY


def in_order(first: Callable[[], object], then: Callable[[], object]) -> None:
    """``first()``, then ``then()`` whatever ``first`` raised."""
    try:
        first()
    finally:
        then()


def _offer(
    agent: Any, content: Any, source: MessageSource, delivery: MessageId
) -> SubagentError | None:
    """One try of a delivery: None once accepted, else why not (logged)."""
    tel = agent.host.telemetry
    try:
        # Accepted inside the trace of the turn that started the run.
        with tel.continuing(source) if tel is not None else contextlib.nullcontext():
            agent.followup(content, source=source, message_id=delivery)
    except SubagentError as exc:
        logger.warning("background result of %s not delivered: %s", source.session_id, exc)
        return exc
    return None


class Background:
    """One agent's background runs (see :mod:`._dispatch`)."""

    __slots__ = ("backend", "controller", "one_shot", "release", "runs", "starting")

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.controller = AbortController()  # replaced after each cancel of them all
        self.runs: dict[str, SubagentRun] = {}
        # Runs being started (not in ``runs`` yet): they keep the hold too -- an
        # earlier run finishing meanwhile must not end it under them.
        self.starting = 0
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
