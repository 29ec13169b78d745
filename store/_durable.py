"""The durable inbox and leases: what a store keeps so that accepted means committed.

**The inbox.** Every message a session accepts -- a follow-up, an initial prompt,
a report -- is queued in the session's inbox, in acceptance order (``n`` = 1, 2,
...), atomically with its acceptance, and stays *pending* until the turn that ran
it ended (:meth:`DurableQueues.complete`). A message id is accepted once per
session: accepting it again answers the first acceptance (``duplicate=True``) and
queues nothing. An entry records the activation ``epoch`` it was handed to, so
the next activation after a crash knows which pending messages may have started
(``redelivered``). Done entries are kept until :meth:`DurableQueues.prune_inbox`
removes them; until then their ids still deduplicate.

**Leases.** A session has at most one *lease*: ``(holder, epoch, expires)``.
:meth:`DurableQueues.acquire_lease` takes it by compare-and-swap -- when it is
free, expired, already this holder's, or held by a holder the caller knows is
dead -- and bumps the epoch. A write that carries a lease token ``(holder,
epoch)`` is refused with ``LEASE_LOST`` (writing nothing) unless the session's
lease is still exactly that: the loser of a lease can never write after the
winner. ``expires`` and ``now`` are wall-clock seconds chosen by the caller (from
the store's ``clock()``, one clock for every process); the store compares them.

**Renewal is a heartbeat.** :meth:`DurableQueues.renew_leases` records one expiry
for the holder, not one per lease: a lease is live until the later of its own
``expires`` and its holder's last renewal (see :data:`HOLDER_RETENTION`)."""

from __future__ import annotations

import abc
import enum
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from subagents.protocol import (
    DecodeError,
    ErrorCode,
    Event,
    InboxFullError,
    Limits,
    MessageEvent,
    MessageId,
    ReportEvent,
    SessionId,
    SubagentError,
)

from ._cells import inbox_event
from ._listening import Listener
from ._validate import check_int, check_seconds, check_session_ids

__all__ = [
    "HOLDER_RETENTION",
    "Accepted",
    "DurableQueues",
    "InboxEntry",
    "Lease",
    "LeaseToken",
    "Listener",
    "NewLease",
    "Release",
    "inbox_full",
    "lease_held",
    "lease_lost",
    "quiet_report",
    "takes_place",
]

#: A renewal forgets heartbeats that lapsed this long (seconds) before it: a process
#: that ended leaves its heartbeat, and a lapsed heartbeat keeps no lease live.
HOLDER_RETENTION: Final = 86_400.0

#: ``(holder, epoch)``: a write fenced by a lease.
LeaseToken = tuple[str, int]
#: ``(holder, expires, wake)``: the lease a new session is created with (epoch 1).
NewLease = tuple[str, float, "str | None"]


class Release(enum.IntEnum):
    """What :meth:`DurableQueues.release_lease` did (false only for ``NOT_HELD``)."""

    NOT_HELD = 0  #: the token does not hold the lease: nothing changed
    RELEASED = 1  #: released
    WAITING = 2  #: released with messages nobody took: somebody must activate it


@dataclass(frozen=True, slots=True)
class InboxEntry:
    """One pending message of a session's inbox.

    ``event`` is what its turn will log (a ``MessageEvent`` or a ``ReportEvent``);
    ``epoch`` the activation it was handed to (None: none yet).
    """

    n: int
    event: MessageEvent | ReportEvent
    epoch: int | None

    @property
    def message_id(self) -> MessageId:
        """The accepted message's id."""
        return self.event.message_id


@dataclass(frozen=True, slots=True)
class Accepted:
    """The outcome of accepting one message: its place ``n``, whether its id had
    been accepted before (then nothing new was queued), and, for a new entry, the
    acceptance time it was stored with (what :meth:`DurableInbox.retract` takes to
    take back only an entry no later acceptance answered for) and ``run``: the first
    and last place of the new entries written with it in one go under its ``epoch``
    and ``lease``, a group commit's joined ones too (None: a store that does not say)."""

    n: int
    duplicate: bool
    at: float | None = field(default=None, compare=False)
    run: tuple[int, int] | None = field(default=None, compare=False)


@dataclass(frozen=True, slots=True)
class Lease:
    """A session's lease: ``holder`` (None: released), ``epoch`` (bumped by every
    acquisition), ``expires`` (wall-clock seconds), and how to wake the holder."""

    session_id: SessionId
    holder: str | None
    epoch: int
    expires: float
    wake: str | None

    def token(self) -> LeaseToken:
        """The ``(holder, epoch)`` that fences this lease's writes."""
        assert self.holder is not None
        return (self.holder, self.epoch)


def lease_held(lease: Lease) -> SubagentError:
    """``LEASE_HELD``: another live holder has the session (hint: the lease)."""
    return SubagentError(
        f"session {lease.session_id} is held by {lease.holder} until {lease.expires:.3f}",
        code=ErrorCode.LEASE_HELD,
        hint={"holder": lease.holder, "expires": lease.expires, "wake": lease.wake},
    )


def lease_lost(session_id: SessionId, token: LeaseToken) -> SubagentError:
    """``LEASE_LOST``: a write fenced by a lease this holder no longer has."""
    return SubagentError(
        f"session {session_id}: lease {token[0]} epoch {token[1]} is no longer held",
        code=ErrorCode.LEASE_LOST,
        hint={"session_id": session_id, "holder": token[0], "epoch": token[1]},
    )


def quiet_report(event: Event) -> bool:
    """Whether ``event`` is a quiet report, which no inbox bound counts."""
    return type(event) is ReportEvent and event.delivery == "quiet"


def takes_place(n: object, body: object, epoch: object, limits: Limits) -> bool:
    """Whether a pending inbox row takes a place of an inbox bound: a message or a
    waking report. Neither a quiet report nor a row that does not decode does
    (``pending()`` skips that one, and it is never done: counted, it would keep
    its place for good)."""
    try:
        return not quiet_report(inbox_event(n, body, epoch, limits))
    except DecodeError:
        return False


def inbox_full(session_id: SessionId, limit: int, pending: int) -> InboxFullError:
    """``INBOX_FULL``: an acceptance bounded by ``limit`` found ``pending`` messages
    accepted and not yet done (nothing was accepted)."""
    return InboxFullError(str(session_id), limit, pending)


class DurableQueues(abc.ABC):
    """The inbox and lease half of the store contract (see the module docstring)."""

    # -- the inbox -----------------------------------------------------------------

    @abc.abstractmethod
    def accept(
        self,
        session_id: SessionId | str,
        events: Sequence[Event],
        *,
        epoch: int | None = None,
        now: float = 0.0,
        lease: LeaseToken | None = None,
        limit: int | None = None,
    ) -> list[Accepted]:
        """Queue ``events`` (each with a ``message_id``) in the session's inbox, in
        order, atomically; durable when it returns, as an append is.

        ``epoch`` records that they are handed to that activation at once (the
        holder accepting for its own resident agent); ``now`` is kept as the
        acceptance time (for :meth:`prune_inbox`); ``lease`` fences the write.
        ``limit`` bounds the inbox: when the messages not yet done, with the new
        ones (ids not accepted before), would be more than ``limit``, nothing is
        accepted -- decided in the same transaction as the insert, so concurrent
        acceptances never overfill it. Quiet reports take no place: they wait for
        a turn that only a message starts (:func:`quiet_report`).

        Raises:
            SubagentError: ``SESSION_NOT_FOUND``, ``LEASE_LOST``, ``INVALID_ARGUMENT``,
                ``INBOX_FULL``.
        """

    @abc.abstractmethod
    def pending(
        self, session_id: SessionId | str, *, damaged: list[int] | None = None
    ) -> list[InboxEntry]:
        """The session's accepted messages not yet done, in acceptance order.

        A row that does not decode raises, unless ``damaged`` is a list: its place
        is appended there and the row skipped (it stays in the store, untouched),
        so one damaged message does not hide the others.

        Raises:
            SubagentError: ``SESSION_NOT_FOUND``; ``CorruptRecordError`` for a bad row
                (without ``damaged``).
        """

    def untaken(
        self, session_id: SessionId | str, after: int = 0, *, damaged: list[int] | None = None
    ) -> list[InboxEntry]:
        """:meth:`pending`, only messages no activation took, at places past ``after``
        (SQL stores read just those rows). This default filters :meth:`pending`."""
        at = check_int(after, "after")
        entries = self.pending(session_id, damaged=damaged)
        return [e for e in entries if e.epoch is None and e.n > at]

    def pending_many(
        self,
        session_ids: Iterable[SessionId | str],
        *,
        damaged: dict[SessionId, list[int]] | None = None,
    ) -> dict[SessionId, list[InboxEntry]]:
        """:meth:`pending` of each given session, for a reader of many (``subagents
        tree``); an id that names no stored session is absent. A row that does not
        decode raises, unless ``damaged`` is a dict: its place is appended to
        ``damaged[session_id]`` (a list made on first use) and the row skipped. The
        default asks :meth:`pending` of each session; SQL stores read a chunk a time.

        Raises:
            SubagentError: ``INVALID_ARGUMENT`` for an argument that is no list of
                session ids; ``CorruptRecordError`` for a bad row (without ``damaged``).
        """
        entries: dict[SessionId, list[InboxEntry]] = {}
        for sid in check_session_ids(session_ids):
            places: list[int] | None = None if damaged is None else []
            try:
                entries[sid] = self.pending(sid, damaged=places)
            except SubagentError as exc:
                if exc.code != ErrorCode.SESSION_NOT_FOUND:
                    raise
            if damaged is not None and places:
                damaged[sid] = places
        return entries

    @abc.abstractmethod
    def complete(
        self,
        session_id: SessionId | str,
        message_ids: Sequence[MessageId],
        *,
        lease: LeaseToken | None = None,
    ) -> None:
        """Mark messages done (their turn ended); unknown or done ids are ignored."""

    @abc.abstractmethod
    def retract(
        self,
        session_id: SessionId | str,
        message_id: MessageId,
        *,
        epoch: int | None = None,
        accepted_at: float | None = None,
    ) -> bool:
        """Take back an accepted message no activation but ``epoch`` (the caller's own)
        has taken, not done (its admission failed after it was committed), while no
        later activation took the lease (it replays it); True when it was removed.

        ``accepted_at``: the caller's own acceptance time (``Accepted.at``). An
        acceptance of the same id that found it already there (a duplicate: its
        caller was told the message is accepted) moves the entry's time on, so
        the first caller's retraction then leaves it: it stays accepted."""

    @abc.abstractmethod
    def answer(self, session_id: SessionId | str, message_id: MessageId) -> bool:
        """A caller that found ``message_id`` already accepted (not through
        :meth:`accept`: a start that found its child created) answers for it: a
        pending entry's time moves on as a duplicate acceptance's does, so the
        first caller's retraction or withdrawal leaves it. True when a pending entry
        was answered for; False when it is done, or gone (the session withdrawn).

        Raises:
            SubagentError: ``SESSION_NOT_FOUND`` for an unknown session.
        """

    @abc.abstractmethod
    def withdraw(self, session_id: SessionId | str, message_id: MessageId) -> bool:
        """Undo a session created with ``message_id`` in its inbox
        (``create_session(..., inbox=)``) nobody can run: in one transaction,
        delete the session if that entry is pending, no activation took it, and
        nobody answered for it (:meth:`answer`); True when it was deleted, False
        (nothing changed) otherwise -- the session then stays, and its message
        runs. Unknown sessions are False."""

    @abc.abstractmethod
    def hand_over(
        self,
        session_id: SessionId | str,
        message_ids: Sequence[MessageId],
        epoch: int,
        *,
        lease: LeaseToken | None = None,
    ) -> list[MessageId]:
        """Take pending messages into activation ``epoch``: those no activation has
        taken (and not done), by compare-and-swap; returns the ids it took, in the
        order given. Two takers in one epoch (a resident activation and its
        process's mail pickup) so never both run one message."""

    @abc.abstractmethod
    def give_back(
        self, session_id: SessionId | str, message_ids: Sequence[MessageId], epoch: int
    ) -> int:
        """Messages activation ``epoch`` took and never ran go back to nobody (so whoever
        runs them does not take them for redeliveries); those taken since, or done, are
        left alone. Once a later activation took the lease, they go to it instead (it
        replays them; untaken, it would take them again). Returns how many went back."""

    @abc.abstractmethod
    def orphans(self, now: float) -> list[SessionId]:
        """Sessions with messages not done, or promises open (:mod:`._promises`), whose
        lease is free at ``now`` (released, expired, or never taken): accepted work
        no live activation will run unless somebody activates the session."""

    def leased_work(self, prefix: str, now: float) -> list[tuple[SessionId, str]]:
        """``(session, holder)`` of accepted work (as :meth:`orphans` counts it) under a
        lease live at ``now`` whose holder's id starts with ``prefix`` (this host's:
        ``Holder.kin``); the sweep adopts those whose holder's process ended. This
        default returns ``[]``: such work waits for its lease's expiry."""
        return []

    def ended_work(self, now: float) -> list[tuple[SessionId, str]]:
        """As :meth:`unheard_work`, for holders the store can tell have ended, in any
        PID namespace (SQLite: a free presence lock, see ``SqliteStore.listen``):
        an acquisition given ``dead`` takes their leases over. This default: ``[]``."""
        check_seconds(now, "now")
        return []

    def unheard_work(self, now: float) -> list[tuple[SessionId, str]]:
        """``(session, holder)`` of accepted work (as :meth:`orphans` counts it) under a
        lease live at ``now`` whose holder -- on any host -- no longer listens for
        its rings (PostgreSQL: its channel's connection is gone). It may be
        reconnecting: the caller judges (``Holder.unheard``). This default: ``[]``."""
        check_seconds(now, "now")
        return []

    @abc.abstractmethod
    def waiting(self, holder: str) -> list[SessionId]:
        """Sessions leased by ``holder`` whose inbox has messages no activation took
        (accepted by another process for them): what its mail pickup should read."""

    @abc.abstractmethod
    def find_accepted(self, message_id: MessageId) -> list[tuple[SessionId, int]]:
        """``(session, n)`` of every inbox that accepted ``message_id``."""

    @abc.abstractmethod
    def prune_inbox(self, before: float) -> int:
        """Forget done messages accepted before ``before``; returns how many."""

    # -- leases --------------------------------------------------------------------

    @abc.abstractmethod
    def acquire_lease(
        self,
        session_id: SessionId | str,
        holder: str,
        *,
        now: float,
        expires: float,
        wake: str | None = None,
        dead: Callable[[str], bool] | None = None,
    ) -> Lease:
        """Take the session's lease (epoch + 1) when it is free, expired (``expires
        <= now``), already ``holder``'s, or held by a holder ``dead(holder)`` says is
        gone -- or, given ``dead``, whose presence the store finds ended (SQLite:
        see :meth:`ended_work`).

        Raises:
            SubagentError: ``LEASE_HELD`` (hint: the current lease),
                ``SESSION_NOT_FOUND``.
        """

    @abc.abstractmethod
    def renew_leases(self, holder: str, expires: float) -> list[SessionId]:
        """Extend every lease ``holder`` still has until ``expires`` (its heartbeat:
        see the module docstring); returns their sessions."""

    def renew_lease_count(self, holder: str, expires: float) -> int:
        """:meth:`renew_leases`, returning how many leases it extended: a renewal
        loop that knows how many it holds reads the list only when a count differs
        (the SQL stores then count their index instead of returning a row a lease).
        This default counts :meth:`renew_leases`' list."""
        return len(self.renew_leases(holder, expires))

    @abc.abstractmethod
    def release_lease(
        self, session_id: SessionId | str, token: LeaseToken, *, unrun: Sequence[MessageId] = ()
    ) -> Release:
        """Give the lease up (the epoch stays); ``NOT_HELD`` (false) when it was not held
        with ``token`` (then nothing changes). ``unrun``: messages the releasing epoch
        took and never ran (it stops with them queued), given back as by
        :meth:`give_back`. ``WAITING`` when, in the same transaction, the inbox holds
        messages nobody took: the releaser must see them run (a process that
        accepted one while the lease was held counted on the holder)."""

    @abc.abstractmethod
    def get_lease(self, session_id: SessionId | str) -> Lease | None:
        """The session's lease (None: never taken)."""

    def get_leases(self, session_ids: Iterable[SessionId | str]) -> dict[SessionId, Lease]:
        """The leases of ``session_ids`` by session, in one read where the store can
        (a session never leased, or not stored, is absent). This default asks
        :meth:`get_lease` for each."""
        found: dict[SessionId, Lease] = {}
        for sid in check_session_ids(session_ids):
            lease = self.get_lease(sid)
            if lease is not None:
                found[lease.session_id] = lease
        return found
