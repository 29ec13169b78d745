"""What a model is told of a background ``delegate`` whose result's delivery went
wrong, and the trace its result and stand-in carry (R-ONE-7: one result per run;
L-8: nothing promised is lost; R-DUR-*: SQLite and PostgreSQL).

* A delivery the store refused for a reason that may pass (unavailable, locked)
  is tried again under the same id: the model gets the result in the same
  activation, once.
* One that never got through leaves the run's real result to the agent's next
  activation -- read from the run's child's log -- not a stand-in saying the
  run's process stopped.
* The result, and a stand-in delivered in its place (from the log, or from the
  checkpoint a closing runtime wrote), continue the trace of the turn that
  started the run (docs/tracing.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from background_script import FAST, SLOW, fast, responder, results_in, slow
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from subagents.actors import Runtime, openai_chat
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import FakeOpenAI
from subagents.protocol import ErrorCode, ExpectedEvent, MessageEvent, SubagentError


@pytest.fixture
def exporter() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def _runtime(db: str, backend: Backend, fake: FakeOpenAI, gate: Any, **kw: Any) -> Runtime:
    rt = Runtime(db, backend=backend, **kw)
    rt.models.register(FAST, lambda _o: fast(gate))
    rt.models.register(SLOW, lambda _o: slow)
    rt.models.register("m", openai_chat("gpt-test", base_url=fake.base_url, api_key="k"))
    return rt


def _results(fake: FakeOpenAI) -> list[dict[str, Any]]:
    return [r for request in fake.requests for r in results_in(request)]


def _refusing(rt: Runtime, code: str, times: int) -> tuple[list[Any], Any]:
    """The runtime's store refuses (``code``) the first ``times`` commits of a
    ``delegate_result``; returns the refusals so far, and an event set at the first."""
    accept, refused, first = rt.sessions.accept, [], rt.backend.event()

    def refusing(session_id: Any, events: Any, *args: Any, **kwargs: Any) -> Any:
        if len(refused) < times and any("delegate_result" in str(e.content) for e in events):
            refused.append(session_id)
            first.set()
            raise SubagentError("the store is unavailable (test)", code=code)
        return accept(session_id, events, *args, **kwargs)

    rt.sessions.accept = refusing  # type: ignore[method-assign]
    return refused, first


@pytest.mark.parametrize("code", [ErrorCode.PERSISTENCE_UNAVAILABLE, ErrorCode.TIMEOUT])
def test_a_refused_delivery_is_tried_again(backend: Backend, db: str, code: str) -> None:
    with FakeOpenAI(api_key="k", responder=responder()) as fake:
        gate = backend.event()
        with _runtime(db, backend, fake, gate) as rt:
            refused, _first = _refusing(rt, code, 2)
            agent = rt.spawn("m", label="root")
            agent.followup("start both")
            assert fake.wait_requests(2, 30) and agent.wait_idle(30)
            gate.set()  # the fast run ends; its delivery is refused twice
            assert fake.wait_requests(3, 30), "the result never reached the model"
            assert agent.wait_idle(30)
            assert len(refused) == 2
            labels = {r.label: str(r.id) for r in rt.subagents.list_children(agent.session_id).rows}
            assert _results(fake) == [
                {"id": labels[FAST], "stop_reason": "completed", "output": "fast done"}
            ]


def test_a_result_never_delivered_is_told_at_the_next_activation(backend: Backend, db: str) -> None:
    with FakeOpenAI(api_key="k", responder=responder()) as fake:
        gate = backend.event()
        with _runtime(db, backend, fake, gate) as rt:
            _refused, first = _refusing(rt, ErrorCode.PERSISTENCE_UNAVAILABLE, 10**6)
            agent = rt.spawn("m", label="root")
            sid = agent.session_id
            agent.followup("start both")
            assert fake.wait_requests(2, 30) and agent.wait_idle(30)
            gate.set()
            assert first.wait(30)  # its first try: the close then cancels the retries
            labels = {r.label: str(r.id) for r in rt.subagents.list_children(sid).rows}
        assert _results(fake) == []
        with _runtime(db, backend, fake, gate) as rt:
            rt.agents.resume(sid)
            assert fake.wait_requests(4, 30) and rt.wait_idle(30)
        by_id = {r["id"]: r for r in _results(fake)}
        assert by_id[labels[FAST]] == {
            "id": labels[FAST],
            "stop_reason": "completed",
            "output": "fast done",
        }
        assert "process stopped" in by_id[labels[SLOW]]["error"]["message"]


def test_a_result_and_a_stand_in_continue_the_trace_of_the_turn_that_started_the_run(
    backend: Backend, db: str, exporter: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, spans = exporter
    with FakeOpenAI(api_key="k", responder=responder()) as fake:
        gate = backend.event()
        with _runtime(db, backend, fake, gate, tracing=provider) as rt:
            agent = rt.spawn("m", label="root")
            sid = agent.session_id
            agent.followup("start both")
            assert fake.wait_requests(2, 30) and agent.wait_idle(30)
            gate.set()  # the fast result is delivered here; the slow run is cut
            assert fake.wait_requests(3, 30) and agent.wait_idle(30)
            rt.sessions.flush()
            log = [r.event for r in rt.store.read(sid)]
        # The closing runtime checkpointed the slow run's promise; resumed, it is stood in.
        with _runtime(db, backend, fake, gate, tracing=provider) as rt:
            rt.agents.resume(sid)
            assert fake.wait_requests(4, 30) and rt.wait_idle(30)
    done = spans.get_finished_spans()
    (first,) = [
        s
        for s in done
        if s.name == "subagents.turn"
        and s.attributes["subagents.turn"] == 0
        and s.attributes["subagents.session_id"] == str(sid)
    ]
    promised = [e.message_id for e in log if isinstance(e, ExpectedEvent)]
    assert len(promised) == 2
    result = [e for e in log if isinstance(e, MessageEvent) and e.message_id in promised]
    assert len(result) == 1  # the fast run's
    delivered = [
        s for s in done
        if s.name == "subagents.deliver" and s.attributes["subagents.message_id"] in promised
    ]  # fmt: skip
    assert len(delivered) == 2  # the result's and the stand-in's
    for span in delivered:
        assert span.context.trace_id == first.context.trace_id, span
    # The stand-in's delivery hangs right below the turn that made the promise.
    stand_in = [s for s in delivered if s.attributes["subagents.message_id"] not in
                {m.message_id for m in result}]  # fmt: skip
    assert [s.parent.span_id for s in stand_in] == [first.context.span_id]


def test_a_delivery_refused_past_the_retry_schedule_is_still_tried(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """L-8: an outage longer than the retry schedule (about two minutes; here three
    tries) does not leave a live agent's model waiting for good: the delivery is
    tried again, every ``RETRY_EVERY``, while the agent lives, and the result
    arrives in the same activation, once."""
    from subagents.actors._model import _background

    monkeypatch.setattr(_background, "RETRY_DELAYS", (0.01,) * 3)
    monkeypatch.setattr(_background, "RETRY_EVERY", 0.01)
    with FakeOpenAI(api_key="k", responder=responder()) as fake:
        gate = backend.event()
        with _runtime(db, backend, fake, gate) as rt:
            refused, _first = _refusing(rt, ErrorCode.PERSISTENCE_UNAVAILABLE, 8)
            agent = rt.spawn("m", label="root")
            agent.followup("start both")
            assert fake.wait_requests(2, 30) and agent.wait_idle(30)
            gate.set()  # the fast run ends; its delivery is refused 8 times (1 + 7 retries)
            assert fake.wait_requests(3, 30), "the result never reached the model"
            assert agent.wait_idle(30)
            assert len(refused) == 8
            labels = {r.label: str(r.id) for r in rt.subagents.list_children(agent.session_id).rows}
            assert _results(fake) == [
                {"id": labels[FAST], "stop_reason": "completed", "output": "fast done"}
            ]
