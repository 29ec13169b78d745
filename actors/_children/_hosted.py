"""The host's side of placement: continuable children whose parent lives elsewhere.

A host is a process with a runtime on the shared store that runs continuable
children for parents in other processes (see :mod:`._placed`). :class:`Hosting`
is what such a runtime does when asked to: activate a child from the store
(taking its lease, replaying what its durable inbox holds), pick up what was
committed since, report when it is quiet, cancel or interrupt its turn, and
release it -- its own resident children first.

A hosted child is an ordinary agent of the host runtime with no Activation
there (its parent is not here): its continuable children are Activations of the
host's registry whose lineage starts at it, and its reports go to its parent's
durable inbox, which wakes the parent wherever it is held.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from subagents.actors._agents import (
    Agent,
    AgentRegistry,
    SessionService,
    dispose_by_depth,
    replay_first,
)
from subagents.protocol import ErrorCode, InterruptEvent, SessionId, SubagentError

from ._remote import wake_child

__all__ = ["Hosting"]

logger = logging.getLogger("subagents")

#: Seconds between attempts to take a lease another process still holds (its
#: release may be on its way, or its holder died and the lease must expire).
_RETRY = 0.05


class Hosting:
    """Children placed in this runtime by parents elsewhere (see the module docstring).

    Args:
        runtime: the host's runtime (its ``agents``, ``sessions``, ``continuation``,
            ``mail`` and ``clock``).
        hosted: the dict the runtime keeps its hosted agents in (its reports read it).
        lease_wait: seconds to wait for a lease another process holds.
    """

    def __init__(self, runtime: Any, hosted: dict[SessionId, Agent], lease_wait: float) -> None:
        self._agents: AgentRegistry = runtime.agents
        self._sessions: SessionService = runtime.sessions
        self._continuation = runtime.continuation
        self._pickup: Callable[[SessionId], None] | None = (
            runtime.mail.pickup if runtime.mail is not None else None
        )
        self._clock = runtime.clock
        self._hosted = hosted
        self._lease_wait = lease_wait
        self._lock = threading.Lock()  # activations: one at a time
        # Guards the markers below and what ``_hosted`` holds against an activation
        # in progress: held only briefly, so a release, a settle or a cancel of one
        # child never waits behind another's activation (its lease wait).
        self._marks = threading.Lock()
        # The highest release (or settle) call per child (see _placed._CALLS): a
        # run asked before it and carried out after it must not hold the child again.
        self._released_at: dict[SessionId, int] = {}
        # The highest cancel call that dropped what waits, per child, with its
        # cause: a run asked before it and carried out after it drops what waits
        # instead of running it.
        self._dropped_at: dict[SessionId, tuple[int, str]] = {}
        # The highest ``(call, attempt)`` of a run its parent's placement took this
        # host for dead in, per child: that attempt, carried out late, does nothing
        # (the placement ran it on another host; a retry here is a later attempt).
        self._moved_at: dict[SessionId, tuple[int, int]] = {}
        # The ``(call, attempt)`` of the run that activated each child held here.
        self._activated_by: dict[SessionId, tuple[int, int]] = {}

    def held(self) -> list[SessionId]:
        """The children hosted here now."""
        return [sid for sid, a in list(self._hosted.items()) if not a.disposed]

    def run(
        self,
        child_id: SessionId,
        call: int | None = None,
        wake: Sequence[SessionId] = (),
        drop: tuple[int, str] | None = None,
        attempt: int = 0,
    ) -> None:
        """Hold ``child_id`` (activating it if needed), run what waits in its durable
        inbox -- and in the inboxes of ``wake``, sessions below it (woken through
        the settled ones between) -- and return once it is idle and owns no
        resident child. A run whose ``call`` is lower than a release already
        carried out does nothing; lower than a cancel that dropped what waits
        (carried out here, or ``drop``: ``(call, cause)`` of one asked of a host
        that died), it activates the child only to drop what waits. ``attempt``
        counts the hosts this run was sent to before (see :meth:`let_go`).

        Raises:
            SubagentError: ``LEASE_HELD`` (another process kept it past the wait),
                ``SESSION_NOT_FOUND``, or why it cannot be resumed here.
        """
        if drop is not None:
            with self._marks:
                self._note_drop(child_id, int(drop[0]), str(drop[1]))
        agent, dropped = self._activate(child_id, call, attempt)
        if agent is None:
            return  # asked before a release that came first: the child stays released
        if dropped is not None:  # asked before a cancel that came first
            self._drop(agent, dropped)
        elif self._pickup is not None:
            self._pickup(child_id)
            for below in wake:
                self._wake(below)
        self._quiet(agent)

    def settle(self, child_id: SessionId, call: int | None = None) -> bool:
        """Release ``child_id`` if it is quiet (True); False when it is busy. Settled
        (or found absent) as ``call``, it counts as a release: a run asked before
        it -- one its parent stopped waiting for, still on its way here or
        awaiting the child's lease -- does not hold the child afterwards."""
        with self._marks:
            agent = self._hosted.get(child_id)
            if agent is not None and not agent.disposed:
                if self._below(agent) or not agent.close_if_idle():
                    return False
            else:
                agent = None
            if call is not None:
                self._mark_released(child_id, call)
        if agent is not None:
            agent.dispose(checkpoint=True)
        return True

    def cancel(
        self, child_id: SessionId, cause: str, keep_inbox: bool, call: int | None = None
    ) -> None:
        """Cancel its running turn; ``keep_inbox=False`` also drops what waits --
        here, and what is still untaken in its durable inbox -- and, numbered
        ``call``, what a run asked before it finds when carried out after it."""
        with self._marks:  # an activation in progress reads the mark once it is done
            if not keep_inbox and call is not None:
                self._note_drop(child_id, call, cause)
            agent = self._hosted.get(child_id)
        if agent is None or agent.disposed:
            return
        if keep_inbox:
            agent.cancel(cause, keep_inbox=True)
        else:
            self._drop(agent, cause)

    def interrupt(self, child_id: SessionId, kind: str, by: SessionId | None) -> None:
        """An interrupt the parent's registry authorized: cancel the turn, keep the
        inbox, log it (an absent child: nothing to do)."""
        agent = self._hosted.get(child_id)
        if agent is None or agent.disposed:
            return
        at = self._clock()
        # Logged before the cancel: inside the turn it cuts, before that turn's end.
        event = InterruptEvent(at=at, cause="interrupted", authority=kind, by_session=by)
        with contextlib.suppress(SubagentError):  # it left residency meanwhile
            self._sessions.append(agent.session, (event,))
        agent.cancel("interrupted", keep_inbox=True)

    def release(
        self, child_id: SessionId, cause: str, timeout: float | None = 60.0, call: int | None = None
    ) -> None:
        """Cancel it (what it accepted stays accepted: it runs at its next
        activation), drain its resident children, then release it. A run asked
        before ``call`` that arrives later does not activate it again."""
        with self._marks:  # an activation in progress reads the mark once it is done
            if call is not None:
                self._mark_released(child_id, call)
            agent = self._hosted.get(child_id)
        if agent is None or agent.disposed:
            return
        self._give_up(agent, cause, timeout)

    def let_go(self, child_id: SessionId, call: int, attempt: int) -> None:
        """The parent's placement took this host for dead in attempt ``attempt`` of
        run ``call`` (Ray cannot tell a dead host from one unreachable for a while)
        and runs it elsewhere: that attempt, carried out here later, does nothing,
        and the child is released if a run up to it holds it here (a later run's
        activation stays)."""
        mark = (call, attempt)
        with self._marks:
            self._moved_at[child_id] = max(mark, self._moved_at.get(child_id, mark))
            agent = self._hosted.get(child_id)
            by = self._activated_by.get(child_id)
            if agent is None or agent.disposed or by is None or by > mark:
                return
        self._give_up(agent, "moved to another host", 60.0)

    def forget(self, children: Sequence[tuple[SessionId, int]]) -> None:
        """Each ``(child, call)``: its parent's placement asks nothing more of it
        below ``call`` (no run of a lower number is on its way): its markers up
        to ``call`` go (a later one, of the next stand-in's calls, stays)."""
        with self._marks:
            for child_id, call in children:
                if self._released_at.get(child_id, call + 1) <= call:
                    del self._released_at[child_id]
                if self._dropped_at.get(child_id, (call + 1, ""))[0] <= call:
                    del self._dropped_at[child_id]
                if self._moved_at.get(child_id, (call + 1, 0))[0] <= call:
                    del self._moved_at[child_id]

    def close(self) -> None:
        """Release every hosted child (the host stops)."""
        for sid in self.held():
            try:
                self.release(sid, "host closing")
            except SubagentError as exc:
                logger.warning("releasing %s: %s", sid, exc)

    # -- internals ---------------------------------------------------------------------

    def _note_drop(self, child_id: SessionId, call: int, cause: str) -> None:
        """(The caller holds ``_marks``.)"""
        if call > self._dropped_at.get(child_id, (0, ""))[0]:
            self._dropped_at[child_id] = (call, cause)

    def _mark_released(self, child_id: SessionId, call: int) -> None:
        """(The caller holds ``_marks``.)"""
        self._released_at[child_id] = max(call, self._released_at.get(child_id, 0))

    def _stale(self, child_id: SessionId, call: int | None, attempt: int) -> bool:
        """Whether run ``call`` was asked before a release carried out here, or is
        an attempt the placement ran elsewhere (the caller holds ``_marks``)."""
        if call is None:
            return False
        moved = self._moved_at.get(child_id)
        return call < self._released_at.get(child_id, 0) or (
            moved is not None and (call, attempt) <= moved
        )

    def _give_up(self, agent: Agent, cause: str, timeout: float | None) -> None:
        """Cancel it, keeping what it accepted, release its resident children, then it."""
        agent.cancel(cause, keep_inbox=False, keep_accepted=True)
        self._release_below(agent, cause, 60.0 if timeout is None else timeout)
        agent.dispose(checkpoint=True, timeout=timeout)

    def _drop(self, agent: Agent, cause: str) -> None:
        """Cancel its turn and drop what waits, here and untaken in its durable inbox."""
        agent.cancel(cause, keep_inbox=False)
        if self._pickup is not None:
            self._pickup(agent.session_id)  # takes what waits into the loop ...
            with contextlib.suppress(SubagentError):  # (disposed meanwhile)
                # ... where it is dropped in turn
                agent.call_in_loop(lambda: agent.cancel(cause, keep_inbox=False))

    def _release_below(self, agent: Agent, cause: str, timeout: float) -> None:
        """Release its resident descendants as a closing runtime does its agents:
        cancelled, what they accepted kept (it runs at their next activation),
        disposed child-first; then wait for their Activations' release."""
        below = [a for a in self._continuation.activations() if any(x is agent for x in a.lineage)]
        local = []
        for act in sorted(below, key=lambda a: a.depth, reverse=True):
            child = act.agent
            try:
                if isinstance(child, Agent):
                    child.cancel(cause, keep_inbox=False, keep_accepted=True)
                    local.append(child)
                else:  # placed from here in turn: its host releases it
                    child.release(cause)
            except SubagentError as exc:
                logger.warning("releasing %s below %s: %s", act.child_id, agent.session_id, exc)
        dispose_by_depth(local, timeout)
        deadline = time.monotonic() + timeout
        for act in below:
            if not act.released.wait(max(0.0, deadline - time.monotonic())):
                logger.warning("%s below %s was not released in time", act.child_id, agent)

    def _activate(
        self, child_id: SessionId, call: int | None, attempt: int = 0
    ) -> tuple[Agent | None, str | None]:
        """The child held here (activated if needed; None: asked before a release
        carried out -- before the activation, or while it awaited the lease), and
        the cause of a drop it was asked before (None: none)."""
        with self._lock:
            with self._marks:
                agent = self._hosted.get(child_id)
                if agent is not None and not agent.disposed:
                    return agent, None
                if self._stale(child_id, call, attempt):
                    return None, None
            deadline = time.monotonic() + self._lease_wait
            while True:
                try:
                    restored = self._agents.resume_continuable(child_id)
                    break
                except SubagentError as exc:
                    if exc.code != ErrorCode.LEASE_HELD or time.monotonic() > deadline:
                        raise
                time.sleep(_RETRY)
            agent = restored.agent
            agent.add_dispose_listener(self._forget)
            # The marks again: a release or a settle carried out while the lease was
            # awaited found nothing held here, and answered for this run too.
            with self._marks:
                stale = self._stale(child_id, call, attempt)
                if not stale:
                    self._hosted[child_id] = agent
                    if call is not None:
                        self._activated_by[child_id] = (call, attempt)
                    try:
                        replay_first(agent, restored.pending)
                    except BaseException:
                        restored.give_back()
                        agent.dispose(flush=False)
                        raise
                dropped = self._dropped_at.get(child_id)
            if stale:
                with contextlib.suppress(SubagentError):
                    restored.give_back()
                agent.dispose(flush=False)
                return None, None
            if call is not None and dropped is not None and call < dropped[0]:
                return agent, dropped[1]
            return agent, None

    def _wake(self, session_id: SessionId) -> None:
        """What waits for ``session_id``, below a child hosted here: woken here (its
        chain climbs to that child). Errors are logged: the messages stay
        accepted, and the sweeps look again."""
        try:
            header = self._sessions.header(session_id)
            if header is not None and header.parent_session is not None:
                wake_child(
                    self._agents, self._sessions, self._continuation, session_id,
                    header.parent_session,
                )  # fmt: skip
        except SubagentError as exc:
            logger.warning("could not wake %s below a hosted child: %s", session_id, exc)

    def _forget(self, agent: Agent) -> None:
        # (No lock: it runs as the agent stops, which a holder of _marks may await.)
        if self._hosted.get(agent.session_id) is agent:
            del self._hosted[agent.session_id]
            self._activated_by.pop(agent.session_id, None)

    def _below(self, agent: Agent) -> list[Any]:
        """Its continuable children resident here."""
        return [a for a in self._continuation.activations() if a.lineage[:1] == (agent,)]

    def _quiet(self, agent: Agent) -> None:
        while True:
            agent.wait_idle(None)
            below = self._below(agent)
            if not below:
                if agent.idle:
                    return
                continue
            for act in below:
                act.released.wait(None)
