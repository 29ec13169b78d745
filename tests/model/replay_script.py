"""What the model answers in the replay test's turn, in the process that is killed
and again in the replay: start a continuable child ``w``, send it a message (its
id read from the start's result), then ``last``."""

from __future__ import annotations

import json
from collections.abc import Callable

from subagents.actors.testing import Answer, FakeCall, FakeRequest

CHILD = "child-model"


def responder(last: Answer) -> Callable[[FakeRequest], Answer]:
    """The answer to each request of the turn, by how many tool results it carries."""

    def respond(request: FakeRequest) -> Answer:
        results = [m for m in request.messages if m.get("role") == "tool"]
        if not results:
            start = {"prompt": "watch", "label": "w", "model": CHILD}
            return Answer(tool_calls=[FakeCall("start_agent", start)])
        if len(results) == 1:
            child = json.loads(results[0]["content"])["id"]
            return Answer(tool_calls=[FakeCall("send_message", {"id": child, "content": "more"})])
        return last

    return respond
