"""The agent registry (``runtime.agents``): the live agent of each session.

The agent registry maps a session id to the one live :class:`Agent` for it. "Exact
live" checks in the service compare identity: a disposed agent, or an older agent
for a session that has since been resumed by another, is not live.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from subagents.actors._kernel._fork import inherited_error as inherited_runtime
from subagents.actors._kernel._fork import track as track_fork
from subagents.protocol import (
    ContinuableDescriptor,
    ErrorCode,
    Event,
    MessageId,
    MessageSource,
    SessionHeader,
    SessionId,
    SubagentError,
    TurnStart,
)

from ._adopted import Adoptions
from ._agent import Agent
from ._behaviours import Behaviour, ModelRegistry, as_behaviour
from ._claims import SessionClaims, live_here, runtime_closed
from ._host import AgentHost
from ._live import LiveSession
from ._options import AgentOptions
from ._output import check_agent_arguments
from ._resume import Restored, recorded_payload, replay_first, restore
from ._send import send_to, subagent_refused
from ._turn import Turn

__all__ = ["AgentRegistry"]

logger = logging.getLogger("subagents")


_Held = list[Callable[[], None]]  # a resume's adoption hold, handed back


def _as_session_id(value: Any) -> SessionId:
    return value if type(value) is SessionId else SessionId(value)


class AgentRegistry:
    """Live agents by session id (the seed's ``ctx.agents``; ``live`` views them). Thread-safe."""

    def __init__(
        self, host: AgentHost, models: ModelRegistry, adopted_grace: float = float("inf")
    ) -> None:
        # An agent's ``forget`` and ``released`` report here: one call, no hop.
        self._host = dataclasses.replace(host, forget=self._unregister, released=self._released)
        self._models = models
        self._lock = threading.Lock()
        self._agents: dict[SessionId, Agent] = {}
        self.live: Mapping[SessionId, Agent] = MappingProxyType(self._agents)  # read-only
        # One activation of a session at a time here, and none while its previous
        # agent is still disposing (it holds the lease until its release).
        self._claims = SessionClaims(self._host, self._lock, self._agents)
        self._closing = False  # the runtime closes: no agent is registered any more
        self.adopted = Adoptions(host.backend, adopted_grace)  # the sweep's: let go
        self._pid = os.getpid()
        track_fork(self)

    def create(
        self,
        *,
        header: SessionHeader,
        options: AgentOptions,
        behaviour: Behaviour | Callable[[Turn], Any] | None = None,
        seed: Sequence[Event] = (),
        output_schema: Any = None,
        inbox: Sequence[Event] = (),
        now: bool | None = None,
    ) -> Agent:
        """Open a new session and start its agent, registered and live.

        ``seed`` becomes the first part of the log (a fork's parent history);
        ``inbox`` messages are accepted with the session; ``now`` commits the
        session before this returns (the default under strict durability;
        ``False`` for a one-shot child, whose session is best-effort).

        Raises:
            SubagentError: ``MODEL_NOT_FOUND``, ``SESSION_EXISTS``.
        """
        built = (
            as_behaviour(behaviour)
            if behaviour is not None
            else self._models.create(options.model, options)
        )
        sid = header.id
        self._claim(sid, wait=False)
        try:
            sessions = self._host.sessions
            next_turn = sum(1 for e in seed if isinstance(e, TurnStart))
            agent = self._start(
                sessions.open(header, seed, inbox=inbox, now=now),
                built,
                options,
                next_turn,
                output_schema,
                sessions.discard,
            )
        except BaseException:
            self._claims.unclaim(sid)
            raise
        if header.parent_session is None and seed:
            agent._recorded = recorded_payload(seed)
        try:
            self._register(agent, claimed=True)  # one step: registered, claim ended
        except BaseException:
            # The runtime closed meanwhile: no actor left, and no session either
            # (the caller is told nothing was created).
            agent.dispose(flush=False)
            try:
                sessions.discard(agent.session)
            except SubagentError as exc:
                logger.warning("could not roll %s back: %s", sid, exc)
            raise
        return agent

    def resume(
        self,
        session_id: SessionId | str,
        *,
        behaviour: Behaviour | Callable[[Turn], Any] | None = None,
        options: AgentOptions | None = None,
        output_schema: Any = None,
        damaged: str = "refuse",
    ) -> Agent:
        """Rebuild a persisted agent from its log and make it live again.

        A subagent's options come from its folded descriptor (model, provider,
        persona, tool filter); a top-level agent from its recorded options, or
        ``options`` / ``behaviour``. Messages it accepted and never ran -- a crash,
        say -- run now, first, in acceptance order (see :mod:`._resume`).

        ``damaged="skip"`` resumes a session whose log holds events that do not
        decode around them (they stay in the store; ``agent.damaged_seqs`` names
        them): how a user reaches the children of a parent whose log was damaged.
        The default refuses with ``CORRUPT_RECORD``.

        One activation of a session at a time here: a resume, send or follow-up
        activating the same session meanwhile is waited for, and so is the
        disposal of its previous agent (``dispose(wait=False)`` releases the
        session later), up to 30 seconds each. One this runtime's sweep adopted is
        returned live, the caller's from now on (see ``Runtime(adopted_grace=)``);
        given ``behaviour``, ``options`` or ``output_schema``, it is the caller's too
        but ``SESSION_EXISTS`` (the live agent runs without them).

        Raises:
            SubagentError: ``PERSISTENCE_UNAVAILABLE``, ``SESSION_NOT_FOUND``,
                ``UNAUTHORIZED`` for a subagent's session (a continuable child is
                resumed through its parent, by a follow-up), ``SESSION_EXISTS``
                (already live, or resumed here meanwhile; still being activated or
                disposed after those 30 seconds), ``LEASE_HELD`` (live in another process),
                ``CORRUPT_RECORD``, ``DESCRIPTOR_CORRUPT`` /
                ``DESCRIPTOR_UNSUPPORTED``, ``MODEL_NOT_FOUND``, ``INVALID_ARGUMENT``.
        """
        self._host.check_thread()
        sid = _as_session_id(session_id)
        check_agent_arguments(options, output_schema)
        try:
            header = self._host.sessions.header(sid)
        except SubagentError:
            header = None  # the restore says what is wrong with it
        if header is not None and header.parent_session is not None:
            raise subagent_refused(sid)
        try:
            return self._resume_top(
                sid, behaviour=behaviour, options=options, output_schema=output_schema,
                damaged=damaged,
            )  # fmt: skip
        except SubagentError as exc:
            if exc.code != ErrorCode.SESSION_EXISTS:
                raise
            agent = self.adopted.keep(sid)  # adopted here: the caller's from now on
            if agent is None or any(a is not None for a in (behaviour, options, output_schema)):
                raise
            return agent

    def resume_unasked(self, session_id: SessionId) -> Callable[[], None]:
        """:meth:`resume` for no user here (the sweep wakes a child below it), adopted, held:
        returns the hold's release (``Adoptions.adopt_held``); live here: SESSION_EXISTS."""
        held: _Held = []
        self._resume_top(session_id, held=held)
        return held[0]

    def _resume_top(self, sid: SessionId, held: _Held | None = None, **kwargs: Any) -> Agent:
        """``resume`` of a session the caller read the header of: a top-level one.
        A concurrent activation here is waited for (see :mod:`._claims`)."""
        self._claim(sid, wait=True)
        try:
            restored = self._restore(sid, **kwargs)
            # Replayed before the claim ends: a caller that waited on it and follows
            # up the agent it finds queues behind what was accepted before.
            replay_first(restored.agent, restored.pending)
            if held is not None:  # adopted under the claim: a resume waiting is handed it
                held.append(self.adopted.adopt_held(restored.agent))
        finally:
            self._claims.unclaim(sid)
        return restored.agent

    def resume_waiting(self, session_id: SessionId) -> Agent | None:
        """Activate a top-level session for the messages waiting in its inbox (the
        mail adopts a session nobody holds: :attr:`adopted`). ``None``, and nothing
        left live, when it finds none waiting (they ran meanwhile, elsewhere).

        Raises:
            SubagentError: those of :meth:`resume`.
        """
        self._claim(session_id, wait=True)
        try:
            # Looked at under the claim, before any agent is live: a message sent
            # from now on resumes the session after this claim, itself.
            if not self._host.sessions.has_work(session_id):  # (promises too)
                return None
            restored = self._restore(session_id)
            replay_first(restored.agent, restored.pending)
            # For no user here: let go once quiet (after its replay: idle before).
            self.adopted.add(restored.agent)
        finally:
            self._claims.unclaim(session_id)
        agent = restored.agent  # (a message sent since, or a user's resume, keeps it)
        return agent if restored.pending or not self.adopted.let_go(agent, wait=True) else None

    def _check_open(self) -> None:
        if self._closing:
            raise runtime_closed()

    def _claim(self, sid: SessionId, *, wait: bool) -> None:
        self._check_open()
        if self._claims.claim(sid, wait=wait) is not None:
            raise live_here(sid)
        if self._closing:  # closed since the check: its wait may have missed this claim
            self._claims.unclaim(sid)
            raise runtime_closed()

    def _restore(self, sid: SessionId, **kwargs: Any) -> Restored:
        """Restore and register ``sid``'s agent (the caller holds its claim)."""
        restored = restore(self._host, self._models, sid, start=self._start, **kwargs)
        try:
            self._register(restored.agent)
        except BaseException:
            with contextlib.suppress(SubagentError):  # (the store may be closing)
                restored.give_back()  # what it took runs at the next activation
            restored.agent.dispose(flush=False)
            raise
        return restored

    def _start(
        self,
        session: LiveSession,
        behaviour: Behaviour,
        options: AgentOptions,
        next_turn: int,
        output_schema: Any,
        undo: Callable[[LiveSession], object],
    ) -> Agent:
        """Start the agent of ``session``; ``undo(session)`` if it cannot start."""
        try:
            return Agent(
                self._host, session, behaviour, options,
                next_turn=next_turn, output_schema=output_schema,
            )  # fmt: skip
        except BaseException:
            undo(session)
            raise

    def resume_continuable(self, session_id: SessionId) -> Restored:
        """Cold-resume a continuable child from its folded descriptor alone (on the
        agent: ``_descriptor``); its pending messages are returned, for its
        publication to deliver.

        Raises:
            SubagentError: ``DESCRIPTOR_CORRUPT`` / ``DESCRIPTOR_UNSUPPORTED``,
                ``LEASE_HELD``, or ``UNAUTHORIZED`` when the session is not a
                continuable child.
        """
        # In the registry actor: a concurrent activation is refused, not waited for.
        self._claim(session_id, wait=False)
        try:
            restored = self._restore(session_id)
        finally:
            self._claims.unclaim(session_id)
        agent = restored.agent
        if not isinstance(agent._descriptor, ContinuableDescriptor):
            with contextlib.suppress(SubagentError):
                restored.give_back()
            agent.dispose(flush=False)
            raise SubagentError(
                f"session {session_id} is not a continuable child", code=ErrorCode.UNAUTHORIZED
            )
        return restored

    def close(self) -> None:
        """The runtime closes: from now on every activation -- create, resume, a
        send or follow-up that would wake a session -- is refused with
        ``RUNTIME_CLOSED``, so :meth:`list` holds every agent the close must stop."""
        with self._lock:
            self._closing = True
        self.adopted.close()  # (the close disposes every agent)

    def wait_activations(self, timeout: float) -> bool:
        """Wait for the activations begun before :meth:`close` to end (True), each
        registered or given up -- a refused one releasing its lease -- or
        ``timeout`` seconds: after, :meth:`list` holds every agent to stop."""
        return self._claims.wait_none(timeout)

    def _forked(self) -> None:
        """In the child of a fork (``_kernel/_fork.py``): the runtime's agents and
        sessions are the parent's. No lock is taken (a thread of the parent's may
        have held it) and nothing is written."""
        self._host.sessions.inherited = inherited_runtime("this Runtime", self._pid)
        for agent in list(self._agents.values()):
            agent.forked()

    def _register(self, agent: Agent, *, claimed: bool = False) -> None:
        sid = agent.session_id
        with self._lock:
            waiters = self._claims.drop(sid) if claimed else None
            closing = self._closing
            taken = not closing and sid in self._agents
            if not (taken or closing):
                self._agents[sid] = agent
        if waiters is not None:
            waiters.set()
        if closing:
            raise runtime_closed()
        if taken:
            raise live_here(sid)

    def _unregister(self, agent: Agent) -> None:
        with self._lock:
            if self._agents.get(agent.session_id) is agent:
                del self._agents[agent.session_id]
                # Disposing, perhaps without anyone waiting (a child settling): the
                # runtime's close waits for its release before closing the store.
                self._claims.left(agent)

    def _released(self, agent: Agent) -> None:
        """``agent`` finished disposing: nothing waits for it any more."""
        self._claims.released(agent)

    def wait_stopped(self, timeout: float) -> bool:
        """Wait until every agent that left the registry finished disposing (its
        session released); False when one had not after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._lock:
            stopping = list(self._claims.stopping.values())
        return all(a.wait_disposed(max(0.0, deadline - time.monotonic())) for a in stopping)

    def get(self, session_id: SessionId | str) -> Agent | None:
        """The live agent for ``session_id``, or None."""
        try:
            sid = _as_session_id(session_id)
        except SubagentError:
            return None
        return self._agents.get(sid)

    def is_live(self, agent: object) -> bool:
        """True when ``agent`` is exactly the registered agent of its session."""
        return (
            isinstance(agent, Agent)
            and self._agents.get(agent._session.header.id) is agent
            and not agent._disposed
        )

    def roots(self) -> list[SessionHeader]:
        """Every top-level session, live here or persisted, by ``(created_at, id)``.

        With a durable store this lists what any process created, so a restarted
        server finds the sessions it owns; resume one with :meth:`resume`, or
        message it with :meth:`send`.
        """
        return self._host.sessions.roots()

    def send(
        self,
        session_id: SessionId | str,
        content: Any,
        *,
        source: MessageSource | None = None,
        message_id: MessageId | str | None = None,
    ) -> MessageId:
        """Send one message to a top-level session, wherever it is live; returns its id.

        Live here: it is ``agent.followup``. Otherwise, under strict durability,
        the message is committed to the session's inbox first, then the session is
        resumed here (from its recorded options; let go once quiet, as the sweep's
        adoptions) and runs it -- or another process holding it (``LEASE_HELD``) is
        woken and runs it. On a memory store or under relaxed durability the session
        is resumed here first. ``message_id`` makes the call idempotent. Committed
        and then not run here because the runtime closes (or the store cannot take
        it back), the message stays accepted: it runs at the next activation.

        Raises:
            SubagentError: ``SESSION_NOT_FOUND``; ``UNAUTHORIZED`` for a subagent's
                session (message it through its parent); the errors of
                :meth:`resume` (the message is then taken back: nothing accepted),
                ``LEASE_HELD`` among them under relaxed durability or on a memory
                store when another process holds the session;
                ``ENCODE_ERROR``, ``INVALID_ARGUMENT``, the store's error.
        """
        self._host.check_thread()
        return send_to(
            self._host, self.get, self._resume_top, session_id, content, source, message_id,
            self.adopted.add,
        )  # fmt: skip

    def list(self) -> list[Agent]:
        """Every live agent."""
        with self._lock:
            return list(self._agents.values())

    def running_here(self) -> Agent | None:
        """The live agent whose actor is running the caller (a turn, an idle
        listener), else None: a call that waits for every agent must not come
        from one of them."""
        return next((a for a in self.list() if a._in_own_loop()), None)
