"""What the model answers in the background-promise tests, in the process that
stops and again where the parent is resumed: its first turn starts two background
``delegate`` runs -- :data:`FAST`, whose child answers at once, and :data:`SLOW`,
whose child runs until it is cancelled -- and says :data:`STARTED`; a turn that
runs a ``delegate_result`` answers :data:`GOT`. ``on_result``: called with each
request that carries a result (the worker's: die there)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from subagents.actors.testing import Answer, FakeCall, FakeRequest

FAST, SLOW = "fast-model", "slow-model"
STARTED, GOT = "started both", "got a result"


def delegate(model: str) -> FakeCall:
    return FakeCall(
        "delegate", {"prompt": "work", "model": model, "label": model, "background": True}
    )


def results_in(request: FakeRequest) -> list[dict[str, Any]]:
    """The ``delegate_result`` its turn's message delivers, when a request starts a
    turn that runs one (none: []): the last message but a note of a turn that runs
    again."""
    messages = [m for m in request.messages if m.get("role") != "system"]
    last = messages[-1]
    content = last.get("content")
    if last.get("role") != "user" or not isinstance(content, str):
        return []
    if "delegate_result" not in content:
        return []
    return [json.loads(content[content.index("{") :])["delegate_result"]]


def responder(on_result: Callable[[FakeRequest], None] | None = None) -> Any:
    def respond(request: FakeRequest) -> Answer:
        if results_in(request):
            if on_result is not None:
                on_result(request)
            return Answer(content=GOT)
        if any(m.get("role") == "tool" for m in request.messages):
            return Answer(content=STARTED)
        return Answer(tool_calls=[delegate(FAST), delegate(SLOW)])

    return respond


def fast(gate: Any) -> Callable[[Any], str]:
    """The fast child's behaviour: it answers once ``gate`` opens."""

    def behaviour(_turn: Any) -> str:
        gate.wait(30)
        return "fast done"

    return behaviour


def slow(turn: Any) -> str:
    turn.signal.wait(60)  # until the run is cancelled (or its process stops)
    return "slow stopped"
