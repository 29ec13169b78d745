"""Accepted means committed, for the continuation's messages.

Under strict durability a follow-up and a continuable child's prompt
are in the target's durable inbox before the call that accepted them returns
(see :mod:`subagents.actors._agents._acceptance`). The continuation manager
commits first and delivers second; this module holds the steps around that:

* a follow-up to a child resident here is committed *taken* by the child's
  current activation (fenced by its lease), then admitted; refused because the
  child is retiring, it is given back to nobody and routed through the registry;
* a follow-up to a child that is not resident here is committed taken by nobody,
  then routed; whoever runs it records it taken first;
* when delivery fails after the commit, the message is retracted -- unless it is
  no longer ours to take back: another process holds the child (it runs the
  message from its inbox), an activation took it meanwhile, a repeat of its id
  was accepted since, the runtime closes (it runs at the next activation), or
  the store cannot take it back. Then the call returns the id: the message is
  accepted after all (``kept``).

A repeated message id is recognized by the store (strict) or by the runtime's
memory (relaxed), per target session. A continuable start is deduplicated by its
child's id, derived from the parent's id and the message id: a second start
finds the child, in this process or in the store.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

from subagents.actors._agents import (
    Agent,
    LiveSession,
    SessionService,
    Steered,
    committed_at,
    kept,
    not_open,
)
from subagents.protocol import (
    ErrorCode,
    MessageId,
    SessionId,
    SubagentError,
)
from subagents.store import Accepted
from subagents.supervision import Phase

from ._requests import Delivery

__all__ = [
    "DONE",
    "LEFT",
    "ROUTE",
    "accept_resident",
    "derived_id",
    "start_child_id",
]

logger = logging.getLogger("subagents")

#: :func:`accept_resident` verdicts.
DONE: Final = "done"  # admitted, or a duplicate: nothing more to do
ROUTE: Final = "route"  # committed, the child is retiring: route it through the registry
LEFT: Final = "left"  # not committed, the activation left: the slow path accepts it


def derived_id(person: bytes, *parts: bytes) -> SessionId:
    """A session id derived from ``parts`` (``person``: what kind of start derives it,
    so that two kinds never share an id)."""
    return SessionId(hashlib.blake2b(b"".join(parts), digest_size=16, person=person).hexdigest())


def start_child_id(parent: SessionId, message_id: MessageId) -> SessionId:
    """The id of the child a continuable start with ``message_id`` creates."""
    return derived_id(b"subagents-start", parent.to_bytes(), message_id.to_bytes())


def accept_resident(sessions: SessionService, agent: Agent, d: Delivery) -> str:
    """Commit ``d`` taken by ``agent``'s activation, then admit it (see the module
    docstring); returns :data:`DONE`, :data:`ROUTE` or :data:`LEFT`."""
    live = agent.session
    commits = agent._commits  # its release waits for this commit's admission or give-back
    if not commits.enter():
        return LEFT  # its release began: the slow path commits it for nobody
    try:
        try:  # (a commit whose answer was lost stays in doubt: see Agent._commit)
            accepted = agent._commit(d.message_id, d.content, d.source, agent.header.max_inbox)
        except SubagentError as exc:
            if exc.code == ErrorCode.LEASE_LOST:
                return LEFT
            raise
        if accepted.duplicate:
            d.duplicate = True
            return DONE
        return _admit_committed(sessions, agent, live, d, accepted)
    finally:
        commits.exit()


def _admit_committed(
    sessions: SessionService, agent: Agent, live: LiveSession, d: Delivery, accepted: Accepted
) -> str:
    """Admit ``d``, committed (``accepted``) taken by ``agent``'s activation
    ``live``: :data:`DONE`, or :data:`ROUTE` (the child is retiring: ``d`` is
    given back to nobody, committed, for the registry to route)."""
    with committed_at(sessions, agent, accepted):  # after what was committed ahead
        try:
            admitted = agent.admit_followup(d.content, d.source, d.message_id)
        except BaseException as exc:
            # Refused (drained): taken back -- unless it is not ours to take back (a
            # retraction the store could not make, a repeat of its id accepted
            # since: see kept); then it runs at the child's next activation.
            sid, mid = agent.session_id, d.message_id
            if kept(sessions, sid, mid, exc, accepted.at, live) and isinstance(exc, Exception):
                return DONE
            raise
    if admitted:
        return DONE
    # Retiring: give it back from the retiring epoch (which will not run it),
    # then route it like any message committed for an absent child.
    if live.token is not None:
        try:
            sessions.give_back(agent.session_id, (d.message_id,), live.token[1])
        except SubagentError:
            logger.warning("could not give %s back", d.message_id, exc_info=True)
    d.committed = True
    d.accepted_at = accepted.at  # (a retraction on the way leaves a repeat's since)
    return ROUTE


def steer_resident(
    sessions: SessionService, agent: Agent, d: Delivery, strict: bool
) -> Steered | None:
    """Steer ``d`` into the resident ``agent``'s open turn: a :class:`Steered`
    (``steered``, ``queued`` or ``duplicate``), or None when it should be
    followed up as usual (``queued``; ``d.committed``: routed as committed).

    Under strict durability it is committed taken by the child's activation first,
    and taken back when no turn took it. ``strict``: refuse (``TURN_NOT_OPEN``)
    instead of None, delivering nothing. A commit that cannot be taken back (see
    ``kept``) is no steer any more: it is the child's follow-up, admitted from the
    inbox row it has (``queued``, whether ``strict`` or not: committed again, it
    would be a "duplicate" that nobody runs before the child's next activation).
    """
    mid = d.message_id
    if not sessions.strict:
        if agent.steer_in(d.content, d.source, mid, continuation=True):
            return Steered(mid, "steered")
        if strict:
            raise not_open(agent.session_id)
        return None
    live = agent.session
    try:  # (a commit whose answer was lost stays in doubt: see Agent._commit)
        accepted = agent._commit(mid, d.content, d.source)
    except SubagentError as exc:
        if exc.code == ErrorCode.LEASE_LOST and not strict:
            return None  # the activation left: the usual path routes it
        raise
    if accepted.duplicate:
        return Steered(mid, "duplicate")
    sid = agent.session_id
    try:
        if agent.steer_in(d.content, d.source, mid, continuation=True):
            return Steered(mid, "steered")
    except BaseException as exc:  # refused (drained)
        if kept(sessions, sid, mid, exc, accepted.at, live) and isinstance(exc, Exception):
            return Steered(mid, "queued")  # it runs at the child's next activation
        raise
    refused = not_open(sid)  # no turn open
    if not kept(sessions, sid, mid, refused, accepted.at, live):
        if strict:
            raise refused  # taken back: nothing accepted
        return None  # taken back: the usual path commits it again (bounded)
    if _admit_committed(sessions, agent, live, d, accepted) == DONE:
        return Steered(mid, "queued")
    return None  # retiring: d is committed, the usual path routes it


def steer_followup(
    index: Mapping[SessionId, Any],
    followup: Callable[..., MessageId],
    strict: bool,
    agents: Any,
    parent: Agent,
    cid: SessionId,
    d: Delivery,
    signal: Any,
) -> Steered:
    """A parent's steering follow-up (``index``: the registry's published index):
    into the resident child's open turn, else ``followup`` as usual (``queued``) --
    a strict steer refused instead, never resuming a cold child."""
    act = index.get(cid)
    agent = act.agent if act is not None and act.phase is Phase.RESIDENT else None
    if not isinstance(agent, Agent):  # absent, or placed on another host: no open turn here
        agent = None
    if agent is None:
        if strict:
            raise not_open(cid)
    elif agent.header.parent_session == parent.session_id and agents.is_live(parent):
        steered = steer_resident(agent.host.sessions, agent, d, strict)
        if steered is not None:
            return steered
    # Not steered: the usual path (which also refuses a parent that is not the one).
    mid = followup(agents, parent, cid, d, signal)
    return Steered(mid, "duplicate" if d.duplicate else "queued")
