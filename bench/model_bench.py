"""Agents that think: tool-call round trips through the fake OpenAI server.

A turn of an ``openai_chat`` agent asks the model, runs the one tool call it gets
back (a no-op tool), answers it with a ``tool`` message and asks again for the
final text: one tool-call round trip, two HTTP requests, over real loopback HTTP
to :class:`~subagents.actors.testing.FakeOpenAI` (streamed, as the behaviour asks
by default), each the first turn of a fresh agent (a history grown over earlier
turns would lengthen every request). The baseline is a bare HTTP round trip --
one ``httpx`` POST of the same kind of streamed chat request to the same server,
read to its end, on a kept-alive connection -- measured in the same run. Two
requests per round trip put the ratio's ceiling at 0.5; the target (>= 0.15)
leaves room for the turn, the dispatch, a client (and so a connection) per turn,
and on gevent two threadpool hops per request.
"""

from __future__ import annotations

import httpx
from subagents.actors import ModelTool, Runtime, ToolDispatcher, openai_chat
from subagents.actors.testing import Answer, FakeCall, FakeOpenAI, FakeRequest

from bench._harness import Context, Row, best_of_each, compare, group, rate

_NOOP = ModelTool("Do nothing.", {"type": "object", "properties": {}}, lambda turn: {"ok": True})


def _responder(request: FakeRequest) -> Answer:
    if request.messages and request.messages[-1]["role"] == "tool":
        return Answer(content="done")
    return Answer(tool_calls=[FakeCall("noop", {}, id="call_0")])


def _bare(fake: FakeOpenAI, n: int) -> float:
    """Streamed chat requests, each read to its end, on one kept-alive connection."""
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    headers = {"Authorization": f"Bearer {fake.api_key}"}
    url = f"{fake.base_url}/chat/completions"
    with httpx.Client(headers=headers) as client:

        def run() -> None:
            for _ in range(n):
                with client.stream("POST", url, json=body) as response:
                    response.raise_for_status()
                    for _ in response.iter_bytes():
                        pass

        return rate(n, run)


def _turns(rt: Runtime, n: int) -> float:
    """``n`` first turns of fresh agents, one after another: a history that grew
    over earlier turns would make each request longer than the baseline's."""
    agents = [rt.spawn("thinker") for _ in range(n)]

    def run() -> None:
        for agent in agents:
            agent.followup("go")
            assert agent.wait_idle(60)

    try:
        return rate(n, run)
    finally:
        for agent in agents:
            agent.dispose()


@group("model")
def model_group(ctx: Context) -> list[Row]:
    n = ctx.size(400, 10)
    rows: list[Row] = []
    with FakeOpenAI(responder=_responder) as fake:
        for backend in ("threading", "gevent"):
            with Runtime(None, backend=backend) as rt:
                dispatcher = ToolDispatcher(tools=(), extra={"noop": _NOOP})
                rt.models.register(
                    "thinker",
                    openai_chat(
                        "m", base_url=fake.base_url, api_key=fake.api_key, tools=dispatcher
                    ),
                )
                _turns(rt, 2)  # warm up
                ours, bare = best_of_each(
                    1 if ctx.quick else 3, lambda: _turns(rt, n), lambda: _bare(fake, n)
                )
            base = Row(
                workload="bare HTTP round trip", backend="-", store="-", value=bare, unit="req/s"
            )
            row = Row(
                workload="tool-call round trip (2 requests)",
                backend=backend,
                store="memory",
                value=ours,
                unit="trips/s",
            )
            rows += [base, compare(row, base, target=None if ctx.quick else 0.15)]
    return rows
