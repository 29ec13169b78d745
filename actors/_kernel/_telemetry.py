"""OpenTelemetry tracing of an agent tree (the ``otel`` extra; nothing without it).

Spans, each with the session, child and message ids as attributes
(``subagents.*``):

* ``subagents.followup`` / ``subagents.start`` / ``subagents.report`` (kind
  PRODUCER): a message's acceptance, in the caller -- a child of whatever span is
  current there (the parent's turn, inside a behaviour). The accepted message
  carries the span's W3C ``traceparent`` in its source
  (:attr:`~subagents.protocol.MessageSource.trace`), into the store with it.
* ``subagents.deliver`` (CONSUMER): the message handed to the turn that runs it,
  a child of the context the message carries -- in whatever process runs it,
  after a restart too.
* ``subagents.turn``: one turn, a child of its message's delivery; current while
  the behaviour runs, so what the behaviour starts or follows up is its child.
* ``subagents.run``: a one-shot run, from its start to its result.
* ``subagents.activation``: a continuable child's residency in this process,
  from its ``subagent/start`` to its ``subagent/end``.

So the span tree follows the agent tree: a child's turns hang below the parent
turn that sent their messages, across processes.

Off unless asked: ``Runtime(tracing=...)`` is ``None`` (trace when a tracer
provider was configured globally -- ``opentelemetry.trace.set_tracer_provider``),
``True`` (the global provider), ``False``, or a ``TracerProvider`` to use.
Without the package installed, ``None`` and ``False`` are off and the rest
``INVALID_ARGUMENT``. Off, the runtime keeps no tracer and pays one ``is None``
check per turn.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from subagents.protocol import ErrorCode, MessageSource, SubagentError

try:  # the optional extra
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
except ImportError:  # pragma: no cover - exercised where the extra is absent
    trace = None  # type: ignore[assignment]

__all__ = ["Telemetry", "stamp", "telemetry_for", "traced"]

R = TypeVar("R")

_SCOPE = "subagents"
_PROPAGATOR = TraceContextTextMapPropagator() if trace is not None else None


def telemetry_for(tracing: Any) -> Telemetry | None:
    """The runtime's :class:`Telemetry` for its ``tracing`` argument, or None (off).

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` -- tracing asked for without the
            ``opentelemetry-api`` package, or not a bool, None or a provider.
    """
    if tracing is None or tracing is False:
        if trace is None or tracing is False:
            return None
        provider = trace.get_tracer_provider()
        if isinstance(provider, (trace.ProxyTracerProvider, trace.NoOpTracerProvider)):
            return None  # nobody configured tracing
        return Telemetry(provider)
    if trace is None:
        raise SubagentError(
            "tracing needs the opentelemetry-api package (pip install 'subagents[otel]')",
            code=ErrorCode.INVALID_ARGUMENT,
        )
    if tracing is True:
        return Telemetry(trace.get_tracer_provider())
    if not callable(getattr(tracing, "get_tracer", None)):
        raise SubagentError(
            "tracing is None, a bool or an OpenTelemetry TracerProvider",
            code=ErrorCode.INVALID_ARGUMENT,
        )
    return Telemetry(tracing)


class Telemetry:
    """The tracer of one runtime and the span shapes it makes (see the module doc)."""

    def __init__(self, provider: Any) -> None:
        self.tracer = provider.get_tracer(_SCOPE)

    @contextlib.contextmanager
    def producing(self, name: str, attributes: Mapping[str, Any]) -> Iterator[Any]:
        """A PRODUCER span, current in this block (an exception fails it)."""
        with self.tracer.start_as_current_span(
            name, kind=trace.SpanKind.PRODUCER, attributes=_attrs(attributes)
        ) as span:
            yield span

    def stamp(self, source: MessageSource) -> MessageSource:
        """``source`` carrying the current span's context (unchanged when no span is
        recording)."""
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier)
        parent = carrier.get("traceparent")
        if parent is None or parent == source.trace:
            return source
        return dataclasses.replace(source, trace=parent)

    def start(self, name: str, attributes: Mapping[str, Any]) -> Any:
        """A span below the current one, not made current (ended by :meth:`end`)."""
        return self.tracer.start_span(name, attributes=_attrs(attributes))

    def turn(self, source: MessageSource | None, attributes: Mapping[str, Any]) -> Any:
        """The ``deliver`` span of a turn's message (below the context it carries)
        and the ``turn`` span below it, made current: returns what :meth:`end_turn`
        takes."""
        parent = None
        if source is not None and source.trace is not None:
            parent = _PROPAGATOR.extract({"traceparent": source.trace})
        attrs = _attrs(attributes)
        deliver = self.tracer.start_span(
            "subagents.deliver", context=parent, kind=trace.SpanKind.CONSUMER, attributes=attrs
        )
        deliver.end()
        span = self.tracer.start_span(
            "subagents.turn", context=trace.set_span_in_context(deliver), attributes=attrs
        )
        token = otel_context.attach(trace.set_span_in_context(span))
        return span, token

    @staticmethod
    def leave_turn(started: Any) -> None:
        """The behaviour returned: the turn's span is no longer current."""
        otel_context.detach(started[1])

    @contextlib.contextmanager
    def current(self, span: Any) -> Iterator[Any]:
        """``span`` current in this block (an exception records on it; not ended)."""
        with trace.use_span(span, end_on_exit=False):
            yield span

    @staticmethod
    def end(span: Any, stop_reason: str | None = None, error: str | None = None) -> None:
        """End ``span``, recording how its work ended."""
        if stop_reason is not None:
            span.set_attribute("subagents.stop_reason", stop_reason)
        if error is not None:
            span.set_status(trace.Status(trace.StatusCode.ERROR, error))
        span.end()


def traced(
    telemetry: Telemetry | None, name: str, attributes: Mapping[str, Any], call: Callable[[], R]
) -> R:
    """``call()`` inside a PRODUCER span ``name`` (just ``call()`` untraced); the span
    records the message id of what it returns (a ``MessageId``, or anything with a
    ``message_id``, and a ``child_id`` when it has one)."""
    if telemetry is None:
        return call()
    with telemetry.producing(name, attributes) as span:
        result = call()
        mid = getattr(result, "message_id", result)
        span.set_attribute("subagents.message_id", str(mid))
        child = getattr(result, "child_id", None)
        if child is not None:
            span.set_attribute("subagents.child_id", str(child))
        return result


def stamp(telemetry: Telemetry | None, source: MessageSource) -> MessageSource:
    """``source`` carrying the current span's context when tracing (see :meth:`Telemetry.stamp`)."""
    return source if telemetry is None else telemetry.stamp(source)


def _attrs(attributes: Mapping[str, Any]) -> dict[str, Any]:
    # OpenTelemetry attributes are str, bool, int, float: ids go as their text.
    return {
        f"subagents.{k}": v if isinstance(v, (bool, int, float)) else str(v)
        for k, v in attributes.items()
        if v is not None
    }
