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

Tracing never changes what happens: a span processor (or anything the provider
runs) that raises loses its span, never the work. The first such failure is
logged with its traceback to the ``subagents`` logger, later ones at DEBUG.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
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

logger = logging.getLogger("subagents")

#: How many times tracing failed in this process (only the first is logged loudly).
_failures = 0


def _failed() -> None:
    """Log the exception being handled: a span lost, the work unharmed."""
    global _failures
    _failures += 1
    if _failures == 1:
        logger.exception(
            "tracing failed: the span is dropped, the work goes on"
            " (later tracing failures are logged at DEBUG)"
        )
    else:
        logger.debug("tracing failed: the span is dropped", exc_info=True)


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
        span: Any = trace.INVALID_SPAN
        token = None
        try:
            span = self.tracer.start_span(
                name, kind=trace.SpanKind.PRODUCER, attributes=_attrs(attributes)
            )
            token = otel_context.attach(trace.set_span_in_context(span))
        except Exception:
            _failed()
        try:
            yield span
        except BaseException as exc:
            try:
                span.record_exception(exc)
                text = f"{type(exc).__name__}: {exc}"
                span.set_status(trace.Status(trace.StatusCode.ERROR, text))
            except Exception:
                _failed()
            raise
        finally:
            try:
                if token is not None:
                    otel_context.detach(token)
                span.end()
            except Exception:
                _failed()

    def stamp(self, source: MessageSource) -> MessageSource:
        """``source`` carrying the current span's context (unchanged when no span is
        recording)."""
        carrier: dict[str, str] = {}
        try:
            _PROPAGATOR.inject(carrier)
        except Exception:
            _failed()
        parent = carrier.get("traceparent")
        if parent is None or parent == source.trace:
            return source
        return dataclasses.replace(source, trace=parent)

    @contextlib.contextmanager
    def continuing(self, source: MessageSource) -> Iterator[None]:
        """The context ``source`` carries current in this block: what is accepted here
        on behalf of the work that made ``source`` (a background run's result,
        delivered from the run's thread) continues that trace."""
        token = None
        if source.trace is not None:
            try:
                parent = _PROPAGATOR.extract({"traceparent": source.trace})
                token = otel_context.attach(parent)
            except Exception:
                _failed()
        try:
            yield
        finally:
            _detach(token)

    def start(self, name: str, attributes: Mapping[str, Any]) -> Any:
        """A span below the current one, not made current (ended by :meth:`end`)."""
        try:
            return self.tracer.start_span(name, attributes=_attrs(attributes))
        except Exception:
            _failed()
            return trace.INVALID_SPAN

    def turn(self, source: MessageSource | None, attributes: Mapping[str, Any]) -> Any:
        """The ``deliver`` span of a turn's message (below the context it carries)
        and the ``turn`` span below it, made current: returns what :meth:`end_turn`
        takes."""
        try:
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
        except Exception:
            _failed()
            return trace.INVALID_SPAN, None
        return span, token

    @staticmethod
    def leave_turn(started: Any) -> None:
        """The behaviour returned: the turn's span is no longer current."""
        _detach(started[1])

    @contextlib.contextmanager
    def current(self, span: Any) -> Iterator[Any]:
        """``span`` current in this block (an exception records on it; not ended)."""
        token = None
        try:
            token = otel_context.attach(trace.set_span_in_context(span))
        except Exception:
            _failed()
        try:
            yield span
        except BaseException as exc:
            try:
                span.record_exception(exc)
            except Exception:
                _failed()
            raise
        finally:
            _detach(token)

    @staticmethod
    def end(span: Any, stop_reason: str | None = None, error: str | None = None) -> None:
        """End ``span``, recording how its work ended: an error status when it
        ``failed`` (or, with no stop reason, ended on ``error``); a cancelled one
        keeps none, whatever text its end records."""
        try:
            if stop_reason is not None:
                span.set_attribute("subagents.stop_reason", stop_reason)
            if stop_reason == "failed" or (stop_reason is None and error is not None):
                span.set_status(trace.Status(trace.StatusCode.ERROR, error or "failed"))
            span.end()
        except Exception:
            _failed()


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
        try:  # the call is done: nothing of the span may undo it
            mid = getattr(result, "message_id", result)
            span.set_attribute("subagents.message_id", str(mid))
            child = getattr(result, "child_id", None)
            if child is not None:
                span.set_attribute("subagents.child_id", str(child))
        except Exception:
            _failed()
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


def _detach(token: Any) -> None:
    """Make the context before an ``attach`` current again (``token``: its answer;
    None: nothing was attached). A failure is counted, never raised."""
    if token is not None:
        try:
            otel_context.detach(token)
        except Exception:
            _failed()
