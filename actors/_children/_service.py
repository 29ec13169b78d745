"""``runtime.subagents``: the provider registry, one-shot delegation, lifecycle events.

Theory of operation
-------------------
Callers delegate only through this service; the named provider decides where the
child runs. ``start(name, request)`` validates the request (types, required
signal, requested capabilities) and snapshots the one-shot descriptor *before*
any provider work, then hands both to the provider, which publishes the child or
raises after rolling back. The service mints the run id, attaches its result
observer, and emits ``subagent/start`` then (when the result settles)
``subagent/end`` to the listeners scoped to the delegating parent and to the
service-wide listeners.

Listener containment: every listener runs independently; a raise, or a returned
future that later fails, is logged and changes nothing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import jsonschema
from subagents.actors._agents._agent import Agent
from subagents.actors._catalog._listing import Catalog, Listing
from subagents.actors._catalog._projections import subagent_timing_unit, subagent_unit
from subagents.actors._kernel._signal import AbortSignal
from subagents.protocol import (
    ErrorCode,
    MessageId,
    MessageSource,
    OneShotDescriptor,
    RunId,
    SessionId,
    SubagentError,
    new_run_id,
    packb,
    snapshot_subagent_descriptor,
)

from ._types import (
    CAPABILITIES,
    AncestorAuthority,
    ContinuableHandle,
    ContinuableStartSpec,
    SubagentEvent,
    SubagentProvider,
    SubagentRun,
    SubagentStartRequest,
    UserAuthority,
)

if TYPE_CHECKING:
    from subagents.actors._runtime import Runtime

__all__ = ["ProviderRegistration", "SubagentService", "Subscription"]

logger = logging.getLogger("subagents")

Listener = Callable[[SubagentEvent], object]


def _bad(message: str) -> SubagentError:
    return SubagentError(message, code=ErrorCode.INVALID_ARGUMENT)


class ProviderRegistration:
    """Returned by ``register_provider``; ``dispose()`` removes the provider."""

    def __init__(self, service: SubagentService, provider: SubagentProvider) -> None:
        self._service = service
        self.provider = provider
        self._disposed = False

    def dispose(self) -> None:
        """Remove the provider (idempotent). Runs already returned stay alive."""
        if not self._disposed:
            self._disposed = True
            self._service._remove_provider(self.provider)


class Subscription:
    """Returned by ``subscribe``; ``dispose()`` stops delivery."""

    def __init__(self, service: SubagentService, entry: tuple[Listener, Any]) -> None:
        self._service = service
        self._entry = entry

    def dispose(self) -> None:
        self._service._unsubscribe(self._entry)


class _RunEvents:
    """Orders ``subagent/start`` before ``subagent/end`` whatever the settle timing."""

    __slots__ = ("ended", "lock", "start", "started")

    def __init__(self, start: SubagentEvent) -> None:
        self.lock = threading.Lock()
        self.start = start
        self.started = False
        self.ended: SubagentEvent | None = None


class SubagentService:
    """The seed's ``ctx.subagents`` (``runtime.subagents``)."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = runtime
        self._lock = threading.Lock()
        self._providers: dict[str, SubagentProvider] = {}
        self._listeners: list[tuple[Listener, Any]] = []
        projections = runtime.session_projections
        if projections is not None:
            for unit in (subagent_unit, subagent_timing_unit):
                if unit.name not in projections:
                    projections.register(unit)

    # -- the durable catalog -----------------------------------------------------------

    def _catalog(self) -> Catalog:
        rt = self._runtime
        return Catalog(
            rt.sessions,
            rt.sessions.persistence if rt.sessions is not None else None,
            rt.session_projections,
            rt.backend,
            live_store_mounted=rt.sessions is not None,
        )

    def list_children(
        self, parent_session_id: SessionId | str, signal: AbortSignal | None = None
    ) -> Listing:
        """Direct session-backed subagents of a session, without loading them.

        Rows carry ``id``, ``mode``, ``label``, ``activity`` (``running`` /
        ``inactive``), ``has_children`` and ``created_at``, ordered by creation then
        id; ``diagnostics`` name children that are ``corrupt`` or ``unavailable``.

        Raises:
            SubagentError: ``CANCELLED``, ``SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE``,
                ``SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE``, ``INVALID_ARGUMENT``.
        """
        self._runtime._check_thread()
        return self._catalog().list_children(parent_session_id, signal)

    def list_descendants(
        self, root_session_id: SessionId | str, signal: AbortSignal | None = None
    ) -> Listing:
        """The root's complete session tree in stable pre-order (adds ``parent_id``, ``depth``).

        Raises:
            SubagentError: as :meth:`list_children`.
        """
        self._runtime._check_thread()
        return self._catalog().list_descendants(root_session_id, signal)

    # -- provider registry ---------------------------------------------------------

    def register_provider(self, provider: SubagentProvider) -> ProviderRegistration:
        """Register ``provider`` under ``provider.name``.

        Raises:
            SubagentError: ``PROVIDER_EXISTS`` for a name already registered
                (nothing changes), ``INVALID_ARGUMENT`` for a malformed provider.
        """
        name = getattr(provider, "name", None)
        if type(name) is not str or not name:
            raise _bad("a provider needs a non-empty str name")
        if not callable(getattr(provider, "start", None)):
            raise _bad(f"provider {name!r} has no start(request, descriptor)")
        caps = getattr(provider, "capabilities", None)
        if not isinstance(caps, frozenset) or not caps <= CAPABILITIES:
            raise _bad(
                f"provider {name!r} capabilities must be a frozenset of {sorted(CAPABILITIES)}"
            )
        with self._lock:
            if name in self._providers:
                raise SubagentError(
                    f"a provider named {name!r} is already registered",
                    code=ErrorCode.PROVIDER_EXISTS,
                )
            self._providers[name] = provider
        self._emit(SubagentEvent(type="subagent/provider-added", provider=name), None)
        return ProviderRegistration(self, provider)

    def _remove_provider(self, provider: SubagentProvider) -> None:
        with self._lock:
            if self._providers.get(provider.name) is not provider:
                return
            del self._providers[provider.name]
        self._emit(SubagentEvent(type="subagent/provider-removed", provider=provider.name), None)

    def get_provider(self, name: str) -> SubagentProvider | None:
        """The registered provider, or None."""
        return self._providers.get(name) if type(name) is str else None

    def list(self) -> list[str]:
        """Registered provider names in insertion order."""
        with self._lock:
            return list(self._providers)

    # -- lifecycle events ----------------------------------------------------------

    def subscribe(
        self, listener: Listener, *, scope: Agent | SessionId | str | None = None
    ) -> Subscription:
        """Observe lifecycle events.

        With ``scope`` (a parent agent or its session id) the listener receives the
        run events of children delegated by that parent; without, every run event
        and the provider events.
        """
        if not callable(listener):
            raise _bad("a listener is callable")
        key: Any = None
        if isinstance(scope, Agent):
            key = scope.session_id
        elif scope is not None:
            key = SessionId(scope)
        entry = (listener, key)
        with self._lock:
            self._listeners.append(entry)
        return Subscription(self, entry)

    def _unsubscribe(self, entry: tuple[Listener, Any]) -> None:
        with self._lock:
            if entry in self._listeners:
                self._listeners.remove(entry)

    def _emit(self, event: SubagentEvent, scope: SessionId | None) -> None:
        with self._lock:
            targets = [
                fn
                for fn, key in self._listeners
                if key is None or (scope is not None and key == scope)
            ]
        for fn in targets:
            try:
                returned = fn(event)
            except Exception:
                logger.exception("subagent listener %r raised on %s", fn, event.type)
                continue
            _contain(returned, fn, event)

    def _open_run(
        self, provider_name: str, run: SubagentRun, parent: SessionId, mode: str
    ) -> RunId:
        run_id = new_run_id()
        start = SubagentEvent(
            type="subagent/start",
            provider=provider_name,
            run_id=run_id,
            local=run.local_agent is not None,
            parent_session=parent,
            child_id=str(run.id),
            mode=mode,
        )
        record = _RunEvents(start)

        def on_settled(future: Any) -> None:
            exc = future.exception(0)
            stop = "failed" if exc is not None else future.get(0).stop_reason
            end = SubagentEvent(
                type="subagent/end",
                provider=provider_name,
                run_id=run_id,
                local=start.local,
                parent_session=parent,
                child_id=start.child_id,
                mode=mode,
                stop_reason=stop,
            )
            with record.lock:
                if not record.started:
                    record.ended = end  # emitted right after start
                    return
            self._emit(end, parent)

        run.result.add_done_callback(on_settled)  # attached before start is emitted
        self._emit(start, parent)
        with record.lock:
            record.started = True
            pending, record.ended = record.ended, None
        if pending is not None:
            self._emit(pending, parent)
        return run_id

    # -- continuable children (delegated to the continuation manager) ------------------

    def start_continuable(self, spec: ContinuableStartSpec) -> ContinuableHandle:
        """Establish one durable continuable child and deliver its initial prompt.

        Returns ``(child_id, message_id)`` once the child's inbox accepted the
        prompt, without waiting for the turn. Any earlier failure raises and rolls
        the child back entirely (no session, agent, Activation, ownership, setup
        contribution or event remains). The caller's signal owns admission only.

        Raises:
            SubagentError: ``PERSISTENCE_UNAVAILABLE``, ``PROVIDER_NOT_FOUND``,
                ``CONTINUABLE_UNSUPPORTED``, ``DESCRIPTOR_INVALID`` (no label),
                ``UNAUTHORIZED`` (parent not live), ``ADMISSION_CLOSED`` (drained),
                ``CANCELLED``, ``MODEL_NOT_FOUND``, ``DEPTH_EXCEEDED``.
        """
        self._runtime._check_thread()
        return self._runtime.continuation.start_continuable(spec)

    def followup(
        self,
        parent: Agent,
        child_id: SessionId | str,
        content: Any,
        *,
        source: MessageSource | None = None,
        signal: AbortSignal | None = None,
    ) -> MessageId:
        """Deliver one message from the exact live direct parent as the child's next turn.

        Running children enqueue it, waiting ones wake, absent ones cold-resume
        from their persisted session (no provider involved). ``source`` is recorded
        and grants nothing.

        Raises:
            SubagentError: ``UNAUTHORIZED``, ``SESSION_NOT_FOUND``,
                ``PERSISTENCE_UNAVAILABLE``, ``ADMISSION_CLOSED``, ``CANCELLED``,
                ``DESCRIPTOR_CORRUPT`` / ``DESCRIPTOR_UNSUPPORTED``.
        """
        self._runtime._check_thread()
        return self._runtime.continuation.followup(
            parent, child_id, content, source=source, signal=signal
        )

    def interrupt(
        self, target_session_id: SessionId | str, authority: UserAuthority | AncestorAuthority
    ) -> None:
        """Cancel a live continuable child's current turn, keeping its inbox.

        Returns without waiting for the child to observe it; an absent target is
        an accepted no-op.

        Raises:
            SubagentError: ``UNAUTHORIZED`` for a wrong parent address or a stale,
                self-targeting or non-ancestor agent.
        """
        self._runtime.continuation.interrupt(target_session_id, authority)

    def report_from(
        self,
        child: Agent,
        content: Any,
        *,
        delivery: str = "quiet",
        signal: AbortSignal | None = None,
    ) -> MessageId:
        """Deliver a message from the exact live continuable child to its live direct parent.

        ``quiet`` injects context into the parent's next turn; ``waking`` submits
        one later parent turn.

        Raises:
            SubagentError: ``UNAUTHORIZED``, ``INVALID_ARGUMENT``, ``CANCELLED``.
        """
        return self._runtime.continuation.report_from(
            child, content, delivery=delivery, signal=signal
        )

    def register_continuable_setup(self, contribution: Any) -> Any:
        """Install ``contribution(scope)`` into every newly materialized continuable child.

        ``contribution`` may return a release callable. Disposing the returned
        registration revokes it from every resident child before returning.
        """
        return self._runtime.continuation.register_continuable_setup(contribution)

    def drain_continuable_descendants(self, parents: Any, *, timeout: float | None = 60.0) -> None:
        """Close admission below exact live host-owned parents and release their forests.

        Cancels top-down, awaits admitted materializations, releases child-first,
        and returns once every selected forest is released. The cutoff lasts until
        each parent leaves the registry.
        """
        self._runtime._check_thread()
        self._runtime.continuation.drain(parents, timeout)

    # -- one-shot ------------------------------------------------------------------

    def start(self, name: str, request: SubagentStartRequest) -> SubagentRun:
        """Start a one-shot child through provider ``name``; see the class docstring.

        Raises:
            SubagentError: ``INVALID_ARGUMENT`` (bad request, missing signal),
                ``PROVIDER_NOT_FOUND``, ``CAPABILITY_UNSUPPORTED``,
                ``DESCRIPTOR_INVALID``, ``AGENT_DISPOSED`` (parent not live),
                ``CANCELLED`` (signal aborted before publication), and whatever the
                provider raises after its rollback (``MODEL_NOT_FOUND``,
                ``DEPTH_EXCEEDED``, ...).
        """
        if type(name) is not str:
            raise _bad("a provider name is a str")
        self._runtime._check_thread()
        self._validate_request(request)
        provider = self._providers.get(name)
        if provider is None:
            raise SubagentError(f"no provider named {name!r}", code=ErrorCode.PROVIDER_NOT_FOUND)
        missing = self._requested_capabilities(request) - provider.capabilities
        if missing:
            raise SubagentError(
                f"provider {name!r} does not support {sorted(missing)}",
                code=ErrorCode.CAPABILITY_UNSUPPORTED,
                hint=sorted(missing),
            )
        descriptor = snapshot_subagent_descriptor(
            OneShotDescriptor(provider=name, label=request.label)
        )
        assert request.signal is not None
        request.signal.raise_if_aborted()
        run = provider.start(request, descriptor)  # type: ignore[arg-type]
        if not isinstance(run, SubagentRun):
            raise SubagentError(
                f"provider {name!r} returned {type(run).__name__}, not a SubagentRun"
            )
        self._open_run(name, run, request.parent.session_id, "one-shot")
        return run

    def _validate_request(self, request: Any) -> None:
        if not isinstance(request, SubagentStartRequest):
            raise _bad(f"start() takes a SubagentStartRequest, got {type(request).__name__}")
        if not isinstance(request.signal, AbortSignal):
            raise _bad("request.signal is required (an AbortSignal)")
        if not isinstance(request.parent, Agent):
            raise _bad("request.parent must be an Agent")
        if not self._runtime.agents.is_live(request.parent):
            raise SubagentError("request.parent is not a live agent", code=ErrorCode.AGENT_DISPOSED)
        for field_name in ("label", "model", "persona"):
            value = getattr(request, field_name)
            if value is not None and type(value) is not str:
                raise _bad(f"request.{field_name} must be a str or None")
        if request.max_depth is not None and (
            type(request.max_depth) is not int or request.max_depth < 1
        ):
            raise _bad("request.max_depth must be an int >= 1")
        check_tool_filter(request.tool_filter)
        if request.output_schema is not None:
            check_output_schema(request.output_schema)
        packb(request.prompt)

    @staticmethod
    def _requested_capabilities(request: SubagentStartRequest) -> frozenset[str]:
        wanted = set()
        if request.output_schema is not None:
            wanted.add("output_schema")
        if request.max_depth is not None:
            wanted.add("depth_limit")
        if request.tool_filter is not None:
            wanted.add("tool_filter")
        if request.persona is not None:
            wanted.add("persona")
        return frozenset(wanted)


def check_tool_filter(tool_filter: Any) -> None:
    if tool_filter is None:
        return
    if isinstance(tool_filter, (str, bytes)) or not isinstance(
        tool_filter, (Sequence, frozenset, set)
    ):
        raise _bad("tool_filter must be a sequence of tool names")
    if not all(type(t) is str and t for t in tool_filter):
        raise _bad("tool_filter must hold non-empty str names")


def check_output_schema(schema: Any) -> None:
    if not isinstance(schema, Mapping):
        raise _bad("output_schema must be a JSON Schema mapping")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise _bad(f"output_schema is not a valid JSON Schema: {exc.message}") from exc


def validate_output(schema: Mapping[str, Any], output: Any) -> tuple[Any, str | None]:
    """``(structured, None)`` when ``output`` satisfies ``schema``, else ``(None, error)``."""
    validator = jsonschema.validators.validator_for(schema)(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(output))
    if error is None:
        return output, None
    return None, f"output does not match the output schema: {error.message}"[:500]


def _contain(returned: Any, fn: Any, event: SubagentEvent) -> None:
    """Log a listener's returned future when it later fails (never re-raise)."""
    if returned is None:
        return

    def log_failure(exc: BaseException | None) -> None:
        if exc is not None:
            logger.error("subagent listener %r failed later on %s: %r", fn, event.type, exc)

    if hasattr(returned, "add_done_callback"):

        def done(fut: Any) -> None:
            try:
                log_failure(fut.exception())
            except Exception as exc:
                log_failure(exc)

        try:
            returned.add_done_callback(done)
        except Exception:
            logger.exception("could not observe the future returned by listener %r", fn)
    elif hasattr(returned, "rawlink"):  # gevent Greenlet / AsyncResult
        returned.rawlink(lambda g: log_failure(g.exception))
    elif hasattr(returned, "close") and hasattr(returned, "send"):  # a coroutine nobody will run
        returned.close()
        logger.error("subagent listener %r returned a coroutine; listeners must be synchronous", fn)
