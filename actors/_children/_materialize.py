"""Materialization: making a continuable child resident, or undoing that entirely.

This is the one place a continuable child is built, new (:meth:`Materializer.create`)
or cold-resumed (:meth:`Materializer.resume`).

A child becomes resident in three steps, the same for a new child and for a cold
resume: the registry admits a reservation (a ``RESERVED`` Activation); the caller
builds the agent in its own thread (session, setup contributions, listeners) --
the slow part, with store reads and user code; the registry publishes it,
delivering the first message in the same span. Any failure before publication
rolls the child back completely: the agent is disposed (which releases its setup
scope), a new child's session is deleted, and the reservation is abandoned.

:class:`Materializer` also waits for the registry's verdict on a routed
follow-up, honouring the caller's signal: a caller that gives up while queued is
withdrawn; one whose verdict arrived meanwhile keeps it (an accepted message
stays accepted) or abandons the reservation it was handed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import pykka
from subagents.actors._agents import (
    Agent,
    AgentOptions,
    AgentRegistry,
    Restored,
    SessionService,
)
from subagents.actors._kernel import AbortSignal, Latch
from subagents.protocol import (
    ContinuableDescriptor,
    ErrorCode,
    MessageId,
    MessageSource,
    SessionId,
    SubagentError,
    descriptor_event,
    trusted_message,
)
from subagents.store import InboxEntry
from subagents.supervision import Activation, SupervisorInbox

from ._announce import Announcer
from ._child import ChildContext, create_child
from ._placed import PlacedChild, Placement
from ._placement import PlacementLookup
from ._requests import Abandon, Admit, Delivery, Hold, Publish, Request, Withdraw
from ._setup import SetupRegistry
from ._types import ContinuableHandle, ContinuableStartSpec, created_seed

__all__ = ["ADMISSION_TIMEOUT", "Materializer"]

#: Seconds a follow-up waits behind a materialization or a release in flight
#: before it gives up with ``TIMEOUT`` (its caller's signal may end it sooner).
ADMISSION_TIMEOUT = 60.0

_NEVER = AbortSignal.never()


class Materializer:
    """The caller's side of admission (see the module docstring)."""

    def __init__(
        self,
        ask: Callable[[Any], Any],
        tell: Callable[[Any], None],
        setups: SetupRegistry,
        supervisor: SupervisorInbox,
        announcer: Announcer,
        placed: PlacementLookup,
        backend: Any,
    ) -> None:
        self._placed = placed
        self._backend = backend
        self._ask = ask
        self._tell = tell
        #: Set once the registry actor stopped: an admission it never answered
        #: stops being waited for (the ask that withdraws it says RUNTIME_CLOSED).
        self.stopped = Latch()
        self._setups = setups
        self._announcer = announcer
        self._supervisor = supervisor

    def route(self, request: Request, signal: AbortSignal) -> Activation | None:
        """Route ``request`` through the registry: None when delivered, else the
        reservation the caller must materialize.

        Raises:
            SubagentError: the registry's refusal, ``CANCELLED`` or ``TIMEOUT``.
        """
        reply = request.reply
        self._tell(Admit(request))
        if not reply.done():
            arrived = Latch()
            reply.add_done_callback(lambda _reply: arrived.set())
            AbortSignal.any(arrived.signal, signal, self.stopped.signal).wait(ADMISSION_TIMEOUT)
        if not reply.done() and self._ask(Withdraw(request)):
            signal.raise_if_aborted()
            raise SubagentError(
                f"admission to {request.child_id} did not open within {ADMISSION_TIMEOUT} s",
                code=ErrorCode.TIMEOUT,
            )
        verdict = reply.get(0)  # answered before the withdrawal reached the registry
        if verdict is not None and signal.aborted:
            self._ask(Abandon(verdict))
            signal.raise_if_aborted()
        return verdict

    def attach(self, act: Activation, agent: Agent | PlacedChild) -> None:
        """Install setup contributions and the residency listeners (unpublished)."""
        if isinstance(agent, Agent):  # a placed child's host installs its own
            self._setups.install(agent)
        residency = _Residency(act, self._supervisor)
        agent.add_idle_listener(residency.on_idle)
        agent.add_dispose_listener(residency.on_disposed)

    def publish(
        self,
        act: Activation,
        agent: Agent | PlacedChild,
        delivery: Delivery | None,
        descriptor: ContinuableDescriptor,
        replay: Sequence[InboxEntry] = (),
        hold: bool = False,
    ) -> None:
        """The final admission, then the epoch's ``subagent/start``; a child published
        below a cutoff is drained at once. ``hold``: published held (see ``Hold``)."""
        self._ask(Publish(act, agent, delivery, descriptor, replay, hold))
        try:
            if act.drained:
                agent.cancel("drained", keep_inbox=False)
        finally:
            self._announcer.start(act)

    def rollback(
        self, act: Activation, agent: Agent | None, delete_from: SessionService | None
    ) -> None:
        """Undo a materialization that did not publish: nothing of it may remain.

        ``delete_from``: the sessions a new child's session is deleted from (None
        for a cold resume, whose session stays).
        """
        if agent is not None:
            agent.dispose(flush=False)  # releases its setup scope
            if delete_from is not None:
                delete_from.discard(agent.session)
        with contextlib.suppress(pykka.ActorDeadError):
            self._ask(Abandon(act))

    def create(
        self,
        act: Activation,
        ctx: ChildContext,
        spec: ContinuableStartSpec,
        prepare: Callable[[ContinuableStartSpec], Any],
        options: AgentOptions,
        depth: int,
        descriptor: ContinuableDescriptor,
        message_id: MessageId,
        placement: Placement | None = None,
    ) -> ContinuableHandle:
        """Create ``act``'s new child from the provider's prepared data and publish
        it with the initial prompt ``message_id``; on any failure nothing of it
        remains. Under strict durability the prompt is committed with the child.

        ``placement``: the child runs on a host (:mod:`._placed`): its session is
        made here and released, and its Activation's agent is a stand-in."""
        parent = spec.parent
        assert isinstance(parent, Agent)  # a start by id is created unheld instead
        signal = spec.signal or AbortSignal.never()
        agent: Agent | None = None
        try:
            seed = created_seed(prepare(spec), spec.provider)
            source = spec.source if isinstance(spec.source, MessageSource) else parent.parent_source
            prompt = trusted_message(message_id, spec.prompt, source)
            agent = create_child(
                ctx,
                parent,
                child_id=act.child_id,
                label=spec.label,
                depth=depth,
                options=options,
                seed=seed,
                own=(descriptor_event(descriptor),),
                inbox=(prompt,) if ctx.sessions.strict else (),
                max_inbox=spec.max_inbox if spec.max_inbox is not None else ctx.max_inbox,
            )
            agent._descriptor = descriptor
            if placement is not None:
                self._place(act, agent, placement, Delivery(spec.prompt, source, message_id))
                return ContinuableHandle(act.child_id, message_id)
            self.attach(act, agent)
            signal.raise_if_aborted()
            self.publish(act, agent, Delivery(spec.prompt, source, message_id), descriptor)
        except BaseException:
            self.rollback(act, agent, ctx.sessions if agent is not None else None)
            raise
        return ContinuableHandle(act.child_id, message_id)

    def _place(
        self, act: Activation, agent: Agent, placement: Placement, delivery: Delivery
    ) -> None:
        """Publish the stand-in of a new placed child, then let the session go (its
        prompt waits in the durable inbox) and have a host run it."""
        delivery.committed = True
        child = self._publish_placed(act, agent.header, placement, delivery, agent._descriptor)
        # The session, descriptor and prompt are written; the lease goes, and the
        # prompt -- created handed to this epoch, which never runs it -- goes back
        # to nobody with it: the host's first turn is no replay (``redelivered``).
        agent.session.unrun = [delivery.message_id]
        agent.dispose()
        # Drained (below a cutoff, or by a drain since its publication) too: its
        # run is then the one the drain's cancel owes, which drops the prompt.
        child.start()

    def _publish_placed(
        self,
        act: Activation,
        header: Any,
        placement: Placement,
        delivery: Delivery | None,
        descriptor: ContinuableDescriptor,
        hold: bool = False,
    ) -> PlacedChild:
        """Publish ``act`` with a :class:`PlacedChild` as its agent, not started: the
        caller starts it (it does not settle before), drained or not."""
        child = PlacedChild(header, placement, self._backend)
        self.attach(act, child)
        self.publish(act, child, delivery, descriptor, hold=hold)
        return child

    def wake(
        self, child_id: SessionId, parent: Agent, agents: AgentRegistry, *, hold: bool = False
    ) -> Activation | None:
        """Cold-resume ``child_id`` for what waits in its durable inbox, on behalf of
        its live ``parent``: no message of the caller's own (``LEASE_HELD``:
        another process holds it, and runs what waits). ``hold``: the child is
        woken for a child below it, and kept from settling until the caller's
        ``Unhold`` -- its held Activation is returned (None: it was leaving
        residency just then; wake it again)."""
        act = self.route(Request(child_id, parent, None), _NEVER)
        if act is not None:
            self.resume(act, agents, None, _NEVER, hold=hold)
            return act if hold else None
        held: Activation | None = self._ask(Hold(child_id)) if hold else None
        return held

    def resume(
        self,
        act: Activation,
        agents: AgentRegistry,
        delivery: Delivery | None,
        signal: AbortSignal,
        *,
        hold: bool = False,
    ) -> None:
        """Cold-resume ``act``'s child from its persisted session and publish it,
        delivering what its inbox still holds first, then ``delivery`` (None: a
        wake, for what the inbox holds). A placed child is published as a stand-in
        and run by a host. ``hold``: published held (see :meth:`wake`)."""
        placed = self._placed.of(act.child_id)
        if placed is not None:
            placement, descriptor, header = placed
            try:
                child = self._publish_placed(act, header, placement, delivery, descriptor, hold)
            except BaseException:
                self.rollback(act, None, None)
                raise
            child.start()  # (drained: what waits is dropped, see _place)
            return
        restored: Restored | None = None
        try:
            restored = agents.resume_continuable(act.child_id)
            agent = restored.agent
            self.attach(act, agent)
            signal.raise_if_aborted()
            self.publish(act, agent, delivery, agent._descriptor, restored.pending, hold)
        except BaseException:
            if restored is not None:
                if delivery is not None and delivery.committed:
                    # Refused: take it back before the lease goes (whose release
                    # would otherwise find it waiting and have it run after all).
                    with contextlib.suppress(SubagentError):
                        agent = restored.agent
                        if agent.host.sessions.retract(
                            act.child_id, delivery.message_id, agent.session
                        ):
                            delivery.committed = False
                with contextlib.suppress(SubagentError):  # then they stay pending: replayed
                    restored.give_back()
            self.rollback(act, None if restored is None else restored.agent, None)
            raise


class _Residency:
    """An epoch's residency listeners on its agent. One small object and two bound
    methods: two closures were eight objects the collector walked for as long as
    the child stayed resident (a million of them, in the million-child bench)."""

    __slots__ = ("act", "supervisor")

    def __init__(self, act: Activation, supervisor: Any) -> None:
        self.act = act
        self.supervisor = supervisor

    def on_idle(self, _agent: Any) -> None:
        # A waiting parent (it owns children) cannot settle on its own going idle:
        # the release of its last child considers it again. Skipping the notice
        # keeps a busy parent's turn loop free of supervisor traffic.
        act = self.act
        if not act.owned or act.drained:
            self.supervisor.quiescent(act)

    def on_disposed(self, disposed: Any) -> None:
        if self.act.agent is disposed:  # published: its epoch ends here
            self.supervisor.released(self.act)
