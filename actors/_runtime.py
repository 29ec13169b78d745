"""The ``Runtime``: the composition root of one agent tree.

``Runtime(store=None | path | SessionStore, backend="threading" | "gevent")`` is
a context manager. It builds every part once and wires them -- the backend,
the store and the session service, behaviours, tools, the live agents, the
projection registry, the subagent service with its continuation manager -- and
is the only module that knows them all: the parts know each other only through
narrow interfaces (an agent sees its :class:`AgentHost`; the service and the
continuation manager see a :class:`ChildContext`, which this runtime is).

The mount points ``agents``, ``sessions`` and ``session_projections`` are read by
the operations that need them when they run, as the seed's ``ctx`` services
are: an unmounted one (None) makes those operations fail loud.

Leaving it disposes every live agent (deepest first, so children go before
their parents), drains the session writer, and closes the store; nothing is left
running on either backend. In the child of a fork it is the parent's: every call
refuses with ``WRONG_PROCESS``, and ``close()`` does nothing (``_kernel/_fork.py``).
"""

from __future__ import annotations

import datetime as _dt
import logging
import threading
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any

from subagents.protocol import ErrorCode, SessionId, SubagentError
from subagents.store import SessionStore, defer_interrupt, open_store, set_interrupt_delivery

from ._agents import (
    Agent,
    AgentHost,
    AgentOptions,
    AgentRegistry,
    Leases,
    LiveSession,
    Mailman,
    ModelRegistry,
    RuntimeCounters,
    RuntimeStatistics,
    SessionService,
    ToolRegistry,
    Turn,
    close_agents,
    runtime_statistics,
    spawn_agent,
)
from ._catalog import ProjectionRegistry, retain_identity, subagent_timing_unit, subagent_unit
from ._children import (
    BoundSubagents,
    ContinuationManager,
    EventBus,
    ForkProvider,
    LocalProvider,
    ProviderRegistration,
    ProviderRegistry,
    SubagentService,
    wake_orphan,
)
from ._kernel import (
    GEVENT,
    Backend,
    Telemetry,
    check_born,
    check_runtime_arguments,
    check_timeout,
    checked_clock,
    close_at_exit,
    closed,
    deliver_interrupt,
    fork_generation,
    get_backend,
    install_sigint,
    native_get_ident,
    stamping_clock,
    telemetry_for,
    threading_is_patched,
    utcnow,
)

__all__ = ["Runtime"]

logger = logging.getLogger("subagents")


class Runtime:
    """One actor runtime: everything an agent tree needs, closed as a unit.

    Args:
        store: ``None`` keeps sessions in memory only (no cold resume, live-only
            listing); a path opens the embedded SQLite store; a
            :class:`~subagents.store.SessionStore` is used as given (and closed
            with the runtime).
        backend: ``"threading"`` or ``"gevent"`` (or a Backend).
        clock: returns an aware UTC ``datetime`` (tests inject one), checked per call.
        default_providers: register the ``local`` and ``fork`` providers.
        projections: mount ``session_projections`` (listing needs it).
        keep_warm: seconds an idle continuable child stays resident before it
            settles (0, the default, settles at once as the specification says;
            ``float("inf")`` keeps children resident until drained or closed). A
            warm child takes follow-ups without a cold resume.
        max_delegation_depth: no agent of this runtime may have a deeper child
            (``DEPTH_EXCEEDED``); a guard against runaway recursive delegation.
            ``None`` lifts it; a request's ``max_depth`` can only tighten it.
        durability: on a durable store, ``"strict"`` (the default) commits every
            accepted message before the call that accepted it returns, and
            replays what a crash left; ``"relaxed"`` accepts in memory and writes
            behind, as fast as a memory store (see ``docs/durability.md``).
        lease_ttl: seconds a session's lease outlives this process's last renewal
            (on a durable store, every live session is leased; another process
            takes a session over only once its lease expired, or at once when its
            holder on this host is gone).
        max_inbox: the inbox bound of the continuable children this runtime
            starts (recorded in each child's session; a start's own ``max_inbox``
            wins): a follow-up to a child with that many messages accepted and
            not done raises ``INBOX_FULL`` (see ``docs/backpressure.md``).
            ``None``, the default: unbounded.
        tracing: OpenTelemetry spans of turns, runs, activations, acceptances and
            deliveries (the ``otel`` extra; see ``docs/observability.md``):
            ``None`` traces when a tracer provider is configured globally,
            ``True``/``False`` force it, or pass a ``TracerProvider``.
        adopt: on a durable store, this runtime's sweep activates sessions that
            nobody holds and work waits for (the default); ``False`` runs only
            what it is asked to (a placement host: the parent's runtime owns the tree).
        adopted_grace: seconds a top-level agent the sweep adopted stays resident
            once quiet (idle, no resident child, no background run) before it is
            let go -- disposed, its lease released -- so that the session's next
            activation may be in any process. A message during the grace keeps
            it; ``float("inf")`` keeps adoptions for the runtime's life. Agents
            this runtime's user spawned or resumed are never let go this way.

    Attributes:
        agents: the live top-level and child agents (:class:`AgentRegistry`):
            ``get``, ``list``, ``resume``, ``roots``, ``send``.
        subagents: the subagent service (:class:`SubagentService`): providers,
            one-shot and continuable children, listings.
        sessions: live sessions and persistence (:class:`SessionService`):
            ``read``, ``turn_ends``, ``header``, ``flush``, ``statistics``.
        models: behaviours by model name (:class:`ModelRegistry`).
        tools: tools agents may call (``ToolRegistry``).
        store: the :class:`~subagents.store.SessionStore`, or ``None``.
        backend: the actor runtime (:class:`Backend`); ``clock``: the clock.
        session_projections: the listing projections, or ``None``.
        mail: the pickup of messages other processes accept (durable stores).
    """

    def __init__(
        self,
        store: SessionStore | str | Any = None,
        *,
        backend: str | Backend = "threading",
        clock: Callable[[], _dt.datetime] | None = None,
        default_providers: bool = True,
        projections: bool = True,
        keep_warm: float = 0.0,
        max_delegation_depth: int | None = 32,
        durability: str = "strict",
        lease_ttl: float = 30.0,
        max_inbox: int | None = None,
        tracing: Any = None,
        adopt: bool = True,
        adopted_grace: float = 30.0,
    ) -> None:
        self.backend = get_backend(backend)
        check_runtime_arguments(
            projections=projections,
            default_providers=default_providers,
            durability=durability,
            lease_ttl=lease_ttl,
            max_delegation_depth=max_delegation_depth,
            clock=clock,
            max_inbox=max_inbox,
            adopt=adopt,
            keep_warm=keep_warm,
            adopted_grace=adopted_grace,
        )
        self.max_delegation_depth = max_delegation_depth
        self.max_inbox = max_inbox
        self._adopt = adopt
        self.telemetry: Telemetry | None = telemetry_for(tracing)
        # A gevent runtime's actors are greenlets of this thread's hub: blocking calls
        # from another OS thread would wait on a hub that cannot wake them.
        self._home_thread: int | None = (
            native_get_ident() if self.backend is GEVENT and not threading_is_patched() else None
        )
        self.clock: Callable[[], _dt.datetime] = utcnow if clock is None else checked_clock(clock)
        self.store: SessionStore | None = self.backend.run_blocking(open_store, store)  # off hub
        durable = self.store is not None and self.store.durable
        leases = (
            Leases(self.store, self.backend, ttl=float(lease_ttl), lost=self._lease_lost)
            if self.store is not None and durable
            else None
        )
        self.sessions = SessionService(
            self.store,
            self.backend,
            leases=leases,
            lost=self._lease_lost,
            strict=durable and durability == "strict",
        )
        self.models = ModelRegistry()
        self.tools = ToolRegistry()
        self.session_projections: ProjectionRegistry | None = None
        if projections:
            self.session_projections = ProjectionRegistry()
            for unit in (subagent_unit, subagent_timing_unit):
                self.session_projections.register(unit)
        self._counters = RuntimeCounters()
        self.agents = AgentRegistry(
            AgentHost(
                backend=self.backend,
                sessions=self.sessions,
                tools=self.tools,
                clock=self.clock if clock is None else stamping_clock(self.clock),
                check_thread=self._check_thread,
                leaving=self._leaving,
                bind=self._bind,
                counters=self._counters,
                telemetry=self.telemetry,
            ),
            self.models,
            adopted_grace,
        )
        events = EventBus()
        providers = ProviderRegistry(events)
        self.continuation = ContinuationManager(
            self, self.backend, providers=providers, events=events, keep_warm=keep_warm
        )
        self.agents.adopted.children = self.continuation.has_children
        self.subagents = SubagentService(
            ctx=self,
            providers=providers,
            events=events,
            continuation=self.continuation,
            check_thread=self._check_thread,
        )
        self._closed = False
        self._close_lock = threading.Lock()
        self._born = fork_generation()  # in a later one, this is the parent's (_kernel/_fork)
        # A forgotten close() loses nothing; Ctrl-C never splits a store write.
        close_at_exit(self)
        install_sigint(defer_interrupt, self, self.backend is GEVENT or threading_is_patched())
        set_interrupt_delivery(deliver_interrupt)
        self.mail: Mailman | None = None  # the pickup of others' messages (a durable store)
        self._unwakeable: set[SessionId] = set()
        self.default_providers: list[ProviderRegistration] = []
        if default_providers:
            self.default_providers.append(self.subagents.register_provider(LocalProvider(self)))
            self.default_providers.append(self.subagents.register_provider(ForkProvider(self)))
        if leases is not None:
            self.mail = Mailman.started(
                self.sessions, self.backend, leases, self.agents.get, self._orphan,
                self.continuation.interrupt_asked,
            )  # fmt: skip
            self.models.on_added = providers.on_added = self._registered

    # -- what agents see of the runtime (their AgentHost) ------------------------------

    def _lease_lost(self, session_id: SessionId) -> None:
        """Another process took the session over, or its write failed: its agent stops."""
        agent = self.agents.get(session_id)
        if agent is not None:
            agent.dispose(flush=False, wait=False)

    def _registered(self) -> None:
        """A model or provider registered: a sweep again, if one could not activate all."""
        if self.mail is not None and (self._unwakeable or self.continuation.chains.stranded):
            self.mail.sweep_soon()

    def _orphan(self, session_id: SessionId) -> None:
        """Messages wait in the inbox of a session nobody holds: activate it here (a
        top-level agent, from its recorded options) or where its parent lives."""
        if not self._closed:
            wake_orphan(
                self.agents, self.sessions, self.continuation, session_id,
                everything=self._adopt or self.agents.adopted.taken_back(session_id),
                said=self._unwakeable,
            )  # fmt: skip

    def _leaving(self, live: LiveSession, descriptor: Any) -> None:
        retain_identity(
            self.sessions, self.store is not None, self.session_projections, live, descriptor
        )

    def _bind(self, agent: Any, turn: Turn | None) -> BoundSubagents:
        return BoundSubagents(self.subagents, agent, turn)

    # -- top-level agents --------------------------------------------------------------

    def spawn(
        self,
        behaviour: Any = "echo",
        *,
        label: str | None = None,
        options: AgentOptions | None = None,
        output_schema: Mapping[str, Any] | None = None,
        session_id: SessionId | str | None = None,
    ) -> Agent:
        """Create a top-level agent (origin ``"user"``, depth 0, no Activation).

        ``behaviour`` is a model name registered in :attr:`models`, a behaviour
        object, or a callable taking the turn. A model name is recorded in the
        session's log (``agent/options``) with ``options``' provider, persona and
        tool filter, so ``agents.resume(session_id)`` rebuilds the agent in any
        process that registers the model; a behaviour object or callable cannot be
        recorded, and its resume needs ``behaviour=`` again.

        ``session_id`` names the new session (a fresh id by default): with a
        durable store, of processes that spawn the same id at once exactly one
        creates it and the others get ``SESSION_EXISTS`` -- a get-or-create for a
        well-known agent (resume it then).

        Raises:
            SubagentError: ``MODEL_NOT_FOUND``, ``INVALID_ARGUMENT``, ``RUNTIME_CLOSED``,
                ``SESSION_EXISTS``.
        """
        self._check_open()
        self._check_thread()
        return spawn_agent(
            self.agents,
            self.models,
            self.sessions,
            self.clock,
            behaviour,
            label=label,
            options=options,
            output_schema=output_schema,
            session_id=session_id,
        )

    def _check_thread(self) -> None:
        """Refuse a blocking call from a foreign OS thread on a gevent runtime, and
        any call in the child of a fork (``WRONG_PROCESS``)."""
        check_born(self._born, "this Runtime")
        home = self._home_thread
        if home is not None and native_get_ident() != home:
            raise SubagentError(
                "a gevent runtime is driven from the OS thread that created it; hand the call"
                " to that thread (e.g. hub.loop.run_callback_threadsafe)",
                code=ErrorCode.WRONG_THREAD,
            )

    def _check_open(self) -> None:
        if self._closed:
            raise SubagentError("the runtime is closed", code=ErrorCode.RUNTIME_CLOSED)

    def wait_idle(self, timeout: float | None = 30.0) -> bool:
        """Wait until every live agent is idle (checked until nothing new started) and
        each child that settles on going idle (``keep_warm=0``) has: released, checkpointed.

        Useful in scripts: a continuable child's turns run after ``followup``
        returns, and may start more work. True when quiescent, False on timeout.
        """
        self._check_thread()
        return self.continuation.wait_quiet(check_timeout(timeout))

    def statistics(self) -> RuntimeStatistics:
        """Live agents, resident children, leases held, mailboxes and turns (see
        :class:`RuntimeStatistics`): counters only, no store read."""
        check_born(self._born, "this Runtime")
        leases = self.sessions.leases
        return runtime_statistics(
            self.agents.list,
            self._counters,
            activations=len(self.continuation.activations()),
            leases_held=0 if leases is None else leases.count(),
            deduplicated=self.sessions.deduplicated,
        )

    # -- shutdown ----------------------------------------------------------------------

    def close(self) -> None:
        """Dispose every agent (deepest first: the agents of one delegation depth stop
        together, each depth once the deeper ones ended), drain writes, close the
        store. Idempotent. A close interrupted part way (Ctrl-C) is not done: the
        next ``close()`` finishes it, and one runs at interpreter exit if none does.
        In the child of a fork it does nothing (all of it is the parent's).

        Raises:
            SubagentError: ``WRONG_THREAD`` from a foreign OS thread on gevent, or
                from one of this runtime's turns, which it would wait for (before
                anything changed: call it from the runtime's own thread, outside
                its agents).
        """
        if fork_generation() != self._born:
            return
        self._check_thread()
        agent = self.agents.running_here()
        if agent is not None:
            raise SubagentError(
                f"close() from a turn of {agent.session_id} would wait for that turn:"
                " close the runtime from outside its agents",
                code=ErrorCode.WRONG_THREAD,
            )
        with self._close_lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._close()
        except BaseException:
            # A Ctrl-C (or any failure) part way: the close is not done. The next
            # close() -- the script's, else the one at interpreter exit -- runs it
            # again, so no actor or writer thread is left to hang the exit.
            with self._close_lock:
                self._closed = False
            raise
        closed(self)

    def _close(self) -> None:
        """The steps of :meth:`close`; each may run again after an interrupted close."""
        if self.mail is not None:  # first: no pickup activates a session once listed
            self.mail.close()
        close_agents(self.agents)  # nor may anything else; then every agent stops
        self.continuation.close()
        self.sessions.close()
        if self.mail is not None:  # heard by other hosts until every lease went back
            self.mail.hang_up()
        if self.store is not None:
            self.backend.run_blocking(self.store.close)  # waits for a write in flight

    def __enter__(self) -> Runtime:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
