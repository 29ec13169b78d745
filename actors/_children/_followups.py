"""Follow-ups to continuable children: the caller's side (see :mod:`._continuation`).

The common case -- a resident child -- is decided without a round trip: the
registry's published index and the Activation's phase route it, the child's own
gate admits it (and, under strict durability, the store commits it first, taken
by the child's activation). Anything else -- an absent, materializing or
settling child -- is committed taken by nobody (strict) and routed through the
registry, which delivers it or has the child cold-resumed with it.

A child's ``max_inbox`` (its session header) bounds every path: the store counts
a committed follow-up, the child's gate one that nothing committed. A follow-up
the store refuses for a full inbox of a child not resident here wakes the child
(the messages filling it may be waiting for nobody: left by a process that
ended), as a follow-up by the parent's id does (:mod:`._remote`).

Under relaxed durability, and on a memory store, a ``message_id`` is
deduplicated in memory (``sessions.once``): one acceptance of an id at a time is
under way here (the session service's ``Underway`` table, shared with a
top-level agent's follow-ups and with reports), so a repeat learns the first
one's outcome -- accepted (a duplicate), or refused (the repeat is tried itself).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Mapping
from typing import Any

from subagents.actors._agents import Agent, AgentRegistry, Steered, check_steer, kept, plain
from subagents.actors._kernel import AbortSignal
from subagents.protocol import (
    ErrorCode,
    InboxFullError,
    MessageId,
    MessageSource,
    SessionHeader,
    SessionId,
    SubagentError,
    check_source,
    check_value,
    new_message_id,
    trusted_message,
)
from subagents.supervision import Activation, Phase

from ._chains import Chains
from ._child import ChildContext
from ._intake import DONE, accept_resident, steer_followup
from ._materialize import Materializer
from ._placed import PlacedChild
from ._placement import followup_placed
from ._requests import Delivery, Request
from ._validate import bad, check_signal

__all__ = ["Followups"]

logger = logging.getLogger("subagents")

_NEVER = AbortSignal.never()
# Read once: an Enum member read off its class costs ~0.1 us in CPython 3.11, and
# the resident follow-up path compares it per message.
_RESIDENT = Phase.RESIDENT


class Followups:
    """Mixed into :class:`~._continuation.ContinuationManager` (which provides the
    members below)."""

    _ctx: ChildContext
    _index: Mapping[SessionId, Activation]
    _materializer: Materializer
    chains: Chains

    def require_agents(self) -> AgentRegistry:
        raise NotImplementedError

    # -- follow-up ---------------------------------------------------------------------

    def followup(
        self,
        parent: Agent,
        child_id: Any,
        content: Any,
        *,
        source: Any = None,
        signal: Any = None,
        message_id: Any = None,
        steer: Any = False,
    ) -> MessageId | Steered:
        """See :meth:`SubagentService.followup` (``parent`` is the live Agent)."""
        if not isinstance(parent, Agent):
            raise bad("parent must be an Agent")
        strict_steer = None if steer is False else check_steer(steer)
        cid = child_id if type(child_id) is SessionId else SessionId(child_id)
        if source is not None:
            if not isinstance(source, MessageSource):
                raise bad("source must be a MessageSource")
            check_source(source)
        check_signal(signal)
        if not plain(content):
            check_value(content)  # refuse what the log cannot hold before anything is accepted
        if signal is None:
            signal = _NEVER
        else:
            signal.raise_if_aborted()
        src = source if source is not None else parent.parent_source
        agents = self.require_agents()
        delivery = Delivery(content, src, new_message_id())
        run: Callable[..., MessageId | Steered] = self._followup
        if strict_steer is not None:  # steering: see _intake.steer_followup
            run = functools.partial(steer_followup, self._index, self._followup, strict_steer)
        if message_id is None:
            return run(agents, parent, cid, delivery, signal)
        delivery.message_id = mid = MessageId(message_id)
        sessions = self._ctx.sessions
        if sessions.strict:  # the store deduplicates
            return run(agents, parent, cid, delivery, signal)
        # A repeat of an id under way waits for its outcome: a claim made before
        # the follow-up is accepted (a full inbox, a failed resume) may be given back.
        return sessions.once(
            cid,
            mid,
            lambda: run(agents, parent, cid, delivery, signal),
            lambda: mid if strict_steer is None else Steered(mid, "duplicate"),
            signal,
        )

    def followup_plain(self, parent: Agent, child_id: Any, content: Any) -> MessageId:
        """:meth:`followup` with no ``source``, ``signal``, ``message_id`` or steering,
        from a live :class:`Agent`, on a runtime that does not trace: the common
        case. A resident child under relaxed durability admits it with no
        :class:`Delivery` built, its authority decided from published state (no
        call into the registry); anything else takes the general path."""
        cid = child_id if type(child_id) is SessionId else SessionId(child_id)
        if not plain(content):
            check_value(content)
        mid = new_message_id()
        act = self._index.get(cid)
        ctx = self._ctx
        if act is not None and act.phase is _RESIDENT and not ctx.sessions.strict:
            agent = act.agent
            header = agent._session.header
            _authorize(parent, header, ctx.agents)
            src = parent._parent_source_cache or parent.parent_source
            if agent.admit_followup(content, src, mid, False, header.max_inbox):
                return mid
        return self._followup(
            self.require_agents(), parent, cid, Delivery(content, parent.parent_source, mid), _NEVER
        )

    def _followup(
        self,
        agents: AgentRegistry,
        parent: Agent,
        cid: SessionId,
        delivery: Delivery,
        signal: AbortSignal,
    ) -> MessageId:
        # The resident path: the registry's index and phase route it, the
        # child's gate admits it (followup_plain is this path's common case). One
        # committed already (a steer's, its child retiring) is routed as it is.
        act = self._index.get(cid)
        if act is not None and act.phase is Phase.RESIDENT and not delivery.committed:
            agent = act.agent
            header = agent.header
            _authorize(parent, header, agents)
            sessions = self._ctx.sessions
            if not sessions.strict:
                mid = delivery.message_id
                if agent.admit_followup(
                    delivery.content, delivery.source, mid, False, header.max_inbox
                ):
                    return mid
            elif type(agent) is PlacedChild:
                if followup_placed(sessions, agent, delivery):
                    return delivery.message_id
            elif accept_resident(sessions, agent, delivery) == DONE:
                return delivery.message_id
        return self._slow_followup(agents, parent, cid, delivery, signal)

    def _slow_followup(
        self,
        agents: AgentRegistry,
        parent: Agent,
        cid: SessionId,
        delivery: Delivery,
        signal: AbortSignal,
    ) -> MessageId:
        try:
            return self._route_followup(agents, parent, cid, delivery, signal)
        except BaseException as exc:
            # Committed on the fast path (the child was retiring), then refused
            # before it was routed (the parent disposed meanwhile): taken back.
            if delivery.committed and kept(
                self._ctx.sessions, cid, delivery.message_id, exc, delivery.accepted_at
            ):
                return delivery.message_id
            raise

    def _route_followup(
        self,
        agents: AgentRegistry,
        parent: Agent,
        cid: SessionId,
        delivery: Delivery,
        signal: AbortSignal,
    ) -> MessageId:
        sessions = self._ctx.sessions
        if not agents.is_live(parent):
            raise _err(ErrorCode.UNAUTHORIZED, "the caller is not a live agent")
        header = sessions.header(cid)
        if header is None:
            if sessions.persistence is None:  # an absent child can only be in persistence
                raise _err(
                    ErrorCode.PERSISTENCE_UNAVAILABLE,
                    f"no live child {cid} here, and cold resume needs session persistence"
                    " (this runtime has no store)",
                )
            raise _err(ErrorCode.SESSION_NOT_FOUND, f"no session {cid}")
        _authorize(parent, header, agents)  # before any reconstruction
        if sessions.persistence is None:
            raise _err(ErrorCode.PERSISTENCE_UNAVAILABLE, "cold resume needs session persistence")
        mid = delivery.message_id
        if sessions.strict and not delivery.committed:
            # Not resident here: committed taken by nobody, before it is routed.
            event = trusted_message(mid, delivery.content, delivery.source)
            try:
                (accepted,) = sessions.accept(cid, (event,), limit=header.max_inbox)
            except InboxFullError:
                self._wake_full(parent, cid)
                raise
            if accepted.duplicate:
                delivery.duplicate = True
                return mid
            delivery.committed = True
            delivery.accepted_at = accepted.at
        act = self._materializer.route(Request(cid, parent, delivery), signal)
        if act is not None:  # absent: cold-resume it, delivering this message first
            self._materializer.resume(act, agents, delivery, signal)
        return mid

    def _wake_full(self, parent: Agent, cid: SessionId) -> None:
        """The store refused a follow-up to ``cid``, not resident here, for a full
        inbox: what fills it may wait for nobody (left by a process that ended), so
        wake whoever runs it -- the child's holder elsewhere, or the child here,
        below its live ``parent`` -- or no place would open for a caller waiting
        for room. A hint: a failure is logged, the refusal stands."""
        sessions = self._ctx.sessions
        try:
            holder = sessions.wake_address(cid)
            if holder is not None and sessions.ring(holder, cid.to_bytes()):
                return  # live in another process: its pickup runs them
            self.chains.wake([parent.session_id, cid])
        except SubagentError as exc:
            logger.debug("waking %s, whose inbox is full, failed: %s", cid, exc)


def _err(code: str, message: str) -> SubagentError:
    return SubagentError(message, code=code)


def _unauthorized_followup() -> SubagentError:
    return _err(ErrorCode.UNAUTHORIZED, "only the exact live direct parent may follow up")


def _authorize(parent: Agent, header: SessionHeader, agents: AgentRegistry) -> None:
    """``UNAUTHORIZED`` unless ``header`` is a subagent's whose parent is exactly
    ``parent``, the live registered agent of its session: a follow-up's whole
    authority, decided from published state (no call into the registry)."""
    sid = parent._session.header.id
    if (
        header.parent_session != sid
        or header.origin != "subagent"
        or parent._disposed
        or agents.live.get(sid) is not parent
    ):
        raise _unauthorized_followup()
