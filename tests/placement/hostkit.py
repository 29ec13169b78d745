"""Models for placed children, registered in every host (and in the parent).

Imported by name in the Ray host processes (the tests put this directory on
their ``PYTHONPATH``), so it holds only module-level functions. Cross-process
interleavings are forced by files named in the message: a ``hold`` turn writes
``PATH.started`` (its pid, whole) and waits for ``PATH.go`` (or its cancellation).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


def note(turn: Any) -> Any:
    """Answers where it ran: ``content@pid`` (``!`` marks a redelivered turn)."""
    mark = "!" if turn.redelivered else ""
    return f"{turn.content}@{os.getpid()}{mark}"


def hold(turn: Any) -> Any:
    """Content ``hold:PATH``: waits for ``PATH.go``; other content: as ``note``."""
    content = str(turn.content)
    if not content.startswith("hold:"):
        return note(turn)
    path = Path(content[5:])
    # Written whole, then renamed: a test that sees ``PATH.started`` reads the pid
    # (write_text creates the file empty first; a loaded box shows it so).
    partial = Path(f"{path}.started.{os.getpid()}")
    partial.write_text(str(os.getpid()))
    partial.replace(f"{path}.started")
    go = Path(f"{path}.go")
    while not go.exists():
        if turn.signal.wait(0.01):
            return "cancelled"
    return f"released@{os.getpid()}" + ("!" if turn.redelivered else "")


def reporter(turn: Any) -> Any:
    """Reports its content to its parent, waking it."""
    turn.subagents.report(f"report:{turn.content}", delivery="waking")
    return note(turn)


def delegator(turn: Any) -> Any:
    """First turn: a one-shot child and a continuable grandchild (``reporter``) of
    its own; later turns follow the grandchild up."""
    subs = turn.subagents
    if turn.index == 0:
        done = subs.delegate("local", "one-shot work", model="note", label="helper")
        handle = subs.start_continuable(
            "local", "grandchild work", label="grandchild", model="reporter"
        )
        return f"{done.output}|{handle.child_id}"
    return note(turn)


def spawner(turn: Any) -> Any:
    """First turn: a continuable grandchild of its own (``hold``, content the
    turn's own); returns the grandchild's id. Later turns: as ``note``."""
    if turn.index == 0:
        handle = turn.subagents.start_continuable(
            "local", f"hold:{turn.content}", label="grandchild", model="hold"
        )
        return str(handle.child_id)
    return note(turn)


def parent_model(turn: Any) -> Any:
    return f"parent saw {turn.content}"


MODELS = {
    "note": note,
    "hold": hold,
    "reporter": reporter,
    "spawner": spawner,
    "delegator": delegator,
    "parent": parent_model,
}


def setup(runtime: Any) -> None:
    """Register :data:`MODELS` in ``runtime`` (a host's, or the parent's)."""
    for name, fn in MODELS.items():
        runtime.models.register(name, _factory(fn), replace=True)


class _SpanFile:
    """A span exporter appending ``name trace_id parent_span_id`` lines to a file
    (O_APPEND: the lines of concurrent writers never mix)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        lines = "".join(
            f"{s.name} {s.context.trace_id:032x} {s.parent.span_id if s.parent else 0:016x}\n"
            for s in spans
        )
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def traced_setup(runtime: Any) -> None:
    """:func:`setup`, and a global tracer provider writing each finished span to
    the file ``SUBAGENTS_TEST_SPANS`` names (a host's spans, for the test to read)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    setup(runtime)
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(_SpanFile(os.environ["SUBAGENTS_TEST_SPANS"])))
    trace.set_tracer_provider(provider)


def failing_setup(runtime: Any) -> None:
    """A ``setup`` that cannot register what it needs: the host does not start."""
    raise RuntimeError("no model registry here")


def _factory(fn: Any) -> Any:
    def make(_options: Any) -> Any:
        return fn

    return make
