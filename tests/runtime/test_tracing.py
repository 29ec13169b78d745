"""OpenTelemetry spans of an agent tree (issue 18 point 3), with the SDK's
in-memory exporter, on both backends.

A span per turn, one-shot run, continuable activation, acceptance (follow-up,
start, report) and delivery, with session, child and message ids as attributes;
the message carries its acceptance's context, so the span tree follows the agent
tree -- in one process and across processes (through the store).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, MessageEvent, SubagentError

Spans = list[ReadableSpan]


@pytest.fixture
def exporter() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def tree(turn: Any) -> Any:
    """root -> kid (continuable) -> grandkid (continuable, reports waking to kid);
    root also delegates a one-shot run."""
    content = turn.content
    if content == "root":
        turn.subagents.start_continuable("local", "kid", label="kid", model="tree")
        result = turn.subagents.delegate("local", "oneshot", model="tree", timeout=30)
        return f"root saw {result.output}"
    if content == "kid":
        turn.subagents.start_continuable("local", "grandkid", label="grandkid", model="tree")
    elif content == "grandkid":
        turn.subagents.report("grandkid reports", delivery="waking")
    return f"ran {content}"


def _by_id(spans: Spans) -> dict[int, ReadableSpan]:
    return {s.context.span_id: s for s in spans}


def _parent(span: ReadableSpan, index: dict[int, ReadableSpan]) -> ReadableSpan | None:
    return index.get(span.parent.span_id) if span.parent is not None else None


def _ancestor_turn(span: ReadableSpan, index: dict[int, ReadableSpan]) -> ReadableSpan | None:
    up = _parent(span, index)
    while up is not None and up.name != "subagents.turn":
        up = _parent(up, index)
    return up


def _attr(span: ReadableSpan, name: str) -> Any:
    assert span.attributes is not None
    return span.attributes.get(f"subagents.{name}")


def test_the_span_tree_follows_the_agent_tree(
    backend: Backend, tmp_path: Path, exporter: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """Issue 18 point 3: every turn hangs below its message's delivery, the
    delivery below the acceptance that sent it, and that below the sender's turn:
    a child's turn's nearest turn above is its parent's (a report's: the
    reporting child's). One trace from the root's follow-up; the run and the
    activations are spans too, all with their ids."""
    provider, spans_out = exporter
    with Runtime(str(tmp_path / "t.db"), backend=backend, tracing=provider) as rt:
        rt.models.register("tree", lambda options: tree)
        root = rt.spawn("tree", label="root")
        root.followup("root")
        assert rt.wait_idle(30)
        rt.subagents.drain_continuable_descendants([root])
        headers = {}
        for record in rt.subagents.list_descendants(root.session_id):
            if record.mode == "continuable":
                headers[str(record.id)] = rt.sessions.header(record.id)
        rt.sessions.flush()
        messages = {
            str(e.message_id): e
            for sid in [*headers, root.session_id]
            for e in (r.event for r in rt.sessions.read(sid))
            if isinstance(e, MessageEvent)
        }
    spans = spans_out.get_finished_spans()
    index = _by_id(spans)
    names = {s.name for s in spans}
    assert names == {
        "subagents.followup", "subagents.start", "subagents.report", "subagents.run",
        "subagents.activation", "subagents.deliver", "subagents.turn",
    }  # fmt: skip
    assert len({s.context.trace_id for s in spans}) == 1  # one trace, from the root's follow-up
    turns = [s for s in spans if s.name == "subagents.turn"]
    by_session: dict[str, list[ReadableSpan]] = {}
    for turn in turns:
        by_session.setdefault(_attr(turn, "session_id"), []).append(turn)
        deliver = _parent(turn, index)
        assert deliver is not None and deliver.name == "subagents.deliver"
        assert deliver.kind == SpanKind.CONSUMER
        accepted = _parent(deliver, index)
        assert accepted is not None
        # An acceptance (PRODUCER), or the one-shot run that delivered its prompt.
        assert accepted.kind == SpanKind.PRODUCER or accepted.name == "subagents.run"
        assert _attr(deliver, "message_id") == _attr(turn, "message_id")
        above = _ancestor_turn(turn, index)
        session = _attr(turn, "session_id")
        if session == str(root.session_id):
            assert above is None  # the root's turn: below the caller's follow-up only
            continue
        assert above is not None
        header = headers.get(session)
        if accepted.name == "subagents.report":  # a waking report: below the reporter's turn
            assert rt_parent(headers, _attr(above, "session_id")) == session
        elif header is not None:  # a continuable child: below its parent's turn
            assert _attr(above, "session_id") == str(header.parent_session)
        else:  # the one-shot child: below the run, below the root's turn
            run = _parent(accepted, index) if accepted.name != "subagents.run" else accepted
            assert run is not None
            assert _attr(above, "session_id") == str(root.session_id)
    assert {len(v) for v in by_session.values()} >= {1}
    assert len(by_session) == 4  # root, kid, grandkid, the one-shot child
    # Message ids: a traced message's source carries its acceptance's context.
    for turn in turns:
        event = messages.get(_attr(turn, "message_id"))
        if event is not None and event.source is not None:
            assert event.source.trace is not None
            assert f"{turn.context.trace_id:032x}" in event.source.trace
    activations = [s for s in spans if s.name == "subagents.activation"]
    assert {_attr(s, "child_id") for s in activations} == set(headers)
    assert all(_attr(s, "stop_reason") in ("completed", "cancelled") for s in activations)
    (run,) = [s for s in spans if s.name == "subagents.run"]
    assert _attr(run, "stop_reason") == "completed" and _attr(run, "child_id")
    assert _attr(_ancestor_turn(run, index), "session_id") == str(root.session_id)


def rt_parent(headers: dict[str, Any], session: str) -> str | None:
    header = headers.get(session)
    return None if header is None else str(header.parent_session)


def test_a_failed_acceptance_fails_its_span(
    backend: Backend, exporter: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """Issue 18 point 3: an acceptance that raises records the error on its span
    (and nothing is delivered)."""
    provider, spans_out = exporter
    with Runtime(backend=backend, tracing=provider) as rt:
        root = rt.spawn("echo")
        with pytest.raises(SubagentError):
            rt.subagents.followup(root, "ab" * 16, "nobody")
    (span,) = spans_out.get_finished_spans()
    assert span.name == "subagents.followup"
    assert not span.status.is_ok
    assert any(e.name == "exception" for e in span.events)


class _Broken(SpanProcessor):
    """A span processor that raises for every span, at its start or at its end."""

    def __init__(self, where: str) -> None:
        self.where = where
        self.calls = 0

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        if self.where == "start":
            self.calls += 1
            raise RuntimeError("processor broke at on_start")

    def on_end(self, span: ReadableSpan) -> None:
        if self.where == "end":
            self.calls += 1
            raise RuntimeError("processor broke at on_end")


@pytest.mark.parametrize("where", ["start", "end"])
def test_a_span_processor_that_raises_loses_spans_not_work(
    backend: Backend,
    tmp_path: Path,
    where: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 18 point 3: tracing never changes what happens. A processor raising
    for every span used to kill the agent whose turn it traced (pykka's unhandled
    exception; the runtime still counted it live, its next follow-up raised
    ``AGENT_DISPOSED``, and a parent delegating to a one-shot child never got its
    result), and to fail an acceptance after the message was accepted. Now the
    whole tree runs -- turns, a one-shot run, continuable children and their
    reports -- every call returns, and the failure is logged once loudly."""
    from subagents.actors._kernel import _telemetry

    monkeypatch.setattr(_telemetry, "_failures", 0)  # loud once per process: this one
    provider = TracerProvider()
    broken = _Broken(where)
    provider.add_span_processor(broken)
    with Runtime(str(tmp_path / "t.db"), backend=backend, tracing=provider) as rt:
        rt.models.register("tree", lambda options: tree)
        root = rt.spawn("tree", label="root")
        root.followup("root")
        assert rt.wait_idle(30)
        rt.sessions.flush()
        ends = rt.sessions.turn_ends(root.session_id)
        assert [(e.stop_reason, e.output) for e in ends] == [("completed", "root saw ran oneshot")]
        assert not root.disposed
        root.followup("again")  # the agent lives on
        assert root.wait_idle(30)
        kids = rt.subagents.list_descendants(root.session_id).rows
        assert len([r for r in kids if r.mode == "continuable"]) == 2  # kid, grandkid
        for kid in kids:
            if kid.mode == "continuable":
                outputs = [e.output for e in rt.sessions.turn_ends(kid.id)]
                assert outputs[0] in ("ran kid", "ran grandkid"), outputs
    assert broken.calls > 10
    loud = [r for r in caplog.records if r.levelname == "ERROR" and "tracing failed" in r.message]
    assert len(loud) == 1


def test_a_send_to_another_process_and_a_steer_by_id_are_traced(
    backend: Backend, tmp_path: Path, exporter: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """Issue 18 point 3: ``agents.send`` to a session another runtime holds, and a
    steer naming the parent by id, each make a ``subagents.followup`` span whose
    context the message carries: the holder's delivery and turn hang below it. Both
    paths accepted the message with no span (the send's turn began a trace of its
    own), unlike the same calls on a live agent."""
    from subagents.actors.testing import Gate

    provider, spans_out = exporter
    tracer = provider.get_tracer("test")
    gate = Gate("steered")

    def worker(turn: Any) -> Any:
        if turn.content == "block":
            gate.pass_through(turn.signal)
            return [m.content for m in turn.steering()]
        return turn.content

    def lead(turn: Any) -> Any:
        if turn.content == "go":
            turn.subagents.start_continuable("local", "hello", label="w", model="worker")
        return turn.content

    db = str(tmp_path / "t.db")
    with (
        Runtime(db, backend=backend, tracing=provider, keep_warm=60) as holder,
        Runtime(db, backend=backend, tracing=provider) as other,
    ):
        holder.models.register("worker", lambda _o: worker)
        holder.models.register("lead", lambda _o: lead)
        root = holder.spawn("lead")
        root.followup("go")
        assert holder.wait_idle(30)
        (kid,) = holder.subagents.list_children(root.session_id).rows
        spans_out.clear()
        with tracer.start_as_current_span("caller") as caller:
            sent = other.agents.send(root.session_id, "sent from elsewhere")
        holder.subagents.followup(root, kid.id, "block")
        assert gate.wait_reached(30)
        steered = holder.subagents.followup(root.session_id, kid.id, "by id", steer=True)
        assert steered.outcome == "steered"
        gate.release()
        assert holder.wait_idle(30)
        assert holder.sessions.turn_ends(kid.id)[-1].output == ["by id"]
        for _ in range(300):  # the holder runs the sent message when its wake-up lands
            if any(
                e.output == "sent from elsewhere"
                for e in holder.sessions.turn_ends(root.session_id)
            ):
                break
            backend.sleep(0.05)
        else:
            raise AssertionError("never ran")
    spans = spans_out.get_finished_spans()
    index = _by_id(spans)
    followups = {_attr(s, "message_id"): s for s in spans if s.name == "subagents.followup"}
    assert str(steered.message_id) in followups
    sent_span = followups[str(sent)]
    assert sent_span.context.trace_id == caller.get_span_context().trace_id
    (turn,) = [
        s for s in spans if s.name == "subagents.turn" and _attr(s, "message_id") == str(sent)
    ]
    deliver = _parent(turn, index)
    assert deliver is not None and _parent(deliver, index) is sent_span


def test_failed_work_has_an_error_status_and_cancelled_work_none(
    backend: Backend, tmp_path: Path, exporter: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """Issue 18 point 3: a failed turn and a failed one-shot run have an error
    status (the run's was unset), and the run names its id (``subagents.run_id``,
    as tracing.md lists); a turn the closing runtime cancels has none, as an
    interrupted one (it had one: the text its end records read as an error)."""
    from subagents.actors.testing import Gate

    provider, spans_out = exporter
    gate = Gate("held")

    def behaviour(turn: Any) -> Any:
        if turn.content == "fail":
            raise RuntimeError("it broke")
        if turn.content == "delegate":
            return turn.subagents.delegate("local", "fail", model="mine", timeout=30).stop_reason
        gate.pass_through(turn.signal)
        return None

    with Runtime(str(tmp_path / "t.db"), backend=backend, tracing=provider) as rt:
        rt.models.register("mine", lambda _o: behaviour)
        agent = rt.spawn("mine")
        agent.followup("delegate")
        assert agent.wait_idle(30)
        agent.followup("hold")
        assert gate.wait_reached(30)
    spans = spans_out.get_finished_spans()
    turns = {_attr(s, "stop_reason"): s for s in spans if s.name == "subagents.turn"}
    assert set(turns) == {"completed", "failed", "cancelled"}
    assert not turns["failed"].status.is_ok and not turns["failed"].status.is_unset
    assert turns["cancelled"].status.is_unset and turns["completed"].status.is_unset
    (run,) = [s for s in spans if s.name == "subagents.run"]
    assert _attr(run, "stop_reason") == "failed" and not run.status.is_unset
    assert _attr(run, "run_id") == _attr(run, "child_id") is not None


def test_tracing_off_makes_no_spans_and_leaves_sources_alone(
    backend: Backend, exporter: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """Issue 18 point 3: without ``tracing`` (and no global provider) nothing is
    traced and messages carry no trace; a bad ``tracing`` is refused."""
    _provider, spans_out = exporter
    with Runtime(backend=backend) as rt:
        assert rt.telemetry is None
        agent = rt.spawn("echo")
        agent.followup("plain")
        assert agent.wait_idle(10)
        events = [r.event for r in rt.sessions.read(agent.session_id)]
    assert spans_out.get_finished_spans() == ()
    assert all(e.source is None for e in events if isinstance(e, MessageEvent))
    for bad in ("yes", 1, object()):
        with pytest.raises(SubagentError) as err:
            Runtime(backend=backend, tracing=bad)
        assert err.value.code == ErrorCode.INVALID_ARGUMENT


_SENDER = textwrap.dedent(
    """
    import json, sys
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from subagents.actors import Runtime

    db, parent_id, child_id = sys.argv[1:4]
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with Runtime(db, tracing=provider) as rt:
        mid = rt.subagents.followup(parent_id, child_id, "from another process")
    (span,) = exporter.get_finished_spans()
    print(json.dumps({"trace": span.context.trace_id, "span": span.context.span_id,
                      "message_id": str(mid), "name": span.name}))
    """
)


def test_the_trace_crosses_processes_in_the_message(
    backend: Backend, tmp_path: Path, exporter: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    """Issue 18 point 3, across processes: another process follows up a child by
    its parent's id; the message, committed with that process's span context in
    its source, runs here -- its turn's delivery is a child of that span, in that
    trace."""
    provider, spans_out = exporter
    db = str(tmp_path / "x.db")
    with Runtime(db, backend=backend, tracing=provider) as rt:
        rt.models.register("tree", lambda options: tree)
        root = rt.spawn("tree", label="root")
        kid, _ = rt.subagents.start_continuable(_spec(root, "first"))
        assert rt.wait_idle(30)
        watch = _TurnWatch(rt.backend.event())
        provider.add_span_processor(watch)
        done = subprocess.run(
            [sys.executable, "-c", _SENDER, db, str(root.session_id), str(kid)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        sent = json.loads(done.stdout)
        assert sent["name"] == "subagents.followup"

        assert watch.wait_for(sent["message_id"], 60), "the message did not run here"
    spans = spans_out.get_finished_spans()
    (turn,) = [
        s for s in spans
        if s.name == "subagents.turn" and _attr(s, "message_id") == sent["message_id"]
    ]  # fmt: skip
    deliver = _parent(turn, _by_id(spans))
    assert deliver is not None and deliver.parent is not None
    assert deliver.parent.span_id == sent["span"]
    assert deliver.parent.is_remote
    assert turn.context.trace_id == sent["trace"]
    assert _attr(turn, "session_id") == str(kid)


def _spec(root: Any, prompt: str) -> Any:
    from subagents.actors import ContinuableStartSpec

    return ContinuableStartSpec(
        parent=root, provider="local", prompt=prompt, label="kid", model="tree"
    )


class _TurnWatch(SpanProcessor):
    """Records the message ids of the turns that ended; ``wait_for`` one of them."""

    def __init__(self, event: Any) -> None:
        self.event = event  # set at each turn's end (the runtime's backend's event)
        self.ran: set[str] = set()

    def on_end(self, span: ReadableSpan) -> None:
        if span.name == "subagents.turn":
            self.ran.add(_attr(span, "message_id"))
            self.event.set()

    def wait_for(self, message_id: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while message_id not in self.ran:
            left = deadline - time.monotonic()
            if left <= 0 or not self.event.wait(left):
                return False
            self.event.clear()
        return True


_WITHOUT_OTEL = textwrap.dedent(
    """
    import sys

    class NoOtel:
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ImportError(f"no module named {name!r} (hidden)")
            return None

    sys.meta_path.insert(0, NoOtel())
    from subagents.actors import Runtime
    from subagents.protocol import SubagentError

    with Runtime(backend=sys.argv[1]) as rt:
        assert rt.telemetry is None
        agent = rt.spawn("echo")
        agent.followup("hello")
        assert agent.wait_idle(10)
    with Runtime(backend=sys.argv[1], tracing=False) as rt:
        assert rt.telemetry is None
    try:
        Runtime(backend=sys.argv[1], tracing=True)
    except SubagentError as exc:
        print(exc.code)
    assert "opentelemetry" not in sys.modules
    """
)


def test_without_the_package_nothing_is_traced(backend: Backend) -> None:
    """Issue 18 point 3: without ``opentelemetry-api`` (hidden from a fresh
    interpreter) the runtime runs untraced, and asking for tracing is
    ``INVALID_ARGUMENT``."""
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_OTEL, backend.name],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == ErrorCode.INVALID_ARGUMENT
