"""The continuation manager and its registry actor: continuable children.

Theory of operation
-------------------
A continuable child has one durable session and at most one process-local
:class:`~subagents.supervision.Activation`. The child's agent actor mailbox is the
only turn queue; this module decides *admission* -- which message may enter
which inbox, when a child is materialized or cold-resumed, who may interrupt it,
and where drain cutoffs close admission -- and the supervisor actor
(:mod:`subagents.supervision`) decides *release*.

The registry actor serialises every slow-path decision. Messages it accepts:

* ``_Reserve(child_id, parent, lineage)`` -- admit one materialization (a new
  child or a cold resume): refuses below a drain cutoff, and answers "wait" while
  another materialization or a settlement of the same child is in flight, so a
  child never has two Activations;
* ``_Publish(reservation, agent, ...)`` -- the final admission: re-checks that the
  parent is the exact live direct parent, installs the Activation, records it in
  the parent Activation's ``owned`` set, and delivers the message into the new
  inbox, all in one span with no wait in between;
* ``_Abandon(reservation)`` -- a materialization rolled back;
* ``_Cutoff(parents)`` -- a drain: close admission below exact live parents.

The resident fast path (a follow-up or report to a child that is resident)
does not round-trip through the actor: it reads and updates the same state under
the registry lock, which every actor handler also holds while it mutates.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pykka
from subagents.actors._agents._agent import Agent, _plain
from subagents.actors._kernel._signal import AbortController, AbortSignal
from subagents.protocol import (
    ContinuableDescriptor,
    ErrorCode,
    InterruptEvent,
    MessageId,
    MessageSource,
    SessionHeader,
    SessionId,
    SubagentError,
    descriptor_event,
    new_message_id,
    new_run_id,
    new_session_id,
    packb,
    snapshot_subagent_descriptor,
)
from subagents.supervision import (
    Activation,
    Notices,
    supervisor_actor_class,
)

from ._providers import child_options
from ._types import (
    AncestorAuthority,
    ContinuableCreateSpec,
    ContinuableHandle,
    ContinuableStartSpec,
    SubagentEvent,
    UserAuthority,
)

if TYPE_CHECKING:
    from subagents.actors._runtime import Runtime

__all__ = ["ContinuableScope", "ContinuationManager", "SetupRegistration"]

logger = logging.getLogger("subagents")


def _err(code: str, message: str) -> SubagentError:
    return SubagentError(message, code=code)


class _Latch:
    """A one-shot event that a caller can also wait on together with its own signal."""

    __slots__ = ("_controller",)

    def __init__(self) -> None:
        self._controller = AbortController()

    @property
    def signal(self) -> AbortSignal:
        return self._controller.signal

    def set(self) -> None:
        self._controller.abort("set")

    def is_set(self) -> bool:
        return self._controller.signal.aborted

    def wait(self, timeout: float | None = None) -> bool:
        return self._controller.signal.wait(timeout)


class _Reservation:
    __slots__ = ("child_id", "done", "lineage", "parent", "parent_activation")

    def __init__(
        self,
        child_id: SessionId,
        parent: Agent,
        lineage: tuple[Agent, ...],
        parent_activation: Activation | None,
        done: Any,
    ) -> None:
        self.child_id = child_id
        self.parent = parent
        self.lineage = lineage
        self.parent_activation = parent_activation
        self.done = done


class _Reserve:
    __slots__ = ("child_id", "parent")

    def __init__(self, child_id: SessionId, parent: Agent) -> None:
        self.child_id = child_id
        self.parent = parent


class _Publish:
    __slots__ = ("agent", "content", "descriptor", "message_id", "reservation", "source")

    def __init__(
        self,
        reservation: _Reservation,
        agent: Agent,
        descriptor: ContinuableDescriptor,
        content: Any,
        source: MessageSource,
        message_id: MessageId,
    ) -> None:
        self.reservation = reservation
        self.agent = agent
        self.descriptor = descriptor
        self.content = content
        self.source = source
        self.message_id = message_id


class _Abandon:
    __slots__ = ("reservation",)

    def __init__(self, reservation: _Reservation) -> None:
        self.reservation = reservation


class _Cutoff:
    __slots__ = ("parents",)

    def __init__(self, parents: tuple[Agent, ...]) -> None:
        self.parents = parents


class ContinuableScope:
    """The unpublished scope of a continuable child that setup contributions extend."""

    __slots__ = ("agent", "child_id", "parent_session")

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.child_id = agent.session_id
        self.parent_session = agent.parent_session

    def add_tool(self, name: str, fn: Callable[..., Any]) -> Callable[[], None]:
        """Give this child a tool; returns its remover."""
        self.agent._extra_tools[name] = fn
        return lambda: self.agent._extra_tools.pop(name, None) and None


Contribution = Callable[[ContinuableScope], "Callable[[], object] | None"]


class SetupRegistration:
    """Returned by ``register_continuable_setup``; ``dispose()`` revokes at once."""

    def __init__(self, manager: ContinuationManager, contribution: Contribution) -> None:
        self._manager = manager
        self.contribution = contribution

    def dispose(self) -> None:
        self._manager._remove_setup(self)


class ContinuationManager:
    """Admission, residency and release of continuable children (see module docstring)."""

    def __init__(self, runtime: Runtime, *, keep_warm: float = 0.0) -> None:
        self._runtime = runtime
        self.lock = threading.RLock()
        self._activations: dict[SessionId, Activation] = {}
        self._reservations: dict[SessionId, _Reservation] = {}
        self._settling: dict[SessionId, Activation] = {}
        self._cutoffs: dict[SessionId, Agent] = {}
        self._setups: list[SetupRegistration] = []
        if not isinstance(keep_warm, (int, float)) or keep_warm < 0:
            raise _err(ErrorCode.INVALID_ARGUMENT, "keep_warm is a number of seconds >= 0")
        self.keep_warm_seconds = float(keep_warm)
        self._warm: dict[SessionId, Activation] = {}
        self._sweeper: Any = None
        self._sweeper_wake = runtime.backend.event()
        self._closing = False
        backend = runtime.backend
        self._registry = _registry_actor_class(backend.actor_class).start(self)
        self._notices = Notices()
        self._supervisor = supervisor_actor_class(backend.actor_class).start(self, self._notices)
        self._notices.bind(self._supervisor)

    # -- helpers --------------------------------------------------------------------

    def activation(self, child_id: SessionId | str) -> Activation | None:
        """The resident Activation of ``child_id`` (None when absent)."""
        try:
            return self._activations.get(SessionId(child_id))
        except SubagentError:
            return None

    def activations(self) -> list[Activation]:
        with self.lock:
            return list(self._activations.values())

    def _activation_of(self, agent: Agent) -> Activation | None:
        act = self._activations.get(agent.session_id)
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
            act = self._activation_of(agent)
            if act is not None:
                return (*chain, *act.lineage)
            above = agent.parent_session
            up = self._runtime.agents.get(above) if above is not None else None
            if up is None or up in chain:
                return tuple(chain)
            chain.append(up)
            agent = up

    def _closed_below(self, lineage: Sequence[Agent]) -> bool:
        agents = self._runtime.agents
        for agent in lineage:
            cut = self._cutoffs.get(agent.session_id)
            if cut is agent and agents.is_live(agent):
                return True
        return False

    def _ask(self, message: Any) -> Any:
        return self._registry.ask(message)

    def _require_agents(self) -> None:
        if getattr(self._runtime, "agents", None) is None:
            raise _err(
                ErrorCode.AGENT_REGISTRY_UNAVAILABLE, "continuable children need the agent registry"
            )

    # -- admission (runs in the registry actor) --------------------------------------

    def _on_reserve(self, msg: _Reserve) -> Any:
        with self.lock:
            lineage = self._lineage(msg.parent)
            if self._closed_below(lineage):
                raise _err(
                    ErrorCode.ADMISSION_CLOSED, "admission is closed below this parent (drained)"
                )
            act = self._activations.get(msg.child_id)
            if act is not None and not act.settling:
                return act
            pending = self._reservations.get(msg.child_id) or self._settling.get(msg.child_id)
            if pending is not None:
                return (
                    "wait",
                    pending.done if isinstance(pending, _Reservation) else pending.released,
                )
            parent_act = self._activation_of(msg.parent)
            if parent_act is not None:
                parent_act.admissions += 1  # keeps the parent resident while we materialize
            reservation = _Reservation(msg.child_id, msg.parent, lineage, parent_act, _Latch())
            self._reservations[msg.child_id] = reservation
            return reservation

    def _end_reservation(self, reservation: _Reservation) -> None:
        self._reservations.pop(reservation.child_id, None)
        if reservation.parent_activation is not None:
            reservation.parent_activation.admissions -= 1
            # The parent may settle now (a rolled-back child left it idle).
            self._notices.quiescent(reservation.parent_activation)
        reservation.done.set()

    def _on_abandon(self, msg: _Abandon) -> None:
        with self.lock:
            self._end_reservation(msg.reservation)

    def _on_publish(self, msg: _Publish) -> Activation:
        r = msg.reservation
        agents = self._runtime.agents
        with self.lock:
            try:
                # The final admission: no wait between this check and the delivery.
                if not agents.is_live(r.parent) or msg.agent.parent_session != r.parent.session_id:
                    raise _err(
                        ErrorCode.UNAUTHORIZED,
                        "the parent is no longer the exact live direct parent",
                    )
                # A registration disposed during the materialization: its revocation
                # found no resident child, so it is undone here, before the first turn.
                for registration in [
                    reg for reg in msg.agent._setup_releases if reg not in self._setups
                ]:
                    self._release_one(msg.agent, registration)
                act = Activation(
                    msg.agent,
                    parent_session=r.parent.session_id,
                    parent_activation=r.parent_activation,
                    lineage=r.lineage,
                    provider=msg.descriptor.provider,
                    run_id=new_run_id(),
                    released=_Latch(),
                )
                act.draining = self._closed_below(r.lineage)
                self._activations[r.child_id] = act
                if r.parent_activation is not None:
                    r.parent_activation.owned.add(r.child_id)
                msg.agent._deliver(msg.content, msg.source, "message", (), None, msg.message_id)
            finally:
                self._end_reservation(r)
        agent = msg.agent
        agent.add_idle_listener(lambda _a: self._on_idle(act))
        if agent.idle:  # its turn may have ended before the listener was added
            self._notices.quiescent(act)
        agent.add_dispose_listener(lambda _a: self._notices.released(act))
        self._emit_epoch("subagent/start", act, None)
        if act.draining:
            agent.cancel("drained", keep_inbox=False)
        return act

    def _on_idle(self, act: Activation) -> None:
        # A waiting Activation (it owns children) cannot settle on its own going
        # idle: the release of its last child re-evaluates it. Skipping the message
        # keeps a busy parent's turn loop free of supervisor traffic.
        if not act.owned or act.draining:
            self._notices.quiescent(act)

    def _on_cutoff(self, msg: _Cutoff) -> tuple[list[Activation], list[Any]]:
        with self.lock:
            for parent in msg.parents:
                self._cutoffs[parent.session_id] = parent
            forest = [
                a for a in self._activations.values() if any(p in a.lineage for p in msg.parents)
            ]
            for act in forest:
                act.draining = True
            # Already settling (say, just published and discarded): not released yet.
            forest += [
                a for a in self._settling.values() if any(p in a.lineage for p in msg.parents)
            ]
            pending = [
                r.done
                for r in self._reservations.values()
                if any(p in r.lineage for p in msg.parents)
            ]
        return forest, pending

    # -- supervisor hooks ----------------------------------------------------------

    def begin_settle(self, activation: Activation) -> None:
        if self._activations.get(activation.child_id) is activation:
            del self._activations[activation.child_id]
        self._settling[activation.child_id] = activation

    def keep_warm(self, activation: Activation) -> bool:
        """Supervisor hook (registry lock held): hold a settled, idle Activation resident
        until ``keep_warm`` seconds after its agent last went idle."""
        delay = self.keep_warm_seconds
        if delay <= 0 or activation.draining or self._closing:
            return False
        if time.monotonic() - activation.agent.idle_since >= delay:
            return False
        if delay != float("inf"):
            self._warm[activation.child_id] = activation
            if self._sweeper is None:
                self._sweeper = self._runtime.backend.spawn(self._sweep, name="subagents-keep-warm")
            else:
                self._sweeper_wake.set()
        return True

    def _sweep(self) -> None:
        """Re-offer warm Activations to the supervisor once their delay has passed."""
        while True:
            with self.lock:
                if self._closing or not self._warm:
                    self._sweeper = None
                    return
                now = time.monotonic()
                due, soonest = [], self.keep_warm_seconds
                for cid, act in list(self._warm.items()):
                    left = self.keep_warm_seconds - (now - act.agent.idle_since)
                    if act.settling or self._activations.get(cid) is not act:
                        del self._warm[cid]
                    elif left <= 0 or not act.agent.idle:
                        del self._warm[cid]
                        if act.agent.idle:
                            due.append(act)
                    else:
                        soonest = min(soonest, left)
            for act in due:
                self._notices.quiescent(act)
            self._sweeper_wake.wait(max(0.001, soonest))
            self._sweeper_wake.clear()

    def dispose_async(self, activation: Activation) -> None:
        agent = activation.agent
        agent._checkpoint_on_stop = True
        agent.dispose(wait=False)

    def on_released(self, activation: Activation) -> None:
        self._release_setups(activation.agent)
        with self.lock:
            if self._activations.get(activation.child_id) is activation:
                del self._activations[activation.child_id]
            if self._settling.get(activation.child_id) is activation:
                del self._settling[activation.child_id]
        self._emit_epoch(
            "subagent/end", activation, "cancelled" if activation.draining else "completed"
        )
        activation.released.set()

    def _emit_epoch(self, kind: str, act: Activation, stop_reason: str | None) -> None:
        event = SubagentEvent(
            type=kind,
            provider=act.provider,
            run_id=act.run_id,
            local=True,
            parent_session=act.parent_session,
            child_id=str(act.child_id),
            mode="continuable",
            stop_reason=stop_reason,
        )
        self._runtime.subagents._emit(event, act.parent_session)

    # -- start_continuable ------------------------------------------------------------

    def start_continuable(self, spec: ContinuableStartSpec) -> ContinuableHandle:
        runtime = self._runtime
        self._validate_spec(spec)
        self._require_agents()
        parent = spec.parent
        signal = spec.signal or AbortSignal.never()
        if runtime.sessions.persistence is None:
            raise _err(
                ErrorCode.PERSISTENCE_UNAVAILABLE, "start_continuable needs session persistence"
            )
        provider = runtime.subagents.get_provider(spec.provider)
        if provider is None:
            raise _err(ErrorCode.PROVIDER_NOT_FOUND, f"no provider named {spec.provider!r}")
        prepare = getattr(provider, "prepare_continuable", None)
        if not callable(prepare):
            raise _err(
                ErrorCode.CONTINUABLE_UNSUPPORTED,
                f"provider {spec.provider!r} cannot create continuable children",
            )
        if not runtime.agents.is_live(parent):
            raise _err(ErrorCode.UNAUTHORIZED, "the parent is not a live agent")
        signal.raise_if_aborted()
        options, depth = child_options(
            parent,
            model=spec.model,
            persona=spec.persona,
            tool_filter=spec.tool_filter,
            max_depth=None,
        )
        runtime.models.require(options.model)
        descriptor = snapshot_subagent_descriptor(
            ContinuableDescriptor(
                provider=provider.name,
                label=spec.label,
                agent_provider=options.provider,
                model=options.model,
                persona=options.persona,
                tool_filter=options.tool_filter,
            )
        )
        assert isinstance(descriptor, ContinuableDescriptor)
        child_id = _new_child_id()
        reservation = self._reserve(child_id, parent, signal)
        agent: Agent | None = None
        try:
            create = prepare(spec)
            if not isinstance(create, ContinuableCreateSpec):
                raise _err(
                    ErrorCode.INTERNAL, f"prepare_continuable returned {type(create).__name__}"
                )
            seed = tuple(create.seed or ())
            header = SessionHeader(
                id=child_id,
                parent_session=parent.session_id,
                origin="subagent",
                delegation_depth=depth,
                created_at=runtime.clock(),
                label=spec.label,
                seed_len=len(seed),
            )
            agent = runtime.agents.create(
                header=header, options=options, seed=(*seed, descriptor_event(descriptor))
            )
            agent._descriptor = descriptor
            self._install_setups(agent)
            signal.raise_if_aborted()
            message_id = new_message_id()
            source = (
                spec.source
                if isinstance(spec.source, MessageSource)
                else MessageSource(kind="parent", session_id=parent.session_id)
            )
            self._ask(_Publish(reservation, agent, descriptor, spec.prompt, source, message_id))
        except BaseException:
            self._rollback(reservation, agent, delete=True)
            raise
        return ContinuableHandle(child_id, message_id)

    def _validate_spec(self, spec: Any) -> None:
        if not isinstance(spec, ContinuableStartSpec):
            raise _err(
                ErrorCode.INVALID_ARGUMENT,
                f"start_continuable takes a ContinuableStartSpec, got {type(spec).__name__}",
            )
        if not isinstance(spec.parent, Agent):
            raise _err(ErrorCode.INVALID_ARGUMENT, "spec.parent must be an Agent")
        if type(spec.provider) is not str:
            raise _err(ErrorCode.INVALID_ARGUMENT, "spec.provider must be a provider name")
        if type(spec.label) is not str or not spec.label.strip():
            raise _err(ErrorCode.DESCRIPTOR_INVALID, "a continuable child needs a non-empty label")
        if spec.signal is not None and not isinstance(spec.signal, AbortSignal):
            raise _err(ErrorCode.INVALID_ARGUMENT, "spec.signal must be an AbortSignal")
        for name in ("model", "persona"):
            value = getattr(spec, name)
            if value is not None and type(value) is not str:
                raise _err(ErrorCode.INVALID_ARGUMENT, f"spec.{name} must be a str or None")
        from ._service import check_tool_filter

        check_tool_filter(spec.tool_filter)
        packb(spec.prompt)

    def _reserve(self, child_id: SessionId, parent: Agent, signal: AbortSignal) -> _Reservation:
        """Reserve a materialization, waiting out one already in flight."""
        while True:
            signal.raise_if_aborted()
            answer = self._ask(_Reserve(child_id, parent))
            if isinstance(answer, _Reservation):
                return answer
            if isinstance(answer, Activation):
                raise _ResidentNow(answer)
            _, latch = answer
            AbortSignal.any(latch.signal, signal).wait(30.0)  # the caller may give up

    def _install_setups(self, agent: Agent) -> None:
        """Install every registered contribution into the unpublished scope."""
        scope = ContinuableScope(agent)
        with self.lock:
            registrations = list(self._setups)
        for registration in registrations:
            release = registration.contribution(scope)
            agent._setup_releases[registration] = release if callable(release) else _noop

    @staticmethod
    def _release_one(agent: Agent, registration: Any) -> None:
        release = agent._setup_releases.pop(registration, None)
        if release is not None:
            try:
                release()
            except Exception:
                logger.exception("revoking a setup contribution failed")

    @staticmethod
    def _release_setups(agent: Agent) -> None:
        releases = list(agent._setup_releases.values())
        agent._setup_releases.clear()
        for release in reversed(releases):
            try:
                release()
            except Exception:
                logger.exception("releasing a setup contribution of %s failed", agent.session_id)

    def _rollback(self, reservation: _Reservation, agent: Agent | None, *, delete: bool) -> None:
        """Undo a materialization that did not publish: nothing of it may remain."""
        if agent is not None:
            act = self._activations.get(agent.session_id)
            if act is None or act.agent is not agent:
                self._release_setups(agent)
                agent.dispose(flush=False)
                if delete:
                    self._runtime.sessions.discard(agent._session)
        with self.lock:
            still_reserved = self._reservations.get(reservation.child_id) is reservation
        if still_reserved:
            self._ask(_Abandon(reservation))

    # -- follow-up ---------------------------------------------------------------

    def followup(
        self, parent: Agent, child_id: Any, content: Any, *, source: Any = None, signal: Any = None
    ) -> MessageId:
        runtime = self._runtime
        if not isinstance(parent, Agent):
            raise _err(ErrorCode.INVALID_ARGUMENT, "parent must be an Agent")
        cid = child_id if type(child_id) is SessionId else SessionId(child_id)
        if source is not None and not isinstance(source, MessageSource):
            raise _err(ErrorCode.INVALID_ARGUMENT, "source must be a MessageSource")
        if signal is not None and not isinstance(signal, AbortSignal):
            raise _err(ErrorCode.INVALID_ARGUMENT, "signal must be an AbortSignal")
        if not _plain(content):
            packb(content)
        if signal is None:
            signal = _NEVER
        else:
            signal.raise_if_aborted()
        src = source if source is not None else parent._parent_source
        message_id = new_message_id()
        # The resident fast path first: it checks the parent's liveness under the
        # lock itself, so the common case pays for that check once.
        if self._deliver_resident(parent, cid, content, src, message_id):
            return message_id
        self._require_agents()
        if not runtime.agents.is_live(parent):
            raise _err(ErrorCode.UNAUTHORIZED, "the caller is not a live agent")
        for _ in range(100):
            try:
                return self._cold_followup(parent, cid, content, src, message_id, signal)
            except _ResidentNow:
                pass
            if self._deliver_resident(parent, cid, content, src, message_id):
                return message_id
        raise _err(ErrorCode.INTERNAL, f"could not route a follow-up to {cid}")

    def _deliver_resident(
        self,
        parent: Agent,
        cid: SessionId,
        content: Any,
        source: MessageSource,
        message_id: MessageId,
    ) -> bool:
        """Enqueue into a resident child's inbox; False when it is not resident.

        The hot path of every follow-up: authority, the drain cutoff and the
        enqueue happen under the one lock that publication and settling take, so
        the child cannot settle between the check and the enqueue.
        """
        with self.lock:
            act = self._activations.get(cid)
            if act is None or act.settling:
                return False
            agent = act.agent
            header = agent._session.header
            if (
                header.origin != "subagent"
                or header.parent_session != parent.session_id
                or not self._runtime.agents.is_live(parent)  # again: it may have gone since
            ):
                raise _err(
                    ErrorCode.UNAUTHORIZED, "only the exact live direct parent may follow up"
                )
            if act.draining or (self._cutoffs and self._closed_below(self._lineage(parent))):
                raise _err(
                    ErrorCode.ADMISSION_CLOSED, "admission is closed below this parent (drained)"
                )
            agent._deliver(content, source, "message", (), None, message_id)
            return True

    def _authorize_parent(self, parent: Agent, header: SessionHeader) -> None:
        if (
            header.origin != "subagent"
            or header.parent_session != parent.session_id
            or not self._runtime.agents.is_live(parent)
        ):
            raise _err(ErrorCode.UNAUTHORIZED, "only the exact live direct parent may follow up")

    def _cold_followup(
        self,
        parent: Agent,
        cid: SessionId,
        content: Any,
        source: MessageSource,
        message_id: MessageId,
        signal: AbortSignal,
    ) -> MessageId:
        runtime = self._runtime
        sessions = runtime.sessions
        header = sessions.header(cid)
        if header is None:
            if sessions.persistence is None:  # an absent child can only be in persistence
                raise _err(
                    ErrorCode.PERSISTENCE_UNAVAILABLE, "cold resume needs session persistence"
                )
            raise _err(ErrorCode.SESSION_NOT_FOUND, f"no session {cid}")
        self._authorize_parent(parent, header)  # before any reconstruction
        if sessions.persistence is None:
            raise _err(ErrorCode.PERSISTENCE_UNAVAILABLE, "cold resume needs session persistence")
        reservation = self._reserve(cid, parent, signal)
        agent: Agent | None = None
        try:
            agent, descriptor = runtime.agents._resume_continuable(cid)
            self._install_setups(agent)
            signal.raise_if_aborted()
            self._ask(_Publish(reservation, agent, descriptor, content, source, message_id))
        except BaseException:
            self._rollback(reservation, agent, delete=False)
            raise
        return message_id

    # -- interrupt ----------------------------------------------------------------

    def interrupt(self, target: Any, authority: Any) -> None:
        tid = SessionId(target)
        if not isinstance(authority, (UserAuthority, AncestorAuthority)):
            raise _err(
                ErrorCode.INVALID_ARGUMENT, "authority is a UserAuthority or an AncestorAuthority"
            )
        with self.lock:
            act = self._activations.get(tid)
            if act is None or act.settling:
                return  # an absent target is an accepted no-op
            if isinstance(authority, UserAuthority):
                try:
                    ok = SessionId(authority.parent_session_id) == act.parent_session
                except SubagentError:
                    ok = False
                kind, by = "user", act.parent_session if ok else None
            else:
                agent = authority.agent
                ok = (
                    isinstance(agent, Agent)
                    and agent is not act.agent
                    and any(agent is a for a in act.lineage)
                    and self._runtime.agents.is_live(agent)
                )
                kind, by = "ancestor", agent.session_id if ok else None
            if not ok:
                raise _err(ErrorCode.UNAUTHORIZED, "not authorized to interrupt this child")
            target_agent = act.agent
        target_agent.cancel("interrupted", keep_inbox=True)
        with contextlib.suppress(SubagentError):  # the child left residency meanwhile
            self._runtime.sessions.append(
                target_agent._session,
                (
                    InterruptEvent(
                        at=self._runtime.clock(), cause="interrupted", authority=kind, by_session=by
                    ),
                ),
            )

    # -- reports -------------------------------------------------------------------

    def report_from(
        self, child: Any, content: Any, *, delivery: str = "quiet", signal: Any = None
    ) -> MessageId:
        if not isinstance(child, Agent):
            raise _err(ErrorCode.INVALID_ARGUMENT, "child must be an Agent")
        if delivery not in ("quiet", "waking"):
            raise _err(ErrorCode.INVALID_ARGUMENT, "delivery is 'quiet' or 'waking'")
        if signal is not None and not isinstance(signal, AbortSignal):
            raise _err(ErrorCode.INVALID_ARGUMENT, "signal must be an AbortSignal")
        packb(content)
        (signal or AbortSignal.never()).raise_if_aborted()
        agents = self._runtime.agents
        with self.lock:
            act = self._activations.get(child.session_id)
            if act is None or act.agent is not child or act.settling or not agents.is_live(child):
                raise _err(
                    ErrorCode.UNAUTHORIZED, "only an exact live continuable child may report"
                )
            parent = agents.get(act.parent_session)
            if parent is None or not agents.is_live(parent):
                raise _err(ErrorCode.UNAUTHORIZED, "the direct parent is not live")
            parent_act = self._activations.get(parent.session_id)
            if parent_act is not None and (parent_act.settling or parent_act.agent is not parent):
                raise _err(ErrorCode.UNAUTHORIZED, "the direct parent is leaving residency")
            source = MessageSource(kind="child", session_id=child.session_id)
            message_id = new_message_id()
            if delivery == "quiet":
                parent._inject_quiet(content, source, message_id)
            else:
                parent._deliver(content, source, "report", (), None, message_id)
            return message_id

    # -- setup contributions ---------------------------------------------------------

    def register_continuable_setup(self, contribution: Any) -> SetupRegistration:
        if not callable(contribution):
            raise _err(ErrorCode.INVALID_ARGUMENT, "a setup contribution is callable(scope)")
        registration = SetupRegistration(self, contribution)
        with self.lock:
            self._setups.append(registration)
        return registration

    def _remove_setup(self, registration: SetupRegistration) -> None:
        with self.lock:
            if registration not in self._setups:
                return
            self._setups.remove(registration)
            resident = list(self._activations.values()) + list(self._settling.values())
        for act in resident:
            release = act.agent._setup_releases.pop(registration, None)
            if release is not None:
                try:
                    release()
                except Exception:
                    logger.exception("revoking a setup contribution failed")

    # -- drain -------------------------------------------------------------------

    def drain(self, parents: Any, timeout: float | None = 60.0) -> None:
        agents = self._runtime.agents
        parent_list = tuple(parents) if not isinstance(parents, Agent) else (parents,)
        for p in parent_list:
            if not isinstance(p, Agent) or not agents.is_live(p):
                raise _err(ErrorCode.UNAUTHORIZED, "drain takes exact live agents")
            if self._activation_of(p) is not None:
                raise _err(
                    ErrorCode.INVALID_ARGUMENT, "drain takes host-owned (non-continuable) parents"
                )
        for p in parent_list:
            p.add_dispose_listener(self._end_cutoff)
        forest, pending = self._ask(_Cutoff(parent_list))
        for act in sorted(forest, key=lambda a: a.depth):  # top-down
            act.agent.cancel("drained", keep_inbox=False)
        for event in pending:
            event.wait(timeout)
        forest2, _ = self._ask(_Cutoff(parent_list))
        known = {id(a) for a in forest}
        fresh = [a for a in forest2 if id(a) not in known]  # published since the cutoff
        for act in sorted(fresh, key=lambda a: a.depth):
            act.agent.cancel("drained", keep_inbox=False)
        everything = {id(a): a for a in (*forest, *fresh)}
        for act in everything.values():
            # A running agent reports its own idleness (draining Activations always
            # do); only the ones idle already need a nudge.
            if act.agent.idle:
                self._notices.quiescent(act)
        for act in everything.values():
            if not act.released.wait(timeout):
                raise _err(
                    ErrorCode.TIMEOUT, f"draining {act.child_id} did not finish in {timeout} s"
                )

    def _end_cutoff(self, agent: Agent) -> None:
        with self.lock:
            if self._cutoffs.get(agent.session_id) is agent:
                del self._cutoffs[agent.session_id]

    # -- shutdown ------------------------------------------------------------------

    def close(self) -> None:
        """Stop the keep-warm sweeper and the registry and supervisor actors."""
        with self.lock:
            self._closing = True
            sweeper = self._sweeper
        self._sweeper_wake.set()
        if sweeper is not None:
            sweeper.join(30)
        for ref in (self._registry, self._supervisor):
            try:
                ref.stop(block=True, timeout=30)
            except Exception:
                logger.exception("stopping %r failed", ref)


def _noop() -> None:
    return None


_NEVER = AbortSignal.never()


class _ResidentNow(Exception):
    """Raised internally when a materialization finds the child resident after all."""

    def __init__(self, activation: Activation) -> None:
        super().__init__("resident")
        self.activation = activation


def _new_child_id() -> SessionId:
    return new_session_id()


_REGISTRY_CLASSES: dict[type[pykka.Actor], type[pykka.Actor]] = {}


def _registry_actor_class(base: type[pykka.Actor]) -> type[pykka.Actor]:
    cls = _REGISTRY_CLASSES.get(base)
    if cls is None:

        class _Registry(base):  # type: ignore[valid-type,misc]
            def __init__(self, manager: ContinuationManager) -> None:
                super().__init__()
                self._manager = manager

            def on_receive(self, message: Any) -> Any:
                m = self._manager
                if isinstance(message, _Reserve):
                    return m._on_reserve(message)
                if isinstance(message, _Publish):
                    return m._on_publish(message)
                if isinstance(message, _Abandon):
                    return m._on_abandon(message)
                if isinstance(message, _Cutoff):
                    return m._on_cutoff(message)
                raise TypeError(f"unexpected message {message!r}")

        _Registry.__name__ = f"Registry[{base.__name__}]"
        cls = _REGISTRY_CLASSES[base] = _Registry
    return cls
