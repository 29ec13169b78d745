"""Pending messages into a live agent, in acceptance order: a resume's replay, and
the messages a follow-up committed past a gap takes first.

The durable inbox is FIFO across processes and senders. A message committed for a
session live here but taken by nobody -- another process's ``send`` or follow-up
by the parent's id, or one of this process's own sends that met the session's
activation in progress -- waits for the mail pickup, which runs later, in the
agent's loop. A follow-up accepted here meanwhile is committed *taken* by the
activation and queued at once; queued before those, it would run before messages
accepted ahead of it (one sender's two messages among them: the first went
through the inbox, the second straight to the agent). So every strict follow-up
of a live agent, committed at a place that is not the one after the last place
this activation knows about (``LiveSession.inbox_n``: its own commits, the gaps
it looked into), first takes and queues, in order, the messages before it that
nobody took (:func:`committed_at`). The first follow-up of an activation looks
once: it cannot know the place it follows. One committed behind a place the
activation went past (two callers whose commits crossed) looks for nothing: the
later one's look covered it; nor does one whose group commit's run of places
(``Accepted.run``, all this activation's) starts where the activation's known
places end.

A resumed activation's own replay comes before all of that. Its agent is
registered -- found live by a report, a ``send``, the mail pickup -- before its
owner (the resume, or a continuable child's publication, after its setup
contributions) queues the messages the resume took from the inbox: until then
(``LiveSession.replay_due``) a report or follow-up is committed untaken and left
to the pickup (:func:`keep_untaken`), and the pickup stands back
(:func:`stand_back`); the owner, once the replay is queued, rings the pickup for
what waited (:func:`replay_first`, :func:`replayed`). Queued at once, such a message ran ahead of
the messages accepted before it (a child's second report before the first, the
one that woke its parent).

Written against the agent's duck type (``deliver``, ``inject_quiet``, ``session``,
``session_id``, ``_host``, ``_turns``, ``_taking``): the agent's own follow-up
imports this module.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from subagents.protocol import MessageEvent, ReportEvent, SubagentError
from subagents.store import Accepted, InboxEntry

from ._doubts import taken_after_all
from ._write_faults import unsure

__all__ = [
    "committed_at",
    "keep_untaken",
    "replay",
    "replay_first",
    "replayed",
    "stand_back",
    "take_ahead",
    "take_one",
]

logger = logging.getLogger("subagents")


def replay(agent: Any, entries: list[InboxEntry], *, drop: bool = False) -> None:
    """Deliver pending messages into a resumed agent, in acceptance order (``drop``:
    accepted and discarded unrun, each in the step that accepts it)."""
    epoch = agent.session.token[1] if agent.session.token is not None else None
    agent._turns.from_inbox(e.message_id for e in entries)
    for entry in entries:
        event = entry.event
        redelivered = entry.epoch is not None and entry.epoch != epoch
        if isinstance(event, MessageEvent):
            agent.deliver(
                event.content,
                event.source,
                message_id=event.message_id,
                redelivered=redelivered,
                drop=drop,
            )
        elif event.delivery == "waking":
            agent.deliver(
                event.content,
                event.source,
                kind="report",
                message_id=event.message_id,
                redelivered=redelivered,
                drop=drop,
            )
        else:
            agent.inject_quiet(event.content, event.source, event.message_id, drop=drop)


def replay_first(agent: Any, entries: list[InboxEntry], *, drop: bool = False) -> None:
    """The owner of a resumed activation queues its replay (:func:`replay`), then
    lets the others in (:func:`replayed`), whatever happens to the replay."""
    try:
        replay(agent, entries, drop=drop)
    finally:
        replayed(agent)


def replayed(agent: Any) -> None:
    """The owner of a resumed activation queued its replay (a continuable child's
    publication: with its first message and those that waited for it): from now
    on others queue behind it; the pickup is rung for what a taker left meanwhile."""
    live = agent.session
    live.replay_due = False
    # Read after the flag is down: a taker that stood back before that set it
    # first (and one that set it after saw the flag down and went on).
    if live.stood_back:
        live.stood_back = False
        agent._host.sessions.wake_pickup(agent.session_id)


def stand_back(live: Any) -> bool:
    """Whether a taker of untaken messages (the pickup, under the agent's taking
    lock) must leave them for now: the activation's replay is not queued yet. The
    owner rings the pickup once it is (:func:`replay_first`)."""
    if not live.replay_due:
        return False
    live.stood_back = True
    return bool(live.replay_due)  # queued meanwhile: the taker goes on, after it


def keep_untaken(sessions: Any, session_id: Any, event: MessageEvent | ReportEvent) -> bool:
    """Commit ``event`` for a session live here whose replay is not queued yet,
    taken by nobody, and have the pickup take it (after the replay); True when
    its id was accepted before (nothing new)."""
    (accepted,) = sessions.accept(session_id, (event,))
    sessions.wake_pickup(session_id)
    return bool(accepted.duplicate)


@contextmanager
def committed_at(sessions: Any, agent: Any, accepted: Accepted) -> Iterator[None]:
    """``agent``'s activation just committed a message (``accepted``, new) to its
    durable inbox: first take the messages ahead of it that nobody took, when its
    place does not follow the activation's last place (see the module docstring);
    the caller queues its message inside. Both under the agent's taking lock, which
    the mail pickup holds too: two takers of one run of messages would queue them
    each in its own order (a pickup's later ones before a take-ahead's, or the
    reverse).

    The places of the message's run (``accepted.run``: the acceptances a group
    commit wrote with it, all taken by this activation) need no look: only those
    before the run's first do. So of the producers one commit answered, the first
    back looks at most once and the others never -- whichever order they come back
    in (they race for this lock)."""
    n = accepted.n
    first, end = accepted.run or (n, n)
    with agent._taking:
        live = agent.session
        last = live.inbox_n
        if first > last + 1:
            take_ahead(sessions, agent, first, last)
        # (Behind ``last``: a follow-up committed after this one, queued first,
        # took what nobody took before it -- before this one's place too.)
        if end > last:
            live.inbox_n = end
        yield


def take_ahead(sessions: Any, agent: Any, n: int, after: int = 0) -> None:
    """Take and deliver, first and in order, the messages committed before place
    ``n`` of ``agent``'s durable inbox -- past ``after``, the activation's last
    place (those before it were taken then) -- that nobody took yet (under the
    agent's taking lock). Only those rows are read: with many producers, places
    commit out of order and most follow-ups look, while the queue of taken
    messages grows. A store error leaves them to the pickup, later: they stay
    accepted. A hand-over whose answer was lost may have taken them all the same:
    it is settled at once (:func:`~._doubts.taken_after_all`), else they are left
    to the pickup as doubts (``sessions.doubts``), which it settles -- then they
    run after the message at ``n``, but once. Taken for an agent found leaving
    as they are queued, they are given back to nobody: the next activation runs
    them as never run (not ``redelivered``)."""
    try:
        sid = agent.session_id
        ahead = [e for e in sessions.untaken(sid, after) if e.n < n]
        if not ahead:
            return
        ids = [e.message_id for e in ahead]
        try:
            taken = set(sessions.hand_over(sid, ids, agent.session))
        except SubagentError as exc:
            if not unsure(exc):
                raise
            try:
                taken = taken_after_all(sessions, agent.session, ids)
            except SubagentError:
                sessions.doubts.add(sid, ids)
                sessions.wake_pickup(sid)
                raise
        handed = [e for e in ahead if e.message_id in taken]
        try:
            replay(agent, handed)
        except SubagentError:
            # Found leaving (its gate closed: disposed, or a child retiring): what it
            # took goes back to nobody, as the pickup's does -- kept by this
            # activation, the next would run them as messages it may have run
            # (``redelivered``), and its release would not say they wait.
            token = agent.session.token
            if token is not None and handed:
                sessions.give_back(sid, [e.message_id for e in handed], token[1])
            raise
    except SubagentError as exc:
        logger.warning("taking the messages ahead of a follow-up failed: %s", exc)


def take_one(sessions: Any, agent: Any, live: Any, message_id: Any) -> bool:
    """Take one message nobody took into ``agent``'s activation (``live``) as its
    turn starts: whether it took it. Under the agent's taking lock, as every taker
    (a take-ahead settling a take whose answer was lost counts on it: see
    :func:`~._doubts.taken_after_all`).

    Raises:
        SubagentError: the store's (the caller stops the activation).
    """
    with agent._taking:
        return bool(sessions.hand_over(live.id, (message_id,), live))
