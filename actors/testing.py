"""``subagents.actors.testing``: tools for testing agent trees deterministically.

In trio's spirit, the library ships what its own tests use:

* :class:`Gate` -- a blocking point a test controls: a turn that reaches it
  announces that (``wait_reached``) and waits for ``release()`` or its own
  cancellation. Ordering is forced with gates, never with sleeps.
* :class:`ScriptedBehaviour` -- a deterministic behaviour that runs a list of
  steps per turn: replies, one-shot delegation, reports, gates, failures.
* :class:`LifecycleProbe` -- records ``subagent/*`` lifecycle events and waits for
  them.
* :func:`wait_quiescent` -- wait until every live agent of a runtime is idle.
* :class:`FakeOpenAI` -- a loopback OpenAI-compatible ``/v1/chat/completions``
  server, scriptable per request with :class:`Answer` and :class:`FakeCall`
  (streamed and whole answers, tool calls, errors, stalls).

Example::

    gate = Gate()
    rt.models.register("worker", lambda _: ScriptedBehaviour([Block(gate), Reply("done")]))
    agent = rt.spawn("worker")
    agent.followup("go")
    gate.wait_reached(5)      # the turn is now provably running
    agent.cancel("stop")      # ... so this cancel hits it
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ._agents import Turn
from ._children import SubagentEvent
from ._kernel import AbortController, Gate
from ._testing_openai import Answer, FakeCall, FakeOpenAI, FakeRequest

if TYPE_CHECKING:
    from ._runtime import Runtime

__all__ = [
    "Answer",
    "Block",
    "Call",
    "Delegate",
    "Fail",
    "FakeCall",
    "FakeOpenAI",
    "FakeRequest",
    "Gate",
    "LifecycleProbe",
    "Reply",
    "Report",
    "ScriptedBehaviour",
    "Step",
    "wait_quiescent",
]


class Step:
    """One step of a scripted turn; ``run`` returns a value for the outputs list."""

    def run(self, turn: Turn) -> Any:
        """Do this step of the turn; its value may be the turn's output."""
        raise NotImplementedError


@dataclass(frozen=True)
class Reply(Step):
    """Set the turn's output (``"{content}"`` formatting with the turn's content)."""

    text: Any = "{content}"

    def run(self, turn: Turn) -> Any:
        """Return ``text`` with ``{content}`` replaced by the turn's content."""
        if isinstance(self.text, str):
            return self.text.format(content=turn.content, index=turn.index)
        return self.text


@dataclass(frozen=True)
class Delegate(Step):
    """Delegate a one-shot child and return its :class:`RunResult`."""

    prompt: Any
    provider: str = "local"
    options: dict[str, Any] = field(default_factory=dict)

    def run(self, turn: Turn) -> Any:
        """Start a one-shot child with ``prompt`` and return its result."""
        return turn.subagents.delegate(self.provider, self.prompt, **self.options)


@dataclass(frozen=True)
class Report(Step):
    """Report to the parent (continuable children only)."""

    content: Any
    delivery: str = "quiet"

    def run(self, turn: Turn) -> Any:
        # Refused with UNAUTHORIZED unless the turn's agent is a live continuable child.
        """Report ``content`` to the parent with ``delivery``."""
        return turn.subagents.report(self.content, delivery=self.delivery)


@dataclass(frozen=True)
class Block(Step):
    """Wait at a :class:`Gate` (raises ``CANCELLED`` when the turn is cancelled)."""

    gate: Gate

    def run(self, turn: Turn) -> Any:
        """Wait at the gate until the test releases it."""
        self.gate.pass_through(turn.signal)
        return None


@dataclass(frozen=True)
class Fail(Step):
    """Raise an exception (the turn ends ``failed``)."""

    message: str = "scripted failure"

    def run(self, turn: Turn) -> Any:
        """Raise, failing the turn with ``message``."""
        raise RuntimeError(self.message)


@dataclass(frozen=True)
class Call(Step):
    """Run an arbitrary function of the turn (escape hatch)."""

    fn: Callable[[Turn], Any]

    def run(self, turn: Turn) -> Any:
        """Call ``fn(turn)``; its return value is the step's output."""
        return self.fn(turn)


class ScriptedBehaviour:
    """Runs ``steps`` on every turn (or ``per_turn[i]`` on turn ``i`` when given).

    The turn's output is the value of the last step that returned one (a
    :class:`Reply` usually comes last); with no steps it echoes the content.
    Deterministic: no clocks, no randomness, no sleeps.
    """

    def __init__(
        self, steps: Sequence[Step] = (), *, per_turn: Sequence[Sequence[Step]] | None = None
    ) -> None:
        self.steps = tuple(steps)
        self.per_turn = tuple(tuple(s) for s in per_turn) if per_turn is not None else None
        self.turns_seen: list[Any] = []

    def on_turn(self, turn: Turn) -> Any:
        """Run this turn's steps in order; the last step's value is the output."""
        self.turns_seen.append(turn.content)
        steps = self.steps
        if self.per_turn is not None and turn.index < len(self.per_turn):
            steps = self.per_turn[turn.index]
        output: Any = turn.content
        for step in steps:
            value = step.run(turn)
            if value is not None:
                output = value
        return output


class LifecycleProbe:
    """Records lifecycle events from ``runtime.subagents`` (optionally scoped)."""

    def __init__(self, runtime: Runtime, *, scope: Any = None) -> None:
        self.events: list[SubagentEvent] = []
        self._lock = threading.Lock()
        self._changed = AbortController()
        self._subscription = runtime.subagents.subscribe(self._record, scope=scope)

    def _record(self, event: SubagentEvent) -> None:
        with self._lock:
            self.events.append(event)
            changed, self._changed = self._changed, AbortController()
        changed.abort("event")

    def types(self) -> list[str]:
        """The types of the events seen so far, in order."""
        with self._lock:
            return [e.type for e in self.events]

    def wait_for(
        self, predicate: Callable[[list[SubagentEvent]], bool], timeout: float = 10.0
    ) -> bool:
        """Block until ``predicate(events)`` holds (checked on every new event)."""
        import time

        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if predicate(list(self.events)):
                    return True
                changed = self._changed
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not changed.signal.wait(remaining):
                with self._lock:
                    return predicate(list(self.events))

    def close(self) -> None:
        """Stop listening. Idempotent."""
        self._subscription.dispose()


def wait_quiescent(runtime: Runtime, timeout: float = 10.0) -> bool:
    """Wait until every live agent is idle (re-checked until stable)."""
    for _ in range(100):
        agents = runtime.agents.list()
        if all(a.wait_idle(timeout) for a in agents) and all(a.idle for a in runtime.agents.list()):
            return True
    return False
