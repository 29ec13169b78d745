"""Accepted means committed: the durable inbox, as the runtime uses it.

Under strict durability (a durable store, ``Runtime(durability="strict")``, the
default) every message a session accepts -- a follow-up, a prompt, a report --
is committed to the session's inbox before the call that accepted it returns;
concurrent acceptances share one commit (the store's group commit). It leaves the
inbox with the end of the turn that ran it (``done``, written with ``turn/end``).
A message id is accepted once per session, across processes and restarts.

Under relaxed durability (or without a durable store) nothing is committed at
acceptance: messages reach the log write-behind, as turns run, and a repeated
message id is recognized only while this runtime remembers it
(:data:`SEEN_MAX` ids, the oldest forgotten first); a repeat of an id whose
acceptance is under way waits for its outcome (:meth:`Acceptance.once`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar

from subagents.actors._kernel import AbortSignal, ring
from subagents.protocol import (
    Event,
    InboxFullError,
    MessageId,
    SessionHeader,
    SessionId,
    SubagentError,
)
from subagents.store import Accepted, InboxEntry, Listener, Promises, SessionStore

from ._doubts import HandOverDoubts
from ._live import LiveSession
from ._underway import Underway
from ._write_faults import doubted, unsure

__all__ = ["SEEN_MAX", "Acceptance"]

logger = logging.getLogger("subagents")

#: Message ids a relaxed runtime remembers for deduplication.
SEEN_MAX: Final = 100_000
_T = TypeVar("_T")
_NEVER = AbortSignal.never()
#: Seconds a refused acceptance waits for this runtime's writes before it counts
#: again (else it is refused as counted).
_FULL_WAIT: Final = 2.0


class Acceptance:
    """Mixed into :class:`~._sessions.SessionService` (which provides the members below)."""

    persistence: SessionStore | None
    strict: bool
    leases: Any  # ._leases.Leases | None
    _live: dict[SessionId, LiveSession]
    _backend: Any  # the runtime's Backend: its sleep
    flush: Callable[..., None]  # SessionService.flush
    _writer: Any  # ._writer.Writer | None
    _failed: Callable[[SessionId, BaseException], None]  # SessionService._failed

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def _init_acceptance(self) -> None:
        self._seen: OrderedDict[tuple[SessionId, MessageId], bool] = OrderedDict()
        self._seen_lock = threading.Lock()
        #: The claims whose acceptance is under way (see :meth:`once`).
        self.underway = Underway()
        #: Messages offered again under an accepted id, since the runtime opened.
        self.deduplicated = 0
        self._damaged: set[tuple[SessionId, int]] = set()  # inbox rows logged as damaged
        #: Messages a hand-over of this runtime may have taken (see :mod:`._doubts`).
        self.doubts = HandOverDoubts()

    def accept(
        self,
        session_id: SessionId,
        events: Sequence[Event],
        live: LiveSession | None = None,
        limit: int | None = None,
    ) -> list[Accepted]:
        """Commit messages to ``session_id``'s inbox; ``live``: the session is live here,
        so they are handed to its activation (and fenced by its lease); ``limit``:
        the inbox's bound (``INBOX_FULL``, accepting nothing, when they do not fit)."""
        store = self.persistence
        assert store is not None
        token = live.token if live is not None else None
        epoch = None if token is None else token[1]
        for counted_again in (False, True):
            try:
                result: list[Accepted] = self._call(
                    store.accept, session_id, events,
                    epoch=epoch, now=time.time(), lease=token, limit=limit,
                )  # fmt: skip
                break
            except InboxFullError as full:
                # Full as the store counts it -- perhaps of messages whose turns
                # ended here, their ``done`` still on its way to the store
                # (write-behind): once this runtime's writes are in, the count is
                # what the caller saw. Counted once more, at most.
                if counted_again:
                    raise
                try:
                    self.flush(session_id, timeout=_FULL_WAIT)
                except SubagentError:
                    raise full from None
        for entry in result:
            if entry.duplicate:
                self._deduplicated(session_id, live)
        return result

    def _deduplicated(self, session_id: SessionId, live: LiveSession | None) -> None:
        """Count a message offered again under an accepted id (statistics)."""
        live = live if live is not None else self._live.get(session_id)
        with self._seen_lock:
            self.deduplicated += 1
            if live is not None:
                live.deduplicated += 1

    def retract(
        self,
        session_id: SessionId,
        message_id: MessageId,
        live: LiveSession | None = None,
        *,
        accepted_at: float | None = None,
    ) -> bool:
        """Take an accepted message back (its delivery failed right after it
        committed); ``accepted_at``: its ``Accepted.at``, so that an entry a later
        acceptance of the same id answered for stays (see ``DurableInbox.retract``)."""
        store = self.persistence
        assert store is not None
        token = live.token if live is not None else None
        done: bool = self._call(
            store.retract,
            session_id,
            message_id,
            epoch=None if token is None else token[1],
            accepted_at=accepted_at,
        )
        return done

    def create_unheld(self, header: SessionHeader, events: Sequence[Event], prompt: Event) -> None:
        """Commit a new session with ``prompt`` in its inbox and no lease: nobody
        holds it, and whoever activates it (rung, or a holder's sweep) runs the
        prompt. Strict durability only.

        Raises:
            SubagentError: ``SESSION_EXISTS``, or the store's error (nothing created).
        """
        store = self.persistence
        assert store is not None
        assert self.strict
        self._call(store.create_session, header, events, inbox=[prompt])

    def withdraw_unheld(self, session_id: SessionId, message_id: MessageId) -> bool:
        """Undo :meth:`create_unheld` while nobody has taken its prompt, nor answered
        for it (:meth:`answer_unheld`): the session is deleted, with its prompt, in one
        transaction (True); False when it stays. One whose answer was lost (``unsure``)
        is asked again; withdrawing nothing then, the store says if the session is gone.

        Raises:
            SubagentError: the store's (it stays), or ``hint["in_doubt"]``: nobody can say.
        """
        store = self.persistence
        assert store is not None
        try:
            return bool(self._call(store.withdraw, session_id, message_id))
        except SubagentError as exc:
            if not unsure(exc):
                raise
            lost = exc
        try:
            again = self._call(store.withdraw, session_id, message_id)
            return bool(again) or self._call(store.header, session_id) is None
        except SubagentError as exc:
            raise doubted(f"withdrawal in doubt: {exc}", lost, message_id) from exc

    def answer_unheld(self, session_id: SessionId, message_id: MessageId) -> bool:
        """A start that found the session :meth:`create_unheld` made answers for its
        prompt, so the creator's :meth:`withdraw_unheld` leaves it. False when the
        prompt is done or gone (``SESSION_NOT_FOUND``: the session was withdrawn)."""
        store = self.persistence
        assert store is not None
        done: bool = self._call(store.answer, session_id, message_id)
        return done

    def pending(self, session_id: SessionId) -> list[InboxEntry]:
        """The session's accepted messages not yet done, in acceptance order.

        A message whose stored row does not decode is skipped -- the others still
        run -- and left in the store; it is logged once per runtime (an error: an
        accepted message that cannot run).
        """
        store = self.persistence
        assert store is not None
        return self._decoded(store.pending, session_id)

    def untaken(self, session_id: SessionId, after: int = 0) -> list[InboxEntry]:
        """:meth:`pending`, only those no activation took, at places past ``after``."""
        store = self.persistence
        assert store is not None
        return self._decoded(store.untaken, session_id, after)

    def _decoded(self, read: Any, session_id: SessionId, *args: Any) -> list[InboxEntry]:
        damaged: list[int] = []
        entries: list[InboxEntry] = self._call(read, session_id, *args, damaged=damaged)
        if damaged:
            with self._seen_lock:
                new = [n for n in damaged if (session_id, n) not in self._damaged]
                self._damaged.update((session_id, n) for n in new)
            if new:
                logger.error(
                    "session %s: inbox entries %s do not decode; skipped (left in the store)",
                    session_id,
                    new,
                )
        return entries

    def hand_over(
        self, session_id: SessionId, message_ids: Sequence[MessageId], live: LiveSession
    ) -> list[MessageId]:
        """Take messages nobody took into ``live``'s activation (before it runs them);
        returns those it took (the others were taken already). Those it took are no
        doubt of an earlier hand-over any more (its taker queues them).

        Raises:
            SubagentError: the store's; one that may have committed all the same
                (``_write_faults.unsure``) leaves them in doubt, for the caller to settle
                (see :mod:`._doubts`).
        """
        store = self.persistence
        assert store is not None
        assert live.token is not None
        taken: list[MessageId] = self._call(
            store.hand_over, session_id, message_ids, live.token[1], lease=live.token
        )
        if taken:
            self.doubts.forget(session_id, taken)
        return taken

    def owe(
        self,
        live: LiveSession,
        add: Sequence[MessageId] = (),
        drop: Sequence[MessageId] = (),
        clear: bool = False,
    ) -> None:
        """Queue a change of the store's record of ``live``'s open promises (the
        sweep's accepted work: ``subagents.store._promises``) behind the session's
        writes so far: promises ``add``-ed, kept ones dropped, all of them first with
        ``clear``. Only a leased activation, on a store that keeps promises, has
        them recorded (nothing sweeps the others)."""
        writer = self._writer
        if live.token is None or writer is None or self._promising() is None:
            return
        if add or drop or clear:
            writer.submit("owe", live.header.id, (live.token, tuple(add), tuple(drop), clear))

    def has_work(self, session_id: SessionId) -> bool:
        """Whether ``session_id`` has accepted work: messages not done in its inbox,
        or promises open (their stand-ins or results to deliver)."""
        return bool(self.pending(session_id)) or self.owes(session_id)

    def owes(self, session_id: SessionId) -> bool:
        """Whether the store records promises open for ``session_id``."""
        store = self._promising()
        return store is not None and bool(self._call(store.owed, session_id))

    def _promising(self) -> Promises | None:
        """The store, if it keeps promises."""
        store: object = self.persistence
        return store if isinstance(store, Promises) else None

    def stop_writes(self, live: LiveSession, error: SubagentError) -> None:
        """``live``'s activation cannot go on -- it would run what the store does not
        know it took -- so it ends as one whose write failed: its later writes are
        dropped, its agent stops, and the next activation replays from the store."""
        if self._writer is not None:
            self._writer.fail(live.id, error)
        else:  # no store: nothing to replay from, nothing to keep out of it
            self._failed(live.id, error)

    def give_back(
        self, session_id: SessionId, message_ids: Sequence[MessageId], epoch: int
    ) -> None:
        """Messages activation ``epoch`` took and will not run go back to nobody."""
        store = self.persistence
        assert store is not None
        self._call(store.give_back, session_id, message_ids, epoch)

    def wake_address(self, session_id: SessionId) -> str | None:
        """The doorbell of the runtime holding ``session_id``'s lease when that is
        another live runtime; None when nobody else does (or the store cannot say).

        A lease that expired, or whose holder is a process of this host that has
        ended, has no live holder: a ring to it is not an answer. (A host's
        doorbell to a dead process fails; a store's ``NOTIFY`` succeeds with
        nobody listening, so on PostgreSQL such a lease was taken for a live
        holder and what waited for it never ran.)"""
        store = self.persistence
        leases = self.leases
        if store is None or leases is None:
            return None
        try:
            # Off the hub on gevent, as every store call: a server that hangs must
            # hang this call only, not every greenlet.
            lease = self._call(store.get_lease, session_id)
        except SubagentError:
            return None
        return None if lease is None else self._elsewhere(lease)

    def wake_addresses(self, session_ids: list[SessionId]) -> dict[SessionId, str]:
        """:meth:`wake_address` of many sessions, in one store read: those another
        live runtime holds, by session.

        Raises:
            SubagentError: the store's: it could not say.
        """
        store = self.persistence
        if store is None or self.leases is None or not session_ids:
            return {}
        leases = self._call(store.get_leases, session_ids)
        found = {sid: self._elsewhere(lease) for sid, lease in leases.items()}
        return {sid: wake for sid, wake in found.items() if wake is not None}

    def _elsewhere(self, lease: Any) -> str | None:
        """The wake address of ``lease``'s holder when that is another live runtime."""
        leases = self.leases
        assert leases is not None
        if lease.holder in (None, leases.holder.id):
            return None
        if lease.expires <= leases.now() or leases.holder.dead(lease.holder, lease.wake):
            return None
        wake: str | None = lease.wake
        return wake

    def listen(self) -> Listener | None:
        """The store's wake-up channel for this runtime, if it has one (see
        :meth:`subagents.store.SessionStore.listen`)."""
        store = self.persistence
        if store is None:
            return None
        listener: Listener | None = self._call(store.listen)
        return listener

    def ring(self, address: str | None, payload: bytes, patience: float = 0.0) -> bool:
        """Wake the runtime at ``address`` (a lease's ``wake``) with ``payload``: through
        the store when the address is one of its channels, else the host's doorbell
        (``patience``: seconds to ring again while its buffer is full, see
        :func:`~subagents.actors._kernel.ring`). A hint: False when it could not be
        delivered, never an error."""
        if not address or type(address) is not str:
            return False
        store = self.persistence
        if store is not None and not address.startswith(("@", "/")):
            try:
                delivered: bool = self._call(store.notify, address, payload)
            except SubagentError as exc:
                logger.debug("ringing %s through the store failed: %s", address, exc)
                return False
            return delivered
        return ring(address, payload, patience, self._backend.sleep)

    def once(
        self,
        scope: SessionId,
        message_id: MessageId,
        accept: Callable[[], _T],
        duplicate: Callable[[], _T],
        signal: AbortSignal = _NEVER,
    ) -> _T:
        """Relaxed deduplication of one acceptance: ``accept()`` when this runtime
        has not accepted ``message_id`` for ``scope`` (the session it is for), its
        claim given back if ``accept`` raises; else ``duplicate()``. One acceptance
        of an id is under way at a time: a repeat waits for its outcome (see
        :mod:`._underway`), so "duplicate" is said only of an accepted message.

        Raises:
            SubagentError: ``accept``'s; ``CANCELLED`` when ``signal`` aborts while
                the repeat waits.
        """
        key = (scope, message_id)
        underway = self.underway
        underway.enter(key, signal)
        try:
            if not self.claim(scope, message_id):
                return duplicate()
            try:
                return accept()
            except BaseException:
                self.unclaim(scope, message_id)
                raise
        finally:
            underway.leave(key)

    def claim(self, scope: SessionId, message_id: MessageId) -> bool:
        """Relaxed deduplication: True for the first claim of ``(scope, id)`` this
        runtime remembers (the caller then delivers it, or :meth:`unclaim` s it)."""
        key = (scope, message_id)
        with self._seen_lock:
            seen = key in self._seen
            if not seen:
                self._seen[key] = True
                if len(self._seen) > SEEN_MAX:
                    self._seen.popitem(last=False)
        if seen:
            self._deduplicated(scope, None)
            return False
        return True

    def unclaim(self, scope: SessionId, message_id: MessageId) -> None:
        """Forget a claim whose delivery failed (the id may be used again)."""
        with self._seen_lock:
            self._seen.pop((scope, message_id), None)
