"""An agent's inbox: admission, the gate, quiescence and cancellation.

:class:`Inbox` is the part of :class:`~._agent.Agent` that callers race on. It
owns a counter of accepted messages, the count in flight, the discard watermark
of a cancel without ``keep_inbox``, and the gate, and changes them together under
one native lock held for a few bytecodes -- never across a call out or a greenlet
switch, so it excludes threads and greenlets alike.

The gate is how admission is closed atomically with respect to quiescence:

* ``OPEN`` -- everything is admitted;
* ``DRAINED`` -- a drain cutoff covers this continuable child: follow-ups through
  the continuation manager are refused with ``ADMISSION_CLOSED``;
* ``CLOSED`` -- the agent is retiring or disposed: nothing is admitted.

The registry asks for ``DRAINED`` (:meth:`Inbox.close_admission`) and ``CLOSED``
(:meth:`Inbox.close_if_idle`: only while nothing is in flight), decided on the
agent's own state: a follow-up is admitted before the gate moved (and counted:
the agent is not idle) or refused after it.

``cancel(cause, keep_inbox=...)`` is out of band: it aborts the running turn's
signal (the actor is busy running it); ``keep_inbox=False`` skips unrun what was
accepted before it (the discard watermark). What the cut turn took is not requeued.

Quiescence: ``idle`` is "nothing in flight"; idle listeners run in the actor's
context each time, ``wait_idle`` waits for it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import pykka
from subagents.actors._kernel._backend import EventLike
from subagents.actors._kernel._checks import check_listener, check_timeout
from subagents.actors._kernel._listeners import hear
from subagents.protocol import (
    ErrorCode,
    Event,
    InboxFullError,
    MessageId,
    MessageSource,
    SessionId,
    SubagentError,
    new_message_id,
)

from ._host import AgentHost
from ._live import LiveSession
from ._loop import TurnRunner
from ._messages import UNTAKEN, Call, Deliver, Quiet
from ._outcome import TurnOutcome
from ._stats import AgentStatistics, agent_statistics
from ._steered import discard_steered, requeue_steered, settle_steered
from ._steering import SteerBox
from ._turn import Message

__all__ = ["CLOSED", "DRAINED", "OPEN", "Inbox"]

logger = logging.getLogger("subagents")

OPEN: Final = 0
DRAINED: Final = 1
CLOSED: Final = 2


class Inbox:
    """Admission into an agent's inbox (see the module docstring)."""

    # Set by the Agent that is built on it.
    _host: AgentHost
    _turns: TurnRunner
    _ref: pykka.ActorRef[Any]
    _session: LiveSession

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # Made by the first wait_idle() that finds the agent busy, dropped when it
        # next goes idle (an Event set and cleared every turn cost 0.9 us a turn).
        self._idle_waiter: EventLike | None = None
        self._accepted = 0  # messages accepted so far (monotone)
        # Statistics: calls, steered leftovers requeued (of _accepted), steered.
        self._calls = self._requeued = self._steered = 0
        self._inflight = 0
        self._quiet = 0  # of _inflight, quiet reports: no inbox bound counts them
        self._steering = 0  # of _inflight, steered into a turn, not yet settled
        self._discard_through = 0  # messages with n <= this are skipped (cancel without inbox)
        self._gate = OPEN
        self._disposed = False
        self._idle_listeners: list[Callable[[Any], object]] = []
        self._dispose_listeners: list[Callable[[Any], object]] = []
        self.idle_since = time.monotonic()  # when the agent last became quiescent

    @property
    def session_id(self) -> SessionId:
        raise NotImplementedError

    def _disposed_error(self) -> SubagentError:
        # Stopped by a failed write (or a fork): say so, whichever check met it first.
        sessions = self._host.sessions
        return (
            sessions.inherited
            or sessions.failures.error(self.session_id)
            or SubagentError(f"agent {self.session_id} is disposed", code=ErrorCode.AGENT_DISPOSED)
        )

    def forked(self) -> None:
        """In the child of a fork: the parent's agent; it accepts nothing here (no
        lock taken: a thread of the parent's may have held it)."""
        self._disposed = True
        self._gate = CLOSED

    # -- admission -------------------------------------------------------------------

    def _count_in(self, drop: bool = False, call: bool = False, quiet: bool = False) -> int:
        """Under ``self._lock``: number one more message, counted in flight; its
        caller puts it in the mailbox before it lets go of the lock. A dispose
        marks the agent under this lock before it tells the actor to stop, so a
        message accepted here is queued ahead of that stop (put after it, pykka's
        teardown dropped it: accepted, and never run nor logged)."""
        if self._gate is CLOSED or self._disposed or self._ref.actor_stopped.is_set():
            raise self._disposed_error()
        self._accepted += 1
        self._inflight += 1
        self._quiet += quiet
        if call:  # in the same step: accepted messages never count it, even briefly
            self._calls += 1
        if drop:
            self._discard_through = self._accepted
        return self._accepted

    def deliver(
        self,
        content: Any,
        source: MessageSource | None,
        *,
        kind: str = "message",
        extra: tuple[Event, ...] = (),
        on_end: Callable[[TurnOutcome], object] | None = None,
        message_id: MessageId | None = None,
        drop: bool = False,
        redelivered: bool | int = False,
    ) -> MessageId:
        """Accept one turn; the caller has validated ``content`` and ``source``.

        ``drop=True`` accepts it and, in the same step, discards it and everything
        accepted before it unrun (a child published below a drain cutoff);
        ``redelivered=True``: it may have run before (a replay after a crash).

        Raises:
            SubagentError: ``AGENT_DISPOSED`` once the gate is closed.
        """
        mid = message_id if message_id is not None else new_message_id()
        with self._lock:
            n = self._count_in(drop)
            mailbox: Any = self._ref.actor_inbox  # (our messages are their own envelopes)
            mailbox.put(Deliver(n, mid, content, source, kind, extra, on_end, redelivered))
        return mid

    def admit_followup(
        self,
        content: Any,
        source: MessageSource,
        message_id: MessageId,
        untaken: bool = False,
        limit: int | None = None,
    ) -> bool:
        """A continuation follow-up: admitted (True), or the agent is retiring (False).

        ``untaken``: it is in the durable inbox, taken by no activation yet.
        ``limit``: the inbox's bound, counted here (what is in flight: waiting or
        running) -- for a follow-up no store counted.

        Raises:
            SubagentError: ``ADMISSION_CLOSED`` below a drain cutoff; ``INBOX_FULL``.
        """
        with self._lock:
            gate = self._gate
            if gate is not OPEN or self._disposed:
                if gate is DRAINED and not self._disposed:
                    raise SubagentError(
                        "admission is closed below this parent (drained)",
                        code=ErrorCode.ADMISSION_CLOSED,
                    )
                return False
            if limit is not None and self._inflight - self._quiet >= limit:
                raise InboxFullError(str(self.session_id), limit, self._inflight - self._quiet)
            ref = self._ref
            if ref.actor_stopped.is_set():
                raise self._disposed_error()
            self._accepted += 1
            self._inflight += 1
            flag = UNTAKEN if untaken else False
            mailbox: Any = ref.actor_inbox  # in the locked step, as _count_in says why
            mailbox.put(
                Deliver(self._accepted, message_id, content, source, "message", (), None, flag)
            )
        return True

    def inject_quiet(
        self,
        content: Any,
        source: MessageSource | None,
        message_id: MessageId,
        *,
        drop: bool = False,
    ) -> None:
        """Accept a quiet report (context of the next turn); ``content`` is validated.
        ``drop`` as for :meth:`deliver`."""
        with self._lock:
            n = self._count_in(drop, quiet=True)
            mailbox: Any = self._ref.actor_inbox
            mailbox.put(Quiet(n, message_id, content, source))

    def steer_in(
        self,
        content: Any,
        source: MessageSource | None,
        message_id: MessageId,
        *,
        continuation: bool = False,
    ) -> bool:
        """Hand one validated message to the running turn (see :mod:`~._steering`):
        True when steered; False when no turn is open for it (none runs, it was
        cancelled, or the agent is retiring) -- then nothing was done.

        ``continuation``: a parent's follow-up, refused below a drain cutoff.

        Raises:
            SubagentError: ``ADMISSION_CLOSED`` (a continuation below a drain cutoff).
        """
        with self._lock:
            if self._disposed or self._gate is CLOSED:
                return False
            if continuation and self._gate is DRAINED:
                raise SubagentError(
                    "admission is closed below this parent (drained)",
                    code=ErrorCode.ADMISSION_CLOSED,
                )
            turn = self._turns.current
            if turn is None or turn.cancelled:
                return False
            box = turn._steer
            if box is None:
                box = turn._steer = SteerBox()
                # A run of queued turns reads the box without this lock once the turn
                # ended (``_run``: current cleared first): published, then current read
                # again -- the run sees this box, or this sees the turn over.
                if self._turns.current is not turn:
                    return False
            box.messages.append(Message(message_id=message_id, content=content, source=source))
            box.marks.append(self._accepted)  # its place: after what was accepted so far
            self._steered += 1
            self._inflight += 1  # a place in the bound until it settles (see _steered)
            self._steering += 1
            return True

    def _settle_handled(self, ended: Any, quiet: bool = False, count: int = 1) -> bool:
        """The ``count`` messages just handled are settled (True: the agent is idle
        now; a run of turns settles once, see ``_run``); when the last
        was a turn (``ended``), the messages steered into it that it never took run
        as turns of their own in acceptance order (``_steering.run_next``) -- counted
        in the same locked step, so the agent is never idle in between; the lock
        orders this after every steer that saw the turn open. A cancel that dropped
        the inbox after the turn was accepted drops those too
        (``_steered.discard_steered``)."""
        box = None if ended is None else ended._steer
        if box is not None and ended._delivered.n <= self._discard_through:
            discard_steered(self, box)
            self._turns.ended = None  # the discards' own ends: nothing to settle
        rest: list[tuple[int, Message]] | None = None
        with self._lock:
            if ended is not None:
                box = ended._steer
                if box is not None:  # its steered messages settle too (see _steered)
                    rest = settle_steered(self, box)
            self._inflight -= count
            self._quiet -= quiet
            idle = self._inflight == 0
            if idle:
                self.idle_since = time.monotonic()
                waiter = self._idle_waiter
                if waiter is not None:
                    self._idle_waiter = None
                    waiter.set()
        if rest:
            requeue_steered(self, rest)
        return idle

    def call_in_loop(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` in the actor's context after everything accepted so far."""
        with self._lock:
            n = self._count_in(call=True)
            mailbox: Any = self._ref.actor_inbox
            mailbox.put(Call(n, fn))

    def close_admission(self) -> None:
        """A drain cutoff covers this agent: refuse continuation follow-ups from now on."""
        with self._lock:
            if self._gate is OPEN:
                self._gate = DRAINED

    def close_if_idle(self) -> bool:
        """Close the gate for good if nothing is in flight; True when closed.

        The one atomic step that lets a quiescent continuable child retire: a
        follow-up admitted before it makes the agent busy (False), one after it is
        refused.
        """
        with self._lock:
            if self._inflight:
                return False
            self._gate = CLOSED
            return True

    # -- statistics -----------------------------------------------------------------

    def statistics(self) -> AgentStatistics:
        """A snapshot of this agent's mailbox and turns (see :class:`AgentStatistics`).

        Cheap: counters read without a lock; under strict durability one store read
        (the durable inbox's depth: ``None`` once the runtime and its store closed).
        """
        sessions = self._host.sessions
        sessions.check_process()
        durable = None
        if sessions.strict and sessions.persistence is not None:
            try:
                durable = len(sessions.pending(self.session_id))
            except SubagentError as exc:  # the runtime closed: its store with it
                if exc.code != ErrorCode.STORE_CLOSED:
                    raise
        return agent_statistics(
            self.session_id, self._counts(), self._turns.times, durable, self._session
        )

    def _counts(self) -> tuple[bool, int, int, int, int, int]:
        """``(running, inbox, turns, accepted, replayed, reports pending)``: the
        counters alone, read without a lock (what the runtime's statistics sum)."""
        loop = self._turns
        running = loop.current is not None
        accepted = self._accepted - self._calls - self._requeued + self._steered
        inbox = max(0, self._inflight - self._steering - running)
        return running, inbox, loop.turns_ended, accepted, loop.replayed, len(loop.context)

    # -- cancellation and quiescence ----------------------------------------------

    def cancel(
        self, cause: Any = None, *, keep_inbox: bool = True, keep_accepted: bool = False
    ) -> None:
        """Abort the running turn's signal; returns without waiting.

        With ``keep_inbox=True`` queued messages still run later, in order; with
        ``False`` every message accepted before this call is skipped: logged as a
        turn that ended ``cancelled`` unrun (a quiet report waits for the next
        turn instead). Work claimed into the interrupted turn is not requeued
        either way. Skipped messages leave the durable inbox too, unless
        ``keep_accepted=True`` (the runtime is closing): then they -- and the
        message of a turn this cancels -- stay accepted and run at the session's
        next activation (the cancelled turn's as a redelivery), and so does every
        message it accepts from now on, behind them: this activation runs no more.
        """
        with self._lock:
            # The watermark first, then the turn: a turn published meanwhile (its
            # message taken before the watermark moved) reads the watermark after
            # it published itself, so one of the two sees the other (see run_turn).
            if not keep_inbox:
                self._discard_through = self._accepted
            if keep_accepted:
                self._turns.keep_accepted = True
            turn = self._turns.current
            controller = turn._controller_locked() if turn is not None else None
        if controller is not None:
            controller.abort(cause if cause is not None else "cancelled")

    @property
    def idle(self) -> bool:
        """True when nothing is in flight (no queued message, no open turn)."""
        return self._inflight == 0

    @property
    def running_turn(self) -> int | None:
        """The turn running now, or ``None``."""
        turn = self._turns.current
        return None if turn is None else turn.index

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until quiescent; True when idle, False on timeout. Idle listeners
        run in the actor once it is idle: maybe still (or not yet) when this returns.

        Raises:
            SubagentError: ``WRONG_THREAD`` from a foreign OS thread on gevent.
        """
        self._host.check_thread()
        timeout = check_timeout(timeout)
        with self._lock:
            if self._inflight == 0:
                return True
            waiter = self._idle_waiter
            if waiter is None:
                waiter = self._idle_waiter = self._host.backend.event()
        return bool(waiter.wait(timeout))

    def add_idle_listener(self, fn: Callable[[Any], object]) -> Callable[[], None]:
        """Call ``fn(agent)`` in the actor's context whenever it becomes idle."""
        check_listener(fn)
        self._idle_listeners.append(fn)
        return lambda: self._idle_listeners.remove(fn) if fn in self._idle_listeners else None

    def add_dispose_listener(self, fn: Callable[[Any], object]) -> None:
        """Call ``fn(agent)`` once the agent is disposed (in its ``on_stop``), once per fn."""
        check_listener(fn)
        if fn not in self._dispose_listeners:  # (each drain of a parent adds its own)
            self._dispose_listeners.append(fn)

    def _settle_one(self) -> bool:
        """One message settled that was no turn (True: the agent is idle now)."""
        return self._settle_handled(None)

    # -- the actor side ------------------------------------------------------------

    def _handle(self, message: Any) -> None:
        turns = self._turns
        try:
            if message.n <= self._discard_through or (
                turns.keep_accepted and type(message) is not Call and turns.kept(message)
            ):
                # (Accepted after the closing runtime's cancel too: run here, it
                # would run ahead of what that cancel kept for the next activation.)
                turns.discard(message)
            elif type(message) is Deliver:  # a turn: the common case, one call less
                turns.run_turn(message)
            else:
                turns.handle(message)
        finally:
            ended, turns.ended = turns.ended, None
            self._settle_and_tell(ended, ended is None and type(message) is Quiet)

    def _settle_and_tell(self, ended: Any, quiet: bool, count: int = 1) -> None:
        """:meth:`_settle_handled`, in the actor: idle listeners hear what made it idle."""
        if self._settle_handled(ended, quiet, count) and self._idle_listeners:
            for fn in list(self._idle_listeners):
                hear(fn, self, "idle listener")
