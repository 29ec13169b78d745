"""Announcing a continuable epoch: ``subagent/start`` strictly before ``subagent/end``.

The start of an epoch is announced by whoever published it, in its own thread,
once the registry has published it -- before ``start_continuable`` or the
follow-up that cold-resumed the child returns, as a one-shot run's start is
announced before ``start`` returns. The end is announced by the dispatcher when
the supervisor has released it. A child can settle before its publisher gets to
announce the start; then the end waits for the start and is announced right
after it, by the publisher. Either way the epoch's ``released`` latch is set once
its end was announced, so a drain that returns has announced its whole forest.

Successive epochs of one child are announced in order too: a cold resume can
publish the next epoch while the previous one's end still waits in the
dispatcher (behind a slow listener, or while a listener of that very end resumes
the child). Then the new start is posted to the dispatcher behind that end
instead of being announced by the publisher -- it is announced late rather than
out of order, and an end listener that resumes its child cannot wait on itself.

An epoch started while nobody listens (no listener, no tracing) is *quiet*: it
announces neither event (a drain of 10,000 children with nobody listening builds
none); its ``released`` latch is still set by the dispatcher, behind what was
posted to it before. An epoch whose end came before its unheard start (or whose
previous epoch's end was still queued) keeps the order above, and emits neither
event either. A listener hears the whole pairs of the epochs started after it
subscribed, as it does of one-shot runs, and no lone end of an epoch nobody heard
start.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from subagents.actors._kernel import DispatchBox, Telemetry
from subagents.protocol import SessionId
from subagents.supervision import Activation

from ._types import SubagentEvent

__all__ = ["Announcer"]

# ``Activation.announced``: flags.
_STARTED = 1
_END_WAITING = 2
_QUIET = 8  # started with nobody listening: no pair is announced (alone, no other flag)
# Started with nobody listening after its end came first: it keeps the announced
# path's order, but emits neither event (a listener subscribing meanwhile would
# hear a lone end).
_UNHEARD = 4


class Announcer:
    """Orders each epoch's lifecycle pair (see the module docstring)."""

    def __init__(
        self,
        emit: Callable[[SubagentEvent, SessionId | None], object],
        dispatch: DispatchBox,
        telemetry: Telemetry | None,
        listening: Callable[[], bool],
    ) -> None:
        self._emit = emit
        self._listening = listening
        self._dispatch = dispatch
        self._telemetry = telemetry
        self._lock = threading.Lock()  # held for a flag, never across a call out
        # Epochs released whose end is not announced yet, by child: present only
        # between a release and its end's announcement (a drain's worth at most).
        self._ending: dict[SessionId, list[Activation]] = {}
        # Bound once: a drain queues one a child (young garbage that outlives
        # collections while the dispatcher is busy).
        self._end_later = self.end
        self._start_later = self._start

    def start(self, act: Activation) -> None:
        """Announce ``subagent/start`` (the publisher, after publication); when
        tracing, the epoch's span starts, below the publisher's current span."""
        tel = self._telemetry
        if tel is None and not self._listening():
            with self._lock:
                # Quiet unless an end came first: its own (settled before this
                # start, its end queued or waiting for it) or a previous epoch's.
                if act.announced == 0 and act.child_id not in self._ending:
                    act.announced = _QUIET
                    return
                act.announced |= _UNHEARD
        if tel is not None:
            act.span = tel.start(
                "subagents.activation",
                {"child_id": act.child_id, "parent_session_id": act.parent_session,
                 "run_id": act.run_id, "provider": act.provider},
            )  # fmt: skip
        with self._lock:
            # A previous epoch's end still queued or being announced -- not only
            # this epoch's own: it may have settled already, and its end waits for
            # this start, announced here.
            ending = self._ending.get(act.child_id)
            behind = ending is not None and any(e is not act for e in ending)
        if behind:  # the previous epoch's end is queued: announce after it
            self._dispatch.call(self._start_later, act)
        else:
            self._start(act)

    def post_end(self, act: Activation) -> None:
        """Queue ``subagent/end`` in the dispatcher (the registry, on release, before
        anyone can publish the child's next epoch)."""
        with self._lock:
            quiet = act.announced == _QUIET
            if not quiet:
                self._ending.setdefault(act.child_id, []).append(act)
        if quiet:
            # Nothing to announce; the latch still waits behind what was posted to
            # the dispatcher before (a drain that returns saw all of it run).
            self._dispatch.call(act.released.set)
            return
        self._dispatch.call(self._end_later, act)

    def _start(self, act: Activation) -> None:
        try:
            if not act.announced & _UNHEARD:
                self._emit(self._event(act, "subagent/start", None), act.parent_session)
        finally:
            with self._lock:
                end_waiting = act.announced & _END_WAITING
                act.announced = _STARTED | (act.announced & _UNHEARD)
            if end_waiting:
                self._end(act)

    def end(self, act: Activation) -> None:
        """Announce ``subagent/end`` (the dispatcher, after release)."""
        with self._lock:
            if not act.announced & _STARTED:
                act.announced |= _END_WAITING  # the publisher announces it after the start
                return
        self._end(act)

    def _end(self, act: Activation) -> None:
        stop = "cancelled" if act.drained else "completed"
        try:
            if not act.announced & _UNHEARD:
                self._emit(self._event(act, "subagent/end", stop), act.parent_session)
        finally:
            with self._lock:
                ending = self._ending.get(act.child_id)
                if ending is not None:
                    ending[:] = [e for e in ending if e is not act]
                    if not ending:
                        del self._ending[act.child_id]
            if act.span is not None:
                Telemetry.end(act.span, stop)
            act.released.set()

    @staticmethod
    def _event(act: Activation, kind: str, stop_reason: str | None) -> SubagentEvent:
        return SubagentEvent(
            type=kind,
            provider=act.provider,
            run_id=act.run_id,
            local=True,
            parent_session=act.parent_session,
            child_id=str(act.child_id),
            mode="continuable",
            stop_reason=stop_reason,
        )
