"""The continuation manager: continuable children, from start to drain.

Theory of operation
-------------------
A continuable child has one durable session and at most one process-local
:class:`~subagents.supervision.Activation`. Its agent's mailbox is the only turn
queue. The manager wires three actors and owns none of their state:

* the **registry** (:mod:`._admission`) owns admission -- the Activation index,
  reservations, interrupt authority and drain cutoffs;
* the **supervisor** (:mod:`subagents.supervision`) owns residency -- the owned
  children, settlement, keep-warm and child-first release;
* the **dispatcher** runs lifecycle listeners in order, outside both.

The public operations below are the caller's side. The common case of a
follow-up -- a resident child -- is decided without a round trip: the index and
the Activation's phase (both published by the registry) route it, and the
child's own gate admits it (:meth:`Agent.admit_followup`), atomically with
respect to retirement and drain cutoffs. Everything else goes through the
registry: a child that is absent, materializing or settling is routed there, and
a materialization is admitted, built in the caller's thread, and published there.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

import pykka
from subagents.actors._agents import Agent, AgentRegistry, runtime_closed
from subagents.actors._kernel import (
    AbortSignal,
    Alarm,
    Backend,
    DispatchBox,
    Dispatcher,
    Latch,
    actor_class,
    check_keep_warm,
)
from subagents.protocol import (
    ErrorCode,
    MessageId,
    SessionId,
    SubagentError,
    new_message_id,
    new_session_id,
)
from subagents.supervision import VISIBLE, Activation, Supervisor, SupervisorInbox

from ._admission import Registry
from ._announce import Announcer
from ._chains import Chains
from ._child import ChildContext, StoredParent
from ._control import drain, drain_asked, drain_elsewhere, interrupt, stored_ancestor
from ._events import EventBus
from ._followups import Followups
from ._intake import start_child_id
from ._materialize import ADMISSION_TIMEOUT, Materializer
from ._placement import PlacementLookup, release_placed
from ._provider_registry import ProviderRegistry
from ._quiet import barrier, settle_pass, wait_quiet
from ._requests import EndCutoff, Hold, RegistryInbox, RemoteAncestor, Reserve, Unhold
from ._residency import ResidencyHooks
from ._setup import SetupRegistration, SetupRegistry
from ._start import Prepared, create_unheld, prepare_start
from ._types import ContinuableHandle, ContinuableStartSpec, UserAuthority
from ._validate import bad, check_start_spec

__all__ = ["ContinuationManager"]

logger = logging.getLogger("subagents")

_NEVER = AbortSignal.never()


def _err(code: str, message: str) -> SubagentError:
    return SubagentError(message, code=code)


class ContinuationManager(Followups):
    """Admission, residency and release of continuable children (see the module docstring)."""

    def __init__(
        self,
        ctx: ChildContext,
        backend: Backend,
        *,
        providers: ProviderRegistry,
        events: EventBus,
        keep_warm: float = 0.0,
    ) -> None:
        check_keep_warm(keep_warm)
        # An int past a float's range: for ever.
        keep_warm = math.inf if keep_warm > sys.float_info.max else float(keep_warm)
        self._ctx = ctx
        self._sleep = backend.sleep
        self._providers = providers
        self._events = events
        self._setups = SetupRegistry()
        self._index: dict[SessionId, Activation] = {}  # written only by the registry actor
        base = backend.actor_class
        dispatch = DispatchBox()
        self._dispatcher = actor_class(base, Dispatcher).start(dispatch)
        dispatch.bind(self._dispatcher)
        self._supervisor_box = SupervisorInbox()
        self._registry_box = RegistryInbox()
        self._alarm = Alarm(backend, self._supervisor_box.tick, name="subagents-keep-warm")
        announcer = Announcer(events.emit, dispatch, ctx.telemetry, events.listening)
        self._hooks = ResidencyHooks(self._registry_box, self._alarm, announcer, float(keep_warm))
        self._supervisor = actor_class(base, Supervisor).start(self._hooks, self._supervisor_box)
        self._supervisor_box.bind(self._supervisor)
        self._registry = actor_class(base, Registry).start(
            self._index, ctx.agents, self._registry_box, self._supervisor_box
        )
        self._registry_box.bind(self._registry)
        lookup = PlacementLookup(providers.names, providers.get, ctx.sessions)
        self._materializer = Materializer(
            self._ask, self._tell, self._setups, self._supervisor_box, announcer,
            lookup, backend,
        )  # fmt: skip
        #: Children placed here by parents in other processes (:mod:`._hosted`).
        self.hosted: dict[SessionId, Agent] = {}
        #: Waking chains of settled sessions below one live here (by id, sweeps).
        self.chains = Chains(
            self.require_agents, self._materializer, ctx.sessions, self._tell_quietly, self.left
        )

    @property
    def keep_warm_seconds(self) -> float:
        """How long an idle child stays resident before it settles."""
        return self._hooks.keep_warm

    def _ask(self, message: Any) -> Any:
        """A round trip to the registry actor (its answer, or its error raised;
        ``RUNTIME_CLOSED`` once it stopped)."""
        try:
            return self._registry.ask(message, block=True)
        except pykka.ActorDeadError:
            raise runtime_closed() from None

    def _tell(self, message: Any) -> None:
        """A message to the registry actor (``RUNTIME_CLOSED`` once it stopped)."""
        try:
            self._registry.tell(message)
        except pykka.ActorDeadError:
            raise runtime_closed() from None

    def _tell_quietly(self, message: Any) -> None:
        """A release for the registry; once it stopped, there is nothing to release."""
        with contextlib.suppress(pykka.ActorDeadError):
            self._registry.tell(message)

    def require_agents(self) -> AgentRegistry:
        """The agent registry, resolved per operation (the seed's ``ctx.agents``)."""
        agents: AgentRegistry | None = getattr(self._ctx, "agents", None)
        if agents is None:  # unmounted (the seed's ctx.agents is optional)
            raise _err(
                ErrorCode.AGENT_REGISTRY_UNAVAILABLE, "continuable children need the agent registry"
            )
        return agents

    def hold(self, agent: Agent) -> Callable[[], None] | None:
        """Keep ``agent``'s Activation resident -- it neither settles nor is
        released -- until the returned release is called (once; later calls do
        nothing): what a continuable child's background work needs to outlive its
        turns. A top-level agent is kept from being let go as an adoption
        (``AgentRegistry.adopted``); None for any other agent that is not a
        resident continuable child. A drain still cancels the agent: whoever holds
        must release once that cancel ended its work (``add_cancel_listener``)."""
        if self.activation(agent.session_id) is None:
            top = agent.parent_session is None and self.require_agents().is_live(agent)
            return self.require_agents().adopted.hold(agent) if top else None
        act: Activation | None = self._ask(Hold(agent.session_id))
        if act is None:
            return None
        if act.agent is not agent:  # another epoch's: not ours to keep
            self._tell_quietly(Unhold(act))
            return None
        released = threading.Lock()

        def release() -> None:
            if released.acquire(blocking=False):
                self._tell_quietly(Unhold(act))

        return release

    # -- reading -----------------------------------------------------------------------

    @property
    def index(self) -> Mapping[SessionId, Activation]:
        """The Activation index the registry publishes (read it, never write it)."""
        return self._index

    def activation(self, child_id: SessionId | str) -> Activation | None:
        """The resident Activation of ``child_id`` (None when absent or settling)."""
        try:
            act = self._index.get(SessionId(child_id))
        except SubagentError:
            return None
        return act if act is not None and act.phase in VISIBLE else None

    def left(self, agent: Agent) -> bool:
        """Whether ``agent``, live here a moment ago, is no longer: disposed, or a
        child leaving residency -- then once it has left (its release announced,
        so what comes next finds it gone)."""
        act = self._index.get(agent.session_id)
        if act is not None and act.agent is agent and act.phase not in VISIBLE:
            act.released.wait(ADMISSION_TIMEOUT)
            return True
        return not self.require_agents().is_live(agent)

    def published(self, session_id: SessionId, signal: AbortSignal | None = None) -> bool:
        """Wait while ``session_id`` is being materialized here -- its agent live
        already, its Activation not yet published or rolled back: what comes by its
        id meanwhile would reach it before its setup is installed and ahead of what
        woke it, or start a child no Activation of it owns. True when it waited."""
        act = self._index.get(session_id)
        if act is None or act.agent is not None or not isinstance(act.admitted, Latch):
            return False
        latch = act.admitted.signal
        (latch if signal is None else AbortSignal.any(latch, signal)).wait(ADMISSION_TIMEOUT)
        return True

    def has_children(self, parent_id: SessionId) -> bool:
        """Whether a continuable child of ``parent_id`` is resident here, or on its
        way in or out (any Activation not released)."""
        return any(a.parent_session == parent_id for a in self._index.copy().values())

    def activations(self) -> list[Activation]:
        """Every resident Activation."""
        # dict.copy() is one C call: atomic under the GIL while the registry writes.
        return [a for a in self._index.copy().values() if a.phase in VISIBLE]

    # -- start_continuable ---------------------------------------------------------------

    def start_continuable(self, spec: ContinuableStartSpec) -> ContinuableHandle:
        """See :meth:`SubagentService.start_continuable` (``spec.parent``: an agent)."""
        check_start_spec(spec)
        parent = spec.parent
        if not isinstance(parent, Agent):
            raise bad("spec.parent must be an Agent here (a start by id: SubagentService)")
        agents = self.require_agents()
        p = prepare_start(self._ctx, self._providers, spec, parent, agents)
        if spec.message_id is None:
            act: Activation = self._ask(Reserve(new_session_id(), parent))
            return self._materializer.create(
                act, self._ctx, spec, p.prepare, p.options, p.depth, p.descriptor,
                new_message_id(), p.placement,
            )  # fmt: skip
        return self._start_once(spec, p)

    def start_unheld(
        self, spec: ContinuableStartSpec, parent: StoredParent
    ) -> tuple[ContinuableHandle, bool]:
        """A start by the parent's id where the parent is not live here (see
        :func:`._start.create_unheld`): the child is committed unheld; the caller
        wakes whoever can run it."""
        p = prepare_start(self._ctx, self._providers, spec, parent, None)
        return create_unheld(self._ctx, spec, parent, p)

    def _start_once(self, spec: ContinuableStartSpec, p: Prepared) -> ContinuableHandle:
        """An idempotent start: the child's id derives from the parent's and the
        message's, so a repeated start finds it (here, or in the store)."""
        assert spec.message_id is not None
        assert isinstance(spec.parent, Agent)
        parent = spec.parent
        signal = spec.signal or _NEVER
        mid = MessageId(spec.message_id)
        child_id = start_child_id(parent.session_id, mid)
        sessions = self._ctx.sessions
        while True:
            if sessions.header(child_id) is not None:
                return ContinuableHandle(child_id, mid)
            try:
                act: Activation = self._ask(Reserve(child_id, parent, fresh=True))
            except SubagentError as exc:
                if exc.code != ErrorCode.SESSION_EXISTS:
                    raise
                busy = self._index.get(child_id)  # a start or resume in flight here
                if busy is not None and isinstance(busy.admitted, Latch):
                    AbortSignal.any(busy.admitted.signal, signal).wait(ADMISSION_TIMEOUT)
                signal.raise_if_aborted()
                continue
            try:
                return self._materializer.create(
                    act, self._ctx, spec, p.prepare, p.options, p.depth, p.descriptor, mid,
                    p.placement,
                )  # fmt: skip
            except SubagentError as exc:
                if exc.code != ErrorCode.SESSION_EXISTS:  # another process created it
                    raise

    # -- interrupt ---------------------------------------------------------------------

    def interrupt(self, target: Any, authority: Any) -> None:
        """See :meth:`SubagentService.interrupt`."""
        interrupt(
            target, authority, ask=self._ask, sessions=self._ctx.sessions, clock=self._ctx.clock
        )

    def interrupt_asked(
        self, target: SessionId, by: SessionId, asked_at: float, kind: str = "user"
    ) -> None:
        """An interrupt another process asked at ``asked_at`` of a child live here, by
        its parent's address -- or by an ``"ancestor"`` live there, whose ancestry is
        checked in the store here; or a ``"drain"`` of the child, by its parent (this
        runtime's mail task calls it).

        Raises:
            SubagentError: ``UNAUTHORIZED`` for an ancestor that is none, or a drain
                by another than the child's parent.
        """
        if kind not in ("user", "ancestor", "drain"):
            raise _err(
                ErrorCode.INVALID_ARGUMENT, f"kind is 'user', 'ancestor' or 'drain': {kind!r}"
            )
        sessions = self._ctx.sessions
        if kind == "drain":
            drain_asked(
                target, by, index=self._index, ask=self._ask,
                quiescent=self._supervisor_box.quiescent, end_cutoff=self._end_cutoff,
            )  # fmt: skip
            return
        authority: Any = UserAuthority(by)
        if kind == "ancestor":
            if not stored_ancestor(sessions, target, by):
                raise _err(ErrorCode.UNAUTHORIZED, f"{by} is no ancestor of {target}")
            authority = RemoteAncestor(by)
        interrupt(
            target, authority, ask=self._ask, sessions=sessions, clock=self._ctx.clock,
            asked_at=asked_at,
        )  # fmt: skip

    # -- setup contributions -------------------------------------------------------------

    def register_continuable_setup(self, contribution: Any) -> SetupRegistration:
        """See :meth:`SubagentService.register_continuable_setup`."""
        return self._setups.register(contribution)

    # -- drain -------------------------------------------------------------------------

    def drain(self, parents: Any, timeout: float | None = 60.0) -> None:
        """See :meth:`SubagentService.drain_continuable_descendants`."""
        if self._hooks.closing:  # (its agents are disposed: not "not live agents")
            raise _err(ErrorCode.RUNTIME_CLOSED, "the runtime was closed")
        drain(
            parents,
            timeout,
            agents=self.require_agents(),
            index=self._index,
            ask=self._ask,
            quiescent=self._supervisor_box.quiescent,
            end_cutoff=self._end_cutoff,
            elsewhere=self._drain_elsewhere,
        )

    def _drain_elsewhere(self, parents: list[SessionId], timeout: float | None) -> None:
        drain_elsewhere(
            self._ctx.sessions, parents, timeout,
            here=self._index, clock=self._ctx.clock, sleep=self._sleep,
        )  # fmt: skip

    def _end_cutoff(self, agent: Agent) -> None:
        with contextlib.suppress(pykka.ActorDeadError):
            self._tell_quietly(EndCutoff(agent))

    def wait_quiet(self, timeout: float | None) -> bool:
        """``Runtime.wait_idle``: every agent idle, and every child that settles on
        going idle released (see :mod:`._quiet`); False on ``timeout``."""
        owners = (self._supervisor, self._registry)  # (not the dispatcher: see ._quiet)
        quiescent, warm = self._supervisor_box.quiescent, self._hooks.keep_warm

        def settle(deadline: float | None, waited: set[Activation]) -> int | None:
            return settle_pass(self._index, quiescent, owners, warm, deadline, waited)

        rung = self._ctx.sessions.rung
        return wait_quiet(self.require_agents(), settle, timeout, rung, self._sleep)

    # -- shutdown ----------------------------------------------------------------------

    def close(self) -> None:
        """Stop the alarm and the registry, supervisor and dispatcher actors."""
        self._hooks.closing = True
        release_placed(list(self._index.copy().values()), "runtime closing")
        self._alarm.close()
        owners = (self._supervisor, self._registry, self._dispatcher)
        # The agents are stopped; their last notices travel supervisor -> registry
        # -> dispatcher (a release, its retirement, its subagent/end). Twice through
        # the three, each done with what came before it, so none is left behind
        # an owner that already stopped (a child's end went unheard, its span open).
        for ref in owners * 2:
            with contextlib.suppress(Exception):
                ref.ask(barrier, timeout=30)
        for ref in (self._registry, self._supervisor, self._dispatcher):
            try:
                ref.stop(block=True, timeout=30)
            except Exception:
                logger.exception("stopping %r failed", ref)
        # Follow-ups queued behind an admission the stopped registry will never
        # open: refused now, not after their wait's timeout.
        if self._registry.is_alive():
            return  # (its stop timed out: it still answers them)
        for act in list(self._index.values()):
            waiters, act.waiters = act.waiters, None
            for request in waiters or ():
                request.reply.set_exception(runtime_closed())
        # And those whose admission never reached it (a tell racing its stop is
        # dropped): their wait ends now too.
        self._materializer.stopped.set()
