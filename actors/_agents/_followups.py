"""An agent's ``followup``: its arguments checked, then accepted -- committed first
under strict durability, deduplicated by id -- as a turn, or steered into the
running one (see :mod:`._steering`). When the runtime traces, the acceptance is a
``subagents.followup`` span and the message carries it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any, Literal, overload

from subagents.actors._kernel._telemetry import stamp, traced
from subagents.protocol import (
    ErrorCode,
    MessageEvent,
    MessageId,
    MessageSource,
    ReportEvent,
    SubagentError,
    check_source,
    check_value,
    new_message_id,
    trusted_message,
)
from subagents.store import Accepted, InboxEntry

from ._ahead import committed_at, keep_untaken
from ._commits import Commits
from ._doubts import DOUBT_GRACE
from ._inbox import Inbox
from ._kept import kept
from ._messages import plain
from ._steering import Steered, check_steer, not_open
from ._write_faults import doubted, unsure

__all__ = ["DOUBT_GRACE", "Followups"]

#: A top-level follow-up's source when it names none and must carry a trace.
USER = MessageSource(kind="user")
#: Held while messages in doubt are settled: a follow-up that finds some waits, and
#: runs after them (held for no store call).
_SETTLING = threading.Lock()


class Followups(Inbox):
    """The follow-up half of :class:`~._agent.Agent` (built on its inbox)."""

    #: Messages this activation tried to commit and cannot say whether it did (see
    #: :meth:`_settle_unsure`), in acceptance order; None: none ever.
    _unsure: dict[MessageId, float] | None = None  # (when each was first in doubt)
    _commits: Commits  # (the agent's: see ._commits)

    @overload
    def followup(
        self,
        content: Any,
        *,
        source: MessageSource | None = None,
        message_id: MessageId | None = None,
        steer: Literal[False] = False,
    ) -> MessageId: ...

    @overload
    def followup(
        self,
        content: Any,
        *,
        source: MessageSource | None = None,
        message_id: MessageId | None = None,
        steer: Literal[True, "strict"],
    ) -> Steered: ...

    def followup(
        self,
        content: Any,
        *,
        source: MessageSource | None = None,
        message_id: MessageId | None = None,
        steer: bool | str = False,
    ) -> MessageId | Steered:
        """Submit one message; it becomes exactly one FIFO turn. Returns its id.

        ``steer=True`` hands it to the running turn instead, if one is open (it
        sees it at its next safe point, :meth:`Turn.steering`), else queues it;
        ``steer="strict"`` raises ``TURN_NOT_OPEN`` rather than queue (under
        strict durability, one whose commit cannot be taken back -- the store
        refuses, or a repeat of its ``message_id`` was accepted meanwhile -- is
        accepted all the same: ``queued``). Either returns a :class:`Steered` (the
        id, and ``steered`` / ``queued`` / ``duplicate``); see
        ``_agents/_steering.py``.

        Under strict durability the message is committed to the session's inbox
        before this returns. ``message_id`` makes it idempotent: the same id again
        returns it and queues nothing (see ``docs/durability.md`` for how long ids
        are remembered). Refused after its commit and taken back, it raises the
        refusal; when it cannot be taken back (see above), it stays accepted and
        runs once: the call returns its id.

        Raises:
            SubagentError: ``AGENT_DISPOSED``; ``PERSISTENCE_UNAVAILABLE`` once
                the session's writes failed (``runtime.sessions.statistics()``
                lists it); ``ENCODE_ERROR`` for content the
                session log cannot represent; ``INVALID_ARGUMENT``; the store's
                error when it cannot commit (nothing accepted -- unless the
                connection was lost at the commit, which may have happened: then
                the message runs once, in order, and a retry with its
                ``message_id`` -- the error's ``hint["message_id"]`` -- returns
                it); ``TURN_NOT_OPEN`` (a strict steer
                found no open turn: nothing accepted).
        """
        strict_steer = None if steer is False else check_steer(steer)
        if source is not None:
            if not isinstance(source, MessageSource):
                raise SubagentError(
                    "source must be a MessageSource", code=ErrorCode.INVALID_ARGUMENT
                )
            check_source(source)  # what the log holds, also where nothing is encoded yet
        if message_id is not None and type(message_id) is not MessageId:
            message_id = MessageId(message_id)
        if not plain(content):
            check_value(content)  # refuse what the log cannot hold before anything is accepted
        tel = self._host.telemetry
        if tel is not None:  # a span of its own; the message carries it (a user's, unsaid)
            accept, src = self._accept, USER if source is None else source
            return traced(
                tel, "subagents.followup", {"session_id": self.session_id},
                lambda: accept(content, stamp(tel, src), message_id, strict_steer),
            )  # fmt: skip
        return self._accept(content, source, message_id, strict_steer)

    def _accept(
        self,
        content: Any,
        source: MessageSource | None,
        message_id: MessageId | None,
        strict_steer: bool | None,
    ) -> MessageId | Steered:
        """``followup`` once its arguments are checked."""
        sessions = self._host.sessions
        if self._disposed:  # before the store, which would say LEASE_LOST after a takeover
            raise self._disposed_error()
        if strict_steer is not None:
            return self._steer(content, source, message_id, strict_steer)
        if not sessions.strict:
            if message_id is None:
                return self.deliver(content, source)
            # A repeat of an id under way waits for its outcome (the agent disposed
            # meanwhile accepts nothing): see SessionService.once.
            given = message_id
            return sessions.once(
                self.session_id,
                given,
                lambda: self.deliver(content, source, message_id=given),
                lambda: given,
            )
        mid = message_id if message_id is not None else new_message_id()
        if self._session.replay_due:  # resumed, its replay not queued yet: after it
            keep_untaken(sessions, self.session_id, trusted_message(mid, content, source))
            return mid
        commits = self._commits  # its release waits for this delivery or take-back
        if not commits.enter():
            raise self._disposed_error()  # its release began
        try:
            accepted = self._commit(mid, content, source)
            if accepted.duplicate:
                return mid
            # Messages committed before it that nobody took yet run first (FIFO).
            with committed_at(sessions, self, accepted):
                try:
                    return self.deliver(content, source, message_id=mid)
                except BaseException as refused:
                    # Taken back -- unless it is not ours to take back (the store
                    # could not, a repeat of its id was accepted since, the runtime
                    # closes): then it runs at the session's next activation (kept).
                    if self._stays(mid, refused, accepted) and isinstance(refused, Exception):
                        return mid
                    raise
        finally:
            commits.exit()

    def _steer(
        self, content: Any, source: MessageSource | None, message_id: MessageId | None, strict: bool
    ) -> Steered:
        """``followup(..., steer=...)`` once the arguments are checked."""
        sessions = self._host.sessions
        mid = message_id if message_id is not None else new_message_id()
        if not sessions.strict:
            if message_id is None:
                return self._steer_or_queue(content, source, mid, strict)
            return sessions.once(
                self.session_id,
                mid,
                lambda: self._steer_or_queue(content, source, mid, strict),
                lambda: Steered(mid, "duplicate"),
            )
        if self._session.replay_due:  # resumed, its replay not queued yet: no turn is
            if strict:  # open, and a queued one goes after the replay
                raise not_open(self.session_id)
            seen = keep_untaken(sessions, self.session_id, trusted_message(mid, content, source))
            return Steered(mid, "duplicate" if seen else "queued")
        # Committed first, as every accepted message is; taken back if refused.
        accepted = self._commit(mid, content, source)
        if accepted.duplicate:
            return Steered(mid, "duplicate")
        with committed_at(sessions, self, accepted):  # queued, it runs after those
            if self.steer_in(content, source, mid):
                return Steered(mid, "steered")
            if strict:
                refused = not_open(self.session_id)
                if not self._stays(mid, refused, accepted):
                    raise refused  # taken back: nothing accepted
                # It stays accepted: no steer any more, a follow-up of the inbox,
                # queued now (it would wait for the next activation otherwise).
            try:
                return Steered(self.deliver(content, source, message_id=mid), "queued")
            except BaseException as refused:
                if self._stays(mid, refused, accepted) and isinstance(refused, Exception):
                    return Steered(mid, "queued")  # it runs at the next activation
                raise

    def _stays(self, mid: MessageId, refused: BaseException, accepted: Accepted) -> bool:
        """Whether ``mid``, committed (``accepted``) by this activation and then
        ``refused``, stays accepted: it could not be taken back (see ``kept``)."""
        sessions = self._host.sessions
        return kept(sessions, self.session_id, mid, refused, accepted.at, self._session)

    def _commit(
        self,
        mid: MessageId,
        content: Any,
        source: MessageSource | None,
        limit: int | None = None,
    ) -> Accepted:
        """:meth:`_commit_event` of a message."""
        return self._commit_event(trusted_message(mid, content, source), limit)

    def _commit_event(
        self, event: MessageEvent | ReportEvent, limit: int | None = None
    ) -> Accepted:
        """Commit one message (or report) to the session's inbox, handed to this
        activation -- after what an earlier commit left in doubt is settled (it was
        accepted first). A commit that may have happened all the same is in doubt
        from now on: settled by a retry with its id, the next follow-up, or the mail
        pickup. ``limit``: the inbox bound it is checked against (a continuable
        child's).

        Raises:
            SubagentError: the store's (what was in doubt stays so); one that
                leaves this message in doubt (``PERSISTENCE_UNAVAILABLE``) names
                it in ``hint["message_id"]``, with ``hint["in_doubt"]``.
        """
        mid = event.message_id
        since = None
        if self._unsure:
            self._settle_unsure()  # (accepted before this one)
            # A retry of a message still in doubt is this call's to settle: out of the
            # doubts while it commits, or the pickup, settling them meanwhile, would
            # queue the very commit this call delivers (run twice).
            with _SETTLING:
                since = self._unsure.pop(mid, None) if self._unsure else None
        try:
            (accepted,) = self._host.sessions.accept(self.session_id, [event], self._session, limit)
        except SubagentError as exc:
            back = None if since is None else {mid: since}  # (still in doubt, as before)
            if not unsure(exc):
                if back:
                    self._doubt((), back)
                raise
            self._doubt((mid,), back)
            # Its id, for a caller who gave none: a retry with it is accepted once.
            text = str(exc.args[0]) if exc.args else ""
            raise doubted(text, exc, mid) from exc.__cause__  # (the store's own cause)
        if since is not None and accepted.duplicate:
            # The commit in doubt had landed: settled from the store (queued when this
            # activation holds it), not by the caller. Else this commit is the one.
            self._doubt((), {mid: since})
            self._settle_unsure()
        return accepted

    def _doubt(
        self, message_ids: Iterable[MessageId], since: dict[MessageId, float] | None = None
    ) -> None:
        """``message_ids`` were committed, or not, by this activation (see
        :meth:`_settle_unsure`); this runtime's mail pickup is asked to settle them.
        ``since``: messages in doubt from an earlier time (put back, their grace kept)."""
        now = time.monotonic()
        with _SETTLING:
            if self._unsure is None:
                self._unsure = {}
            for mid, when in (since or {}).items():
                self._unsure.setdefault(mid, when)
            for mid in message_ids:
                self._unsure.setdefault(mid, now)
        self._host.sessions.wake_pickup(self.session_id)

    def _in_doubt(self) -> list[MessageId]:
        """The messages in doubt (see :meth:`_settle_unsure`), oldest first."""
        unsure = self._unsure
        return list(unsure) if unsure else []

    def _settle_unsure(
        self,
        asked: Sequence[MessageId] | None = None,
        entries: Sequence[InboxEntry] = (),
        handed: Sequence[InboxEntry] = (),
    ) -> None:
        """Settle the messages in doubt: those the store holds taken by this
        activation -- committed, the answer lost -- are queued, in acceptance order
        (with ``handed``, messages the caller took for it, in theirs); those it
        shows otherwise are not this activation's to run, and are forgotten; those
        it does not show stay in doubt for :data:`DOUBT_GRACE` seconds (a commit
        the server is still finishing), then are taken as never committed.

        ``asked``: the messages in doubt before ``entries`` (the session's pending
        messages) were read; by default both are read here.

        Raises:
            SubagentError: the store's, when it cannot say (they stay in doubt);
                ``AGENT_DISPOSED``.
        """
        if asked is None:
            asked = self._in_doubt()
            if not asked:
                return
            entries = self._host.sessions.pending(self.session_id)
        token = self._session.token
        epoch = None if token is None else token[1]
        with _SETTLING:
            unsure = self._unsure or {}
            mine = {mid for mid in asked if mid in unsure}
            found = [e for e in entries if e.message_id in mine and e.epoch == epoch]
            seen = {e.message_id for e in entries}
            try:
                self._queue(sorted([*found, *handed], key=lambda e: e.n))
            finally:
                now = time.monotonic()
                for mid in mine:
                    if mid in seen or now - unsure[mid] >= DOUBT_GRACE:
                        del unsure[mid]

    def _queue(self, entries: list[InboxEntry]) -> None:
        """Deliver inbox ``entries`` this activation took and never ran, in order."""
        self._turns.from_inbox(e.message_id for e in entries)
        for entry in entries:
            event = entry.event
            if isinstance(event, MessageEvent):
                self.deliver(event.content, event.source, message_id=event.message_id)
            elif event.delivery == "waking":
                self.deliver(
                    event.content, event.source, kind="report", message_id=event.message_id
                )
            else:
                self.inject_quiet(event.content, event.source, event.message_id)

    def _steer_or_queue(
        self, content: Any, source: MessageSource | None, mid: MessageId, strict: bool
    ) -> Steered:
        if self.steer_in(content, source, mid):
            return Steered(mid, "steered")
        if strict:
            raise not_open(self.session_id)
        return Steered(self.deliver(content, source, message_id=mid), "queued")
