"""Waking a chain of settled sessions below one live here.

Messages wait in the durable inbox of a continuable child whose parent is itself
a settled subagent (a follow-up or start by the parent's id, a sweep): the chain
from the nearest ancestor live here down to the child is woken, each level
*held* -- kept from settling by an admission of its own, though idle -- until the
level below it is woken (:meth:`Chains.wake`). Under relaxed durability, where
nothing is committed for a later activation, a call naming a subagent parent by
id runs with the whole chain held, the parent too (:meth:`Chains.run_held`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from subagents.actors._agents import Agent, AgentRegistry, SessionService, wake_holder
from subagents.protocol import ErrorCode, SessionId, SubagentError
from subagents.supervision import Activation

from ._materialize import Materializer
from ._placed import PlacedChild
from ._requests import Unhold

__all__ = ["MAX_CHAIN", "WAKE_TRIES", "Chains", "resume_here"]

logger = logging.getLogger("subagents")

_T = TypeVar("_T")
#: How far up a chain of settled parents a wake climbs (a bound, not a tuning knob).
MAX_CHAIN = 64
#: How many times a wake starts again when the chain's top left residency meanwhile.
WAKE_TRIES = 3
#: How often a wake of a settled parent for its child is tried while the parent
#: keeps leaving residency (it settles at once when idle).
_HOLD_TRIES = 5


class Chains:
    """Wakes chains of settled sessions (see the module docstring): ``unhold``
    tells the registry to let a held Activation go, ``left(agent)`` is
    :meth:`ContinuationManager.left`."""

    def __init__(
        self,
        agents: Callable[[], AgentRegistry],
        materializer: Materializer,
        sessions: SessionService,
        unhold: Callable[[Any], None],
        left: Callable[[Agent], bool],
    ) -> None:
        self._agents = agents
        self._materializer = materializer
        self._sessions = sessions
        self._unhold = unhold
        self._left = left
        self._failed_wakes: set[SessionId] = set()  # warned of, not woken since

    @property
    def stranded(self) -> bool:
        """Whether some child could not be woken for what waits in its inbox (and
        was not woken since)."""
        return bool(self._failed_wakes)

    def wake(self, chain: Sequence[SessionId], *, last_try: bool = True) -> bool:
        """Run what waits in ``chain[-1]``'s durable inbox below ``chain[0]``, live
        here, through the settled sessions between (each a child of the one
        before): each is woken held -- kept from settling, though idle -- until the
        last is woken, which then keeps it resident as its owner. Errors are logged
        (a warning the first time for a child, until it is woken): the messages
        stay accepted, and the holders' sweeps look again. False when a session of
        the chain left residency meanwhile (unless ``last_try``, not logged: the
        caller tries again)."""
        held: list[Activation] = []
        target = chain[-1]
        try:
            left = self._walk(chain, held, hold_last=False)
            if left is not None:
                stand_in = held[-1].agent if held else None
                if not (
                    isinstance(stand_in, PlacedChild)
                    and stand_in.session_id == left
                    and stand_in.wake_below(target)
                ):  # (placed on a host: that host wakes the rest, below it)
                    if last_try:
                        self._unwoken(target, f"{left} left")
                    return False
            self._failed_wakes.discard(target)
        except SubagentError as exc:
            if exc.code == ErrorCode.LEASE_HELD:  # another process has it: it runs the rest
                wake_holder(self._sessions, exc, target)
            elif exc.code == ErrorCode.UNAUTHORIZED and not last_try:
                return False  # a parent of it left residency meanwhile: tried again
            else:
                self._unwoken(target, str(exc))
        finally:
            for act in held:
                self._unhold(Unhold(act))
        return True

    def with_parent(self, parent_id: SessionId, fn: Callable[[Agent], _T]) -> _T:
        """``fn(parent)`` with the parent live here (a memory store, relaxed
        durability: nothing can be committed for another process to run). A top-level
        parent is resumed from its recorded options; a subagent is woken held below its
        nearest ancestor live here, the top-level agent resumed first. Tried again when
        the parent leaves residency meanwhile (nothing was done then)."""
        agents, sessions = self._agents(), self._sessions
        for attempt in range(WAKE_TRIES):
            chain = [parent_id]
            sid = parent_id
            while agents.get(sid) is None:
                header = sessions.header(sid)
                if header is None:
                    raise SubagentError(f"no session {sid}", code=ErrorCode.SESSION_NOT_FOUND)
                if header.origin != "subagent" or header.parent_session is None:
                    resume_here(agents, sid)
                    break
                if len(chain) > MAX_CHAIN:
                    raise SubagentError(f"{parent_id} is nested too deep", code=ErrorCode.INTERNAL)
                sid = header.parent_session
                chain.append(sid)
            try:
                if len(chain) > 1:
                    return self.run_held(chain[::-1], fn)
                parent = agents.get(parent_id)
                if parent is not None:
                    return fn(parent)
            except SubagentError as exc:
                if exc.code != ErrorCode.UNAUTHORIZED or attempt == WAKE_TRIES - 1:
                    raise
                parent = agents.get(parent_id)
                if parent is not None and not self._left(parent):
                    raise  # refused for what it is, not for leaving
        raise SubagentError(f"{parent_id} kept leaving residency", code=ErrorCode.UNAUTHORIZED)

    def run_held(self, chain: Sequence[SessionId], fn: Callable[[Agent], _T]) -> _T:
        """Wake ``chain[1:]`` below ``chain[0]``, live here, each held (kept from
        settling, the last too), call ``fn`` with the last one's agent, then let
        them go: a parent by id under relaxed durability, which nothing can be
        committed for. Raises ``UNAUTHORIZED`` when one left residency meanwhile
        (nothing done: try again) and what waking raises."""
        held: list[Activation] = []
        try:
            left = self._walk(chain, held, hold_last=True)
            if left is not None:
                raise SubagentError(f"{left} left residency", code=ErrorCode.UNAUTHORIZED)
            return fn(held[-1].agent)
        finally:
            for act in held:
                self._unhold(Unhold(act))

    def _walk(
        self, chain: Sequence[SessionId], held: list[Activation], *, hold_last: bool
    ) -> SessionId | None:
        """Wake ``chain[1:]`` below ``chain[0]`` in turn, each held (the last only
        if ``hold_last``), onto ``held``; the session of the chain found no longer
        live here, or None once every one is woken."""
        agents = self._agents()
        for i in range(1, len(chain)):
            parent = agents.get(chain[i - 1])
            if parent is None or not agents.is_live(parent):
                return chain[i - 1]
            last = i == len(chain) - 1 and not hold_last
            act = self._wake_held(chain[i], parent, agents, last=last)
            if act is not None:
                held.append(act)
        return None

    def _unwoken(self, child_id: SessionId, why: str) -> None:
        # Said once per child: a sweep asks again every ttl/3 while, say, its tree
        # is drained.
        if child_id in self._failed_wakes:
            logger.debug("still cannot wake %s: %s", child_id, why)
            return
        if len(self._failed_wakes) > 10_000:
            self._failed_wakes.clear()
        self._failed_wakes.add(child_id)
        logger.warning("could not wake %s for what waits in its inbox: %s", child_id, why)

    def _wake_held(
        self, child_id: SessionId, parent: Agent, agents: AgentRegistry, *, last: bool
    ) -> Activation | None:
        """Wake ``child_id`` below ``parent``; unless ``last``, held (a few tries: it
        may be leaving residency just then)."""
        for _ in range(_HOLD_TRIES):
            act = self._materializer.wake(child_id, parent, agents, hold=not last)
            if last or act is not None:
                return act
        raise SubagentError(f"{child_id} kept leaving residency", code=ErrorCode.UNAUTHORIZED)


def resume_here(agents: AgentRegistry, parent_id: SessionId) -> Agent:
    """The parent, live here (resumed from its recorded options if it was not)."""
    try:
        return agents.resume(parent_id)
    except SubagentError as exc:
        agent = agents.get(parent_id)  # resumed here meanwhile
        if exc.code != ErrorCode.SESSION_EXISTS or agent is None:
            raise
        return agent
