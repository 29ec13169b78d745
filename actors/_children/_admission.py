"""The registry actor: admission of continuable children.

Theory of operation
-------------------
One actor owns admission: which message may enter which child's inbox, when a
child is materialized or cold-resumed, who may interrupt it, and where drain
cutoffs close admission. Its state -- the *index* of every Activation that is
not released, and the cutoffs -- is written only here, in the actor's context;
every decision about it is made here, from a table lookup on the Activation's
:class:`~subagents.supervision.Phase`.

Messages it takes (``ask`` unless noted):

* ``Reserve(child_id, parent)`` -- admit the materialization of a new child:
  refused below a drain cutoff or under a parent that is leaving residency;
  answers the ``RESERVED`` Activation.
* ``Admit(request)`` (``tell``) -- route one follow-up by the child's phase:
  into a resident inbox, behind a materialization or release in flight (the
  request waits here, in order), refused below a cutoff, or -- the child is
  absent -- a new reservation handed to the caller to materialize. The request's
  reply future settles with ``None`` (delivered) or that Activation.
* ``Withdraw(request)`` -- the caller gave up: True when it was still waiting.
* ``Publish(activation, agent, delivery, descriptor)`` -- the final admission:
  re-checks the exact live direct parent, installs the agent, delivers the first
  message and then the waiting ones, in one span with no wait in between.
* ``Abandon(activation)`` -- a materialization rolled back.
* ``Hold(child_id)`` -- keep a resident child from settling while a child below
  it is woken (an admission of its own); answers the Activation, or None when
  the child is not resident. ``Publish(..., hold=True)`` holds in the same step.
  ``Unhold(activation)`` (``tell``) ends it.
* ``Cutoff(parents)`` -- a drain: close admission below exact live parents.
* ``EndCutoff(parent)`` (``tell``) -- a drained parent left.
* ``Interrupt(target, authority)`` -- decide interrupt authority.

Notices (:class:`RegistryInbox`), from the supervisor: ``retire(activation)``
(it settles, unless admission says otherwise) and ``released(activation)`` (its
epoch is over: it leaves its parent's ``owned`` set, and the next follow-up
resumes it).

The registry also keeps the ownership records: a child is added to its parent
Activation's ``owned`` set at publication, before its first message is
delivered, and removed when it is released.

Readers outside the actor -- the resident fast path of a follow-up or a report
-- read the index (a dict only this actor writes) and an Activation's ``phase``,
and then let the agent's own gate decide (:meth:`Agent.admit_followup`): the
registry moves the gate *after* the phase, in the same handler, so a reader that
saw a stale phase still meets the closed gate.

What it never does: wait, ask another actor, or run user code (lifecycle
listeners run in the publisher's thread and the dispatcher); agents are only
told things.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from subagents.actors._agents import UNTAKEN, Agent, AgentRegistry, replay, replayed
from subagents.actors._kernel import Latch
from subagents.protocol import (
    ErrorCode,
    SessionId,
    SubagentError,
    new_run_id,
)
from subagents.supervision import (
    FOLLOW_UP,
    MAY_SETTLE,
    VISIBLE,
    Activation,
    NoticeLoop,
    Phase,
    Route,
    SupervisorInbox,
    Trigger,
    advance,
)

from ._authority import Authority
from ._placed import PlacedChild
from ._replay_room import check_replay_room
from ._requests import (
    Abandon,
    Admit,
    Cutoff,
    EndCutoff,
    Hold,
    Interrupt,
    Publish,
    RegistryInbox,
    Request,
    Reserve,
    Unhold,
    Withdraw,
)

__all__ = ["Registry"]


def _err(code: str, message: str) -> SubagentError:
    return SubagentError(message, code=code)


#: The latch of every Activation whose admission has ended (one shared object:
#: a resident Activation holds no latch of its own for it).
_ADMITTED: Final = Latch()
_ADMITTED.set()


class Registry(Authority, NoticeLoop):
    """The registry actor's behaviour; built into an actor class per backend.

    Args:
        index: the dict this actor publishes its Activations in (the caller made
            it, and only reads it).
        agents: the live agents (``is_live``, ``get``).
        notices: this actor's own notice box.
        supervisor: the supervisor's notices.
    """

    def __init__(
        self,
        index: dict[SessionId, Activation],
        agents: AgentRegistry,
        notices: RegistryInbox,
        supervisor: SupervisorInbox,
    ) -> None:
        super().__init__()
        self.index = index
        self.notices = notices
        self._agents = agents
        self._supervisor = supervisor
        self._cutoffs: dict[SessionId, Agent] = {}

    def __repr__(self) -> str:
        return f"<Registry {len(self.index)} activations>"

    # -- dispatch ----------------------------------------------------------------------

    def on_message(self, message: Any) -> Any:
        kind = type(message)
        if kind is Admit:
            return self._route(message.request)
        if kind is Reserve:
            if message.fresh and message.child_id in self.index:
                raise _err(ErrorCode.SESSION_EXISTS, f"{message.child_id} is being materialized")
            return self._reserve(message.child_id, message.parent)
        if kind is Publish:
            return self._publish(message)
        if kind is Abandon:
            return self._abandon(message.activation)
        if kind is Hold:
            return self._hold(message.child_id)
        if kind is Unhold:
            return self._unhold(message.activation)
        if kind is Withdraw:
            return self._withdraw(message.request)
        if kind is Cutoff:
            return self._cutoff(message.parents, message.inclusive)
        if kind is EndCutoff:
            return self._end_cutoff(message.parent)
        if kind is Interrupt:
            return self._interrupt(message.target, message.authority)
        if callable(message):  # a barrier
            return message()
        raise TypeError(f"unexpected message {message!r}")

    def on_notice(self, kind: str, key: Any, value: Any) -> None:
        if kind == "retire":
            self._retire(key)
        else:
            self._released(key, value)

    # -- lineage and cutoffs --------------------------------------------------------------

    def _own_activation(self, agent: Agent) -> Activation | None:
        act = self.index.get(agent.session_id)
        return act if act is not None and act.agent is agent else None

    def _lineage(self, parent: Agent) -> tuple[Agent, ...]:
        """``parent`` and its exact live ancestors, nearest first.

        Above a parent outside continuation (a one-shot child) the chain goes on
        through the live agents of the durable parent sessions, so a drain of a
        host-owned ancestor also covers what is started below a one-shot child.
        """
        chain = [parent]
        agent = parent
        while True:
            act = self._own_activation(agent)
            if act is not None and act.phase in VISIBLE:
                return (*chain, *act.lineage)
            above = agent.parent_session
            up = self._agents.get(above) if above is not None else None
            if up is None or up in chain:
                return tuple(chain)
            chain.append(up)
            agent = up

    def _closed(self, lineage: tuple[Agent, ...]) -> bool:
        if not self._cutoffs:
            return False
        is_live = self._agents.is_live
        return any(self._cutoffs.get(a.session_id) is a and is_live(a) for a in lineage)

    # -- reservation and routing -------------------------------------------------------

    def _reserve(self, child_id: SessionId, parent: Agent) -> Activation:
        own = self.index.get(parent.session_id)
        if own is not None and own.agent is not parent:
            # Its Activation is not published yet (its agent found by id as it is
            # materialized): a child reserved now would be owned by nobody, and the
            # parent could settle under it. A caller by id waits and asks again.
            raise _err(ErrorCode.UNAUTHORIZED, "the parent is not resident yet")
        if own is not None and own.phase not in VISIBLE:
            raise _err(ErrorCode.UNAUTHORIZED, "the parent is leaving residency")
        lineage = self._lineage(parent)
        if self._closed(lineage):
            raise _err(
                ErrorCode.ADMISSION_CLOSED, "admission is closed below this parent (drained)"
            )
        act = Activation(
            child_id,
            parent_session=parent.session_id,
            parent_activation=own,
            lineage=lineage,
            admitted=Latch(),
            released=Latch(),
        )
        if own is not None:
            own.admissions += 1  # keeps the parent resident while we materialize
        self.index[child_id] = act
        return act

    def _route(self, request: Request) -> None:
        try:
            act = self.index.get(request.child_id)
            if act is None:  # absent: the caller materializes it
                request.reply.set_result(self._reserve(request.child_id, request.parent))
                return
            route = FOLLOW_UP[act.phase]
            if route is Route.ENQUEUE:
                self._deliver(act, request)
                request.reply.set_result(None)
            elif route is Route.WAIT:
                self._wait_behind(act, request)
            else:
                raise _err(
                    ErrorCode.ADMISSION_CLOSED, "admission is closed below this parent (drained)"
                )
        except SubagentError as exc:
            request.reply.set_exception(exc)

    def _wait_behind(self, act: Activation, request: Request) -> None:
        """Queue ``request`` until ``act`` publishes, rolls back or is released."""
        if act.waiters is None:
            act.waiters = []
        act.waiters.append(request)

    def _deliver(self, act: Activation, request: Request) -> None:
        agent = act.agent
        header = agent.header
        parent = request.parent
        if (
            header.origin != "subagent"
            or header.parent_session != parent.session_id
            or not self._agents.is_live(parent)
        ):
            raise _err(ErrorCode.UNAUTHORIZED, "only the exact live direct parent may follow up")
        d = request.delivery
        if d is None:  # a wake: resident already, its mail pickup delivers what waits
            if type(agent) is PlacedChild:
                agent.wake()  # ... on its host: one more run there picks it up
            return
        if d.message_id in act.replayed:
            return  # committed before this epoch read its inbox: delivered already
        # A committed message was counted by the store, against the same bound.
        limit = None if d.committed else header.max_inbox
        if not agent.admit_followup(d.content, d.source, d.message_id, d.committed, limit):
            raise _err(ErrorCode.AGENT_DISPOSED, f"agent {agent.session_id} is disposed")

    def _reroute(self, waiters: list[Request] | None) -> None:
        for request in waiters or ():
            self._route(request)

    def _withdraw(self, request: Request) -> bool:
        act = self.index.get(request.child_id)
        if act is not None and act.waiters and request in act.waiters:
            act.waiters.remove(request)
            return True
        return False

    # -- publication -------------------------------------------------------------------

    def _publish(self, m: Publish) -> Activation:
        act, agent = m.activation, m.agent
        parent = act.lineage[0]
        # The final admission: no wait between this check and the delivery.
        if not self._agents.is_live(parent) or agent.parent_session != parent.session_id:
            raise _err(
                ErrorCode.UNAUTHORIZED, "the parent is no longer the exact live direct parent"
            )
        d = m.delivery
        if d is not None and m.replay and not d.committed:
            check_replay_room(agent, d.message_id, m.replay)
        closed = self._closed(act.lineage)
        trigger = Trigger.PUBLISH_CLOSED if closed else Trigger.PUBLISH
        after = advance(act.phase, trigger)
        act.agent = agent
        act.provider = m.descriptor.provider
        act.run_id = new_run_id()
        act.drained = closed
        parent_act = act.parent_activation
        if parent_act is not None:
            parent_act.own(act.child_id)  # owned before the child can run
        # What a crash left in its inbox, the first message, then those that waited
        # for this materialization, in order -- all before the phase lets the fast
        # path in, so none overtakes them. Below a cutoff each is accepted (the
        # materialization was admitted before the cutoff) and discarded with the
        # rest of the drained forest.
        try:
            if m.replay:
                replay(agent, list(m.replay), drop=closed)
                act.replayed = frozenset(e.message_id for e in m.replay)
            if d is not None and d.message_id not in act.replayed:
                agent.deliver(
                    d.content,
                    d.source,
                    message_id=d.message_id,
                    drop=closed,
                    redelivered=UNTAKEN if d.committed else False,
                )
        except BaseException:
            # Not published (the agent was disposed meanwhile: a closing runtime):
            # its rollback abandons it; nothing of the publication stays.
            act.agent = None
            if parent_act is not None:
                parent_act.disown(act.child_id)
            raise
        waiters, act.waiters = act.waiters, None
        for request in waiters or ():
            try:
                if closed:
                    raise _err(
                        ErrorCode.ADMISSION_CLOSED,
                        "admission is closed below this parent (drained)",
                    )
                self._deliver(act, request)
                request.reply.set_result(None)
            except SubagentError as exc:
                request.reply.set_exception(exc)
        if isinstance(agent, Agent):  # (a placed child's host replays its own)
            replayed(agent)  # what reports and the pickup left meanwhile is queued after
        if closed:
            agent.close_admission()
        if m.hold:
            act.admissions += 1  # before it may settle: see Hold
        act.phase = after  # published: readers may take the fast path from here
        self._end_admission(act, published=True)
        # Its first turn may have ended before the phase said it could settle.
        self._supervisor.quiescent(act)
        return act

    def _hold(self, child_id: SessionId) -> Activation | None:
        act = self.index.get(child_id)
        if act is None or act.phase not in VISIBLE:
            return None
        act.admissions += 1
        return act

    def _unhold(self, act: Activation) -> None:
        act.admissions -= 1
        self._supervisor.quiescent(act)

    def _abandon(self, act: Activation) -> None:
        if act.phase is not Phase.RESERVED:
            return
        act.phase = advance(act.phase, Trigger.ABANDON)
        if self.index.get(act.child_id) is act:
            del self.index[act.child_id]
        self._end_admission(act, published=False)
        waiters, act.waiters = act.waiters, None
        self._reroute(waiters)  # the first one reserves anew

    def _end_admission(self, act: Activation, *, published: bool) -> None:
        parent = act.parent_activation
        if parent is not None:
            parent.admissions -= 1
            self._supervisor.quiescent(parent)  # a rolled-back child may leave it idle
        admitted, act.admitted = act.admitted, _ADMITTED  # a drain may hold the first
        admitted.set()

    # -- settlement --------------------------------------------------------------------

    def _retire(self, act: Activation) -> None:
        if act.phase not in MAY_SETTLE or act.admissions or act.owned:
            return  # whatever changed it posts a new notice when it ends
        if not act.agent.close_if_idle():
            return
        act.phase = advance(act.phase, Trigger.RETIRE)
        self._supervisor.retired(act)

    def _released(self, act: Activation, announce: Callable[[Activation], object] | None) -> None:
        if act.phase in (Phase.RESERVED, Phase.RELEASED):
            return  # never published (its rollback abandons it), or abandoned already
        act.phase = advance(act.phase, Trigger.RELEASE)
        if self.index.get(act.child_id) is act:
            del self.index[act.child_id]
        if announce is not None:
            # Posted now: ``subagent/end`` follows the index's update (whoever sees the
            # end sees the child gone) and precedes the parent's settling and a cold
            # resume by a waiter (a new epoch's start).
            announce(act)
        parent = act.parent_activation
        # Child-first: the parent may settle once it owns no child (not before).
        if parent is not None and parent.disown(act.child_id):
            self._supervisor.quiescent(parent)
        waiters, act.waiters = act.waiters, None
        self._reroute(waiters)  # the first one cold-resumes it
