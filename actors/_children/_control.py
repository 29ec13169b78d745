"""The caller's side of what the registry actor decides: interrupts and drains.

``interrupt``: the registry decides the authority (a user at the durable parent
address, or an ancestor) and answers with the target's live agent; the caller
cancels its turn, keeping its inbox, and logs the interrupt. A target live in
another process sharing the store is asked of its holder -- a user's interrupt
(:func:`forward_interrupt`), or an ancestor's where the target lives on another
host below a placed child (:func:`forward_ancestor_interrupt`) -- whose mail
task runs this same function with the time it was asked: the turn running then
is cut, one that began after it is not.

``drain_continuable_descendants``: the registry owns the cutoff (``Cutoff``
closes admission below the given host-owned parents and answers with their
resident forest and the latches of what is still materializing); the caller
cancels that forest top-down, asks again for what was published since, nudges
the idle ones to the supervisor, and waits for every Activation to be released
child-first. A continuable descendant another process sharing the store holds
(a parent disposed there and resumed here leaves its children running there) is
asked of its holder -- a drain ring (:func:`drain_elsewhere`), which the holder's
mail task hands to :func:`drain_asked` -- and waited for until no other live
process holds it.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import time
from collections.abc import Callable, Mapping
from typing import Any

from subagents.actors._agents import Agent, AgentRegistry, SessionService, interrupt_ring
from subagents.actors._kernel._checks import check_timeout
from subagents.protocol import ErrorCode, InterruptEvent, SessionId, SubagentError
from subagents.supervision import VISIBLE, Activation, Phase

from ._placed import PlacedChild
from ._requests import Cutoff, Interrupt, RemoteAncestor
from ._types import AncestorAuthority, UserAuthority
from ._validate import bad

__all__ = [
    "drain",
    "drain_asked",
    "drain_elsewhere",
    "forward_ancestor_interrupt",
    "forward_interrupt",
    "interrupt",
    "stored_ancestor",
]


def interrupt(
    target: Any,
    authority: Any,
    *,
    ask: Callable[[Any], Any],
    sessions: SessionService,
    clock: Callable[[], _dt.datetime],
    asked_at: float | None = None,
) -> None:
    """Cancel ``target``'s current turn if ``authority`` may (an absent target is an
    accepted no-op); ``ask`` asks the registry. ``asked_at``: another process asked
    at that time (:func:`asked_now`: the store's clock) -- a turn that began later
    is left alone.

    Raises:
        SubagentError: ``UNAUTHORIZED``, ``INVALID_ARGUMENT``.
    """
    tid = SessionId(target)
    if not isinstance(authority, (UserAuthority, AncestorAuthority, RemoteAncestor)):
        raise bad("authority is a UserAuthority or an AncestorAuthority")
    verdict = ask(Interrupt(tid, authority))
    if verdict is None:
        if asked_at is None and isinstance(authority, UserAuthority):
            forward_interrupt(sessions, tid, authority, clock)
        elif asked_at is None and isinstance(authority, AncestorAuthority):
            forward_ancestor_interrupt(sessions, tid, authority, clock)
        return
    agent, kind, by = verdict
    if isinstance(agent, PlacedChild):  # its host cancels the turn and logs it
        agent.interrupt(kind, by)
        return
    meant = None
    if asked_at is not None:
        # How long ago, on the clock both processes read (each host's own may be
        # off), at the least: a stop is better cut into the turn after the one it
        # meant than dropped, as two readings of the store's clock may differ.
        meant = agent.running_for(max(0.0, _store_now(sessions, clock, -1) - asked_at))
        if meant is None:
            return  # the turn it meant has ended
    at = clock()  # INVALID_ARGUMENT from a bad clock before anything changed
    # Logged before the cancel: inside the turn it cuts, before that turn's end.
    event = InterruptEvent(at=at, cause="interrupted", authority=kind, by_session=by)
    with contextlib.suppress(SubagentError):  # the child left residency meanwhile
        sessions.append(agent.session, (event,))
    if meant is None:
        agent.cancel("interrupted", keep_inbox=True)
    else:  # that turn alone: it may have ended, and the next begun, meanwhile
        agent.cancel_turn(meant, "interrupted")


def forward_interrupt(
    sessions: SessionService,
    target: SessionId,
    authority: UserAuthority,
    clock: Callable[[], _dt.datetime],
) -> None:
    """``target`` is not live here: when another runtime holds it, ring that holder
    with the interrupt (a hint, like every ring: returns without waiting).

    Raises:
        SubagentError: ``UNAUTHORIZED`` when ``target`` is a subagent of another
            parent than the authority's.
    """
    address = sessions.wake_address(target)
    if address is None:
        return  # live nowhere else: absent, a no-op
    header = sessions.header(target)
    if header is None or header.origin != "subagent":
        return  # no child: what the registry of its holder would say too
    try:
        parent = SessionId(authority.parent_session_id)
    except SubagentError:
        parent = None
    if header.parent_session != parent:
        raise SubagentError("not authorized to interrupt this child", code=ErrorCode.UNAUTHORIZED)
    assert parent is not None
    sessions.ring(address, interrupt_ring(target, parent, asked_now(sessions, clock)), _PATIENCE)


def forward_ancestor_interrupt(
    sessions: SessionService,
    target: SessionId,
    authority: AncestorAuthority,
    clock: Callable[[], _dt.datetime],
) -> None:
    """``target`` is not live here, and the authority is an agent live here: when
    another runtime holds the target (a grandchild a placed child started on its
    host), ring that holder with the interrupt, as the ancestor's.

    Raises:
        SubagentError: ``UNAUTHORIZED`` for an agent that is not live, or not an
            ancestor of ``target`` (by the stored headers).
    """
    agent = authority.agent
    if not isinstance(agent, Agent) or agent.disposed:
        raise SubagentError("not authorized to interrupt this child", code=ErrorCode.UNAUTHORIZED)
    address = sessions.wake_address(target)
    if address is None:
        return  # live nowhere else: absent, a no-op
    if not stored_ancestor(sessions, target, agent.session_id):
        raise SubagentError("not authorized to interrupt this child", code=ErrorCode.UNAUTHORIZED)
    ring = interrupt_ring(target, agent.session_id, asked_now(sessions, clock), ancestor=True)
    sessions.ring(address, ring, _PATIENCE)


#: Seconds an interrupt rings again while the holder's doorbell is full: no sweep
#: finds a lost interrupt again (a lost ring of mail waits for the next one).
_PATIENCE = 2.0


def asked_now(sessions: SessionService, clock: Callable[[], _dt.datetime]) -> float:
    """The time an interrupt is asked at, for another process: by the store's clock
    (its leases'), which the holder reads too -- the latest it may be, given how far
    this process's reading may be off; the runtime's clock without leases."""
    return _store_now(sessions, clock, 1)


def _store_now(sessions: SessionService, clock: Callable[[], _dt.datetime], side: int) -> float:
    """The store's clock now, its reading's error added (``side`` 1) or taken off (-1)."""
    leases = sessions.leases
    if leases is None:
        return clock().timestamp()
    return float(leases.now() + side * leases.error())


def stored_ancestor(sessions: SessionService, target: SessionId, ancestor: SessionId) -> bool:
    """Whether ``ancestor`` is above ``target`` by the stored headers (a chain of
    subagent sessions; at most 64 levels climbed)."""
    sid = target
    for _ in range(64):
        header = sessions.header(sid)
        if header is None or header.origin != "subagent" or header.parent_session is None:
            return False
        if header.parent_session == ancestor:
            return True
        sid = header.parent_session
    return False


def drain(
    parents: Any,
    timeout: float | None,
    *,
    agents: AgentRegistry,
    index: Mapping[SessionId, Activation],
    ask: Callable[[Any], Any],
    quiescent: Callable[[Activation], object],
    end_cutoff: Callable[[Agent], object],
    elsewhere: Callable[[list[SessionId], float | None], object] | None = None,
) -> None:
    """Drain the continuable forests below ``parents`` (exact live host-owned agents).

    ``ask`` asks the registry; ``quiescent`` tells the supervisor an Activation is
    idle; ``end_cutoff`` is registered to lift a parent's cutoff when it is disposed;
    ``elsewhere(parent_ids, timeout)`` drains what other processes hold below them.

    ``timeout`` bounds the whole drain (each wait gets what is left of it).

    Raises:
        SubagentError: ``UNAUTHORIZED``, ``INVALID_ARGUMENT``, ``TIMEOUT``.
    """
    timeout = check_timeout(timeout)
    left = _time_left(timeout)
    if isinstance(parents, Agent):
        parent_list: tuple[Any, ...] = (parents,)
    else:
        try:
            if isinstance(parents, (str, bytes)):
                raise TypeError
            parent_list = tuple(parents)
        except TypeError:
            raise bad("drain takes an agent or an iterable of agents") from None
    for p in parent_list:
        if not isinstance(p, Agent) or not agents.is_live(p):
            raise SubagentError("drain takes exact live agents", code=ErrorCode.UNAUTHORIZED)
        act = index.get(p.session_id)
        if act is not None and act.agent is p and act.phase in VISIBLE:
            raise bad("drain takes host-owned (non-continuable) parents")
    for p in parent_list:
        p.add_dispose_listener(end_cutoff)
    forest, pending = ask(Cutoff(parent_list))
    idle = _cut(forest)
    for _act, latch in pending:
        latch.wait(left())
    again, _ = ask(Cutoff(parent_list))
    known = {id(a) for a in forest}
    fresh = [a for a in again if id(a) not in known]  # published since the cutoff
    idle += _cut(fresh)
    # Published below the cutoff (drained at once) and released already, gone from
    # the index before the second look: its end may not be announced yet.
    known.update(id(a) for a in fresh)
    gone = [act for act, _ in pending if act.agent is not None and id(act) not in known]
    for act in idle:
        quiescent(act)
    if elsewhere is not None:
        elsewhere([p.session_id for p in parent_list], left())
    for act in [*forest, *fresh, *gone]:
        if not act.released.wait(left()):
            raise SubagentError(
                f"draining {act.child_id} did not finish in {timeout} s", code=ErrorCode.TIMEOUT
            )


def _time_left(timeout: float | None) -> Callable[[], float | None]:
    """What is left of ``timeout`` seconds from now, each time it is called."""
    if timeout is None:
        return lambda: None
    deadline = time.monotonic() + timeout
    return lambda: max(0.0, deadline - time.monotonic())


def _cut(forest: list[Activation]) -> list[Activation]:
    """Cancel a drained ``forest`` top-down, what waits dropped; returns the ones
    that were idle. Below a cutoff a drained agent reports each time it goes idle:
    only those idle already, as the cutoff answers, need a nudge to the supervisor.
    (Looked at later -- after the cancels and the waits -- nearly all are idle, and
    each would be considered twice.)"""
    idle = [act for act in forest if act.agent.idle]
    for act in sorted(forest, key=lambda a: a.depth):
        act.agent.cancel("drained", keep_inbox=False)
    return idle


def drain_elsewhere(
    sessions: SessionService,
    parents: list[SessionId],
    timeout: float | None,
    *,
    here: Mapping[SessionId, Activation],
    clock: Callable[[], _dt.datetime],
    sleep: Callable[[float], object],
) -> None:
    """Ring the holders of the continuable descendants of ``parents`` that other live
    processes hold (the stored tree, level by level; not those ``here``), then wait
    until none of them is held elsewhere -- ringing again now and then (a ring is a
    hint: lost, or come before the child was resident there); a store that cannot
    say meanwhile counts as still held.

    Raises:
        SubagentError: ``TIMEOUT`` when one still is after ``timeout`` seconds; the
            store's, when it cannot list the tree.
    """
    if sessions.persistence is None or sessions.leases is None:
        return
    deadline = None if timeout is None else time.monotonic() + timeout
    asked = asked_now(sessions, clock)
    rung: dict[SessionId, tuple[str, SessionId]] = {}  # what waits: (address, parent)
    level, seen = list(parents), set(parents)
    for _ in range(64):  # the delegation depth's bound
        found = [
            h
            for h in sessions.stored_children(level)
            if h.origin == "subagent" and h.id not in seen
        ]
        if not found:
            break
        seen.update(h.id for h in found)
        level = [h.id for h in found]
        away = sessions.wake_addresses([h.id for h in found if h.id not in here])
        for h in found:
            address = away.get(h.id)
            parent = h.parent_session
            if address is not None and parent is not None and not sessions.one_shot(h):
                rung[h.id] = (address, parent)
    pause, ring_at = 0.01, 0.0
    while rung:
        if time.monotonic() >= ring_at:
            for sid, (address, parent) in rung.items():
                sessions.ring(address, interrupt_ring(sid, parent, asked, drain=True))
            ring_at = time.monotonic() + _RING_AGAIN
        sleep(pause)
        pause = min(pause * 2, 0.2)  # a store read each: back off
        with contextlib.suppress(SubagentError):  # cannot say: as held, till the deadline
            held = sessions.wake_addresses(list(rung))
            rung = {sid: (held[sid], rung[sid][1]) for sid in rung if sid in held}
        if rung and deadline is not None and time.monotonic() > deadline:
            sid = next(iter(rung))
            raise SubagentError(
                f"draining {sid} (held by another process) did not finish in {timeout} s",
                code=ErrorCode.TIMEOUT,
            )


#: Seconds between drain rings to a holder that still holds a descendant.
_RING_AGAIN = 0.5


def drain_asked(
    target: SessionId,
    by: SessionId,
    *,
    index: Mapping[SessionId, Activation],
    ask: Callable[[Any], Any],
    quiescent: Callable[[Activation], object],
    end_cutoff: Callable[[Agent], object],
) -> None:
    """A drain another process asked of ``target``, a continuable child of ``by``
    live here (this runtime's mail task calls it): admission closes at and below
    it, its turn and those of its forest here are cancelled with what waits, and
    each is released once idle -- the asker waits for its lease."""
    act = index.get(target)
    agent = None if act is None else act.agent
    if act is None or act.phase is not Phase.RESIDENT or not isinstance(agent, Agent):
        return  # not resident here (a placed child's host holds its own lease)
    if act.parent_session != by:
        raise SubagentError(f"{target} is no child of {by}", code=ErrorCode.UNAUTHORIZED)
    agent.add_dispose_listener(end_cutoff)
    forest, _ = ask(Cutoff((agent,), inclusive=True))
    for act in _cut(forest):
        quiescent(act)
