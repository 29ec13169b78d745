"""What the model answers in the delegate replay test's turn, in the process that is
killed and again in the replay: ``delegate`` to a one-shot child of model
:data:`CHILD` (waiting for its result), then ``last``. The child marks each run
of its turn in a file (a side effect both processes see)."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from subagents.actors.testing import Answer, FakeCall, FakeRequest

CHILD = "counter-model"
DELEGATE = {"prompt": "count", "model": CHILD, "label": "counter"}


def responder(last: Answer) -> Callable[[FakeRequest], Answer]:
    """The answer to each request of the turn, by how many tool results it carries."""

    def respond(request: FakeRequest) -> Answer:
        results = [m for m in request.messages if m.get("role") == "tool"]
        if not results:
            return Answer(tool_calls=[FakeCall("delegate", DELEGATE)])
        return last

    return respond


def counter(marks: str, then: Callable[[], None] = lambda: None) -> Callable[[Any], str]:
    """The child's behaviour: mark the run in ``marks`` (one line, this process's
    id), ``then`` (the worker's: die there), and answer which process counted."""

    def behaviour(turn: Any) -> str:
        with open(marks, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()}\n")
        then()
        return f"counted by {os.getpid()}"

    return behaviour
