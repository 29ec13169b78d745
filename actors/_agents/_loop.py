"""An agent's turns: what its actor does with each message of its inbox.

:class:`TurnRunner` holds the state only the agent's actor touches -- the
behaviour, the turn counter, the quiet reports waiting for the next turn, the
running turn -- and turns each :class:`~._messages.Deliver` into exactly one turn:
``turn/start``, the quiet reports, the delivered message, the behaviour, then
``turn/end`` (stop reason ``completed`` / ``cancelled`` / ``failed``). ``current``
is the one field read from outside: ``cancel()`` reads it, under the agent's
lock, to abort the running turn's signal.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from greenlet import GreenletExit
from subagents.actors._kernel._checks import utcnow
from subagents.actors._kernel._fork import abandon
from subagents.actors._kernel._telemetry import Telemetry
from subagents.protocol import (
    ErrorCode,
    ExpectedEvent,
    MessageId,
    MessageSource,
    SubagentError,
    TurnRecord,
    encode_event,
    error_text,
    trusted_message,
)

from ._ahead import take_one
from ._behaviours import Behaviour, turn_function
from ._expected import Owed, arrived
from ._host import AgentHost
from ._live import LiveSession
from ._messages import UNTAKEN, Call, Deliver, Quiet, plain
from ._outcome import CLOSED_ONE_SHOT, DISCARDED, KEPT, TurnOutcome, notify
from ._output import validate_output
from ._stats import WINDOW
from ._turn import Message, Turn, TurnAgent

__all__ = ["KEPT", "TurnRunner"]

_time = time.time
logger = logging.getLogger("subagents")


class TurnRunner:
    """The turns of one agent (see the module docstring)."""

    __slots__ = (
        "_agent",
        "_behaviour",
        "_host",
        "_lock",
        "_on_turn",
        "_output_schema",
        "_session",
        "context",
        "current",
        "ended",
        "expecting",
        "inboxed",
        "keep_accepted",
        "keeps_context",
        "next_turn",
        "one_shot",
        "owed",
        "replayed",
        "times",
        "turns_ended",
    )

    def __init__(
        self,
        agent: TurnAgent,
        host: AgentHost,
        session: LiveSession,
        behaviour: Behaviour,
        *,
        next_turn: int,
        output_schema: Any,
        lock: Any,
    ) -> None:
        self._agent = agent
        self._host = host
        self._session = session
        self._behaviour = behaviour
        self._on_turn = turn_function(behaviour)
        self._output_schema = output_schema
        self._lock = lock
        self.next_turn = next_turn
        self.context: list[Message] = []  # quiet reports for the next turn
        self.current: Turn | None = None
        # The turn that just ended, for the inbox to settle its steered leftovers.
        self.ended: Turn | None = None
        # The runtime is closing: what is not completed stays in the durable inbox.
        self.keep_accepted = False
        # Relaxed durability: the messages handed to it from the durable inbox (a
        # strict process's, or left by a crash), kept and completed there as every
        # message is under strict durability (None: none so far).
        self.inboxed: set[MessageId] | None = None
        # Leaving with a checkpoint: it keeps the quiet reports no turn saw.
        self.keeps_context = False
        # Messages promised to the session (see ._expected): the running turn's,
        # and those of ended turns that did not arrive yet (None: none).
        self.expecting: Owed | None = None
        self.owed: Owed | None = None
        self.one_shot = False  # a one-shot child's: nothing runs its messages again
        # Statistics: turns run to their end, the last WINDOW turn times, replays.
        # A count of its own: next_turn moves before ``current`` is set, and a
        # reader in between would count the starting turn as run.
        self.turns_ended = 0
        # A list used as a ring once full (turn n's time at n % WINDOW), not a
        # deque(maxlen=WINDOW): a deque allocates a 64-slot block at once, 760 of
        # an idle resident child's ~15,000 bytes; a reader sorts a copy either way.
        self.times: list[float] = []
        self.replayed = 0

    def detach(self) -> None:
        """The agent is disposed: drop the references back to it, so that it and
        everything it holds are freed by reference counting when its last user lets
        go (the runner stays, for its statistics), not by the cycle collector."""
        self._agent = None  # type: ignore[assignment]
        self.current = self.ended = None

    @property
    def output_schema(self) -> Any:
        """The JSON Schema a completed turn's output must satisfy, or ``None``."""
        return self._output_schema

    def handle(self, message: Any) -> None:
        """Run one inbox message that was not discarded."""
        if type(message) is Deliver:
            self.run_turn(message)
        elif type(message) is Quiet:
            self.context.append(
                Message(
                    message_id=message.message_id,
                    content=message.content,
                    source=message.source,
                    kind="report",
                )
            )
        else:
            try:
                message.fn()
            except Exception:
                logger.exception("call in the loop of %s raised", self._agent.session_id)

    def discard(self, message: Any) -> None:
        """A message accepted before a cancel without ``keep_inbox``: never run.

        A message is logged all the same, as a turn that ended ``cancelled``
        without running its behaviour (error ``discarded unrun``), with the events
        it carries (a child's descriptor): every accepted id stays in the log and a
        child whose prompt was discarded keeps its identity. A quiet report is not
        a turn: it waits for the next one as usual. Under strict durability the
        message leaves the durable inbox with that record -- unless the runtime is
        closing: then nothing is recorded and it stays, given back to nobody with
        the lease, to run at the session's next activation.
        """
        kind = type(message)
        if kind is Call:
            return
        if self.keep_accepted and self._durable(message.message_id):
            session = self._session
            if session.unrun is None:
                session.unrun = []
            session.unrun.append(message.message_id)
            if kind is Deliver and message.on_end is not None:
                notify(message.on_end, TurnOutcome(-1, "cancelled", None, None, DISCARDED))
        elif kind is Deliver:
            self.run_turn(message, DISCARDED)
        else:
            self.handle(message)

    def from_inbox(self, ids: Iterable[MessageId]) -> None:
        """Relaxed durability: the messages ``ids``, about to be delivered, come from
        the session's durable inbox: they leave it with their turns (or stay, when
        the runtime closes first), as under strict durability."""
        if not self._host.sessions.strict:
            if self.inboxed is None:
                self.inboxed = set()
            self.inboxed.update(ids)

    def kept(self, message: Any) -> bool:
        """Whether ``message`` stays in the durable inbox, unrun, when discarded."""
        return self._durable(message.message_id)

    def _durable(self, message_id: MessageId) -> bool:
        """Whether the message is in the session's durable inbox until its turn ends."""
        if self.one_shot:  # its prompt is in no inbox, and nobody resumes it
            return False
        return self._host.sessions.strict or message_id in (self.inboxed or ())

    def _last_chance(self) -> bool:
        """Whether a turn that never runs records the quiet reports no turn saw:
        only when nothing else would keep them -- the agent is leaving, with no
        strict inbox to replay them nor a checkpoint to carry them. Otherwise they
        wait for the next turn that runs (R-REP-5)."""
        return self._agent.disposed and not self.keeps_context and not self._host.sessions.strict

    def pending_context(self) -> list[list[Any]]:
        """Quiet reports no turn has seen yet, as checkpoint data."""
        return [
            [m.message_id, m.content, *((m.source.kind, m.source.session_id) if m.source else ())]
            for m in self.context
        ]

    def restore_context(self, pending: Any) -> None:
        """Quiet reports a checkpoint kept for the next turn (before the agent runs)."""
        for message_id, content, *source in pending or ():
            src = MessageSource(kind=source[0], session_id=source[1]) if source else None
            self.context.append(
                Message(message_id=message_id, content=content, source=src, kind="report")
            )

    def _take(self, d: Deliver) -> bool:
        """Take an untaken message into this activation before it runs; False when not
        ours to run: taken already (the pickup delivered it too), the lease lost (the
        new holder runs it), the take not recorded (the activation stops: see stop_writes)."""
        d.redelivered = False
        session = self._session
        try:
            return take_one(self._host.sessions, self._agent, session, d.message_id)
        except SubagentError as exc:
            if exc.code == ErrorCode.LEASE_LOST:
                logger.warning("not running %s: %s lost its lease", d.message_id, session.id)
            else:
                logger.warning("not running %s: its take failed: %s", d.message_id, exc)
                self._host.sessions.stop_writes(session, exc)
        return False

    def _still_held(self) -> bool:
        """Whether this activation still holds its session's lease as a turn starts
        (:meth:`Leases.confirm`: asked of the store only after a stall -- a process
        stopped past its lease must not start a message the new holder ran)."""
        leases = self._host.sessions.leases
        session = self._session
        if leases is None or leases.confirm(session.id):
            return True
        logger.warning("not running a turn of %s: its lease was taken over", session.id)
        return False

    def run_turn(self, d: Deliver, unrun: str | None = None, later: bool = False) -> None:
        """Run ``d`` as the next turn; with ``unrun`` (why), record it as a turn
        that ended ``cancelled`` without calling the behaviour. ``later``: a run of
        queued turns goes on, and stores this one with a later one (``_run``)."""
        host = self._host
        sessions = host.sessions
        if sessions.inherited is not None:
            abandon()  # a copy's turn, in the child of a fork: not the child's to run
        if (d.redelivered == UNTAKEN and not self._take(d)) or (
            unrun is None and self._session.token is not None and not self._still_held()
        ):
            if d.on_end is not None:
                notify(d.on_end, TurnOutcome(-1, "cancelled", None, None, "not ours to run"))
            return
        clock = host.clock
        session = self._session
        index = self.next_turn
        self.next_turn = index + 1
        context: tuple[Message, ...] = ()
        if self.context and (unrun is None or self._last_chance()):
            context = tuple(self.context)
            self.context.clear()
        # The turn's events as one record, built when read (protocol.TurnRecord). One
        # wall-clock read, dated only if read (the system's: POSIX seconds), and one
        # of the monotonic clock: the turn's age and, at its end, its duration.
        record = TurnRecord(index, _time() if clock is utcnow else clock(), d, context)
        turn = Turn(self._agent, index, d, context, session.next_seq - 1, self._lock, self, record)
        started = turn.began
        if unrun is None:  # a turn recorded unrun is no open turn: nothing steers into it
            self.current = turn  # a reference swap; cancel() reads it under the agent's lock
            # A cancel that found no turn open (this message taken, its turn not
            # published yet) set its watermark before it looked: seen here, this is
            # the turn it cancelled, as if it had been open (its message claimed).
            inbox: Any = self._agent  # (the Agent: an Inbox)
            if d.n <= inbox._discard_through or (self.keep_accepted and self.kept(d)):
                with self._lock:
                    aborting = turn._controller_locked()
                aborting.abort("cancelled")
        if self.owed:  # a promised message (or its stand-in) runs: that promise is kept
            kept = arrived(self.owed, (d.message_id, *(q.message_id for q in context)))
            host.sessions.owe(session, drop=kept)
        if d.redelivered is True:
            self.replayed += 1
        output: Any = None
        structured: Any = None
        error: str | None = None
        tel = host.telemetry
        traced = None
        if tel is not None:  # the turn's span, below its message's delivery; current
            traced = tel.turn(
                d.source, {"session_id": session.id, "turn": index, "message_id": d.message_id}
            )
        try:
            sessions.begin_turn(session, record)
            if unrun is None:
                output = self._on_turn(turn)
                # Turn.cancelled, read without its property call: most turns make no controller.
                controller = turn._controller
                stop = (
                    "cancelled"
                    if controller is not None and controller.signal.aborted
                    else "completed"
                )
            else:
                stop, error = "cancelled", unrun
        except SubagentError as exc:
            if exc.code == ErrorCode.CANCELLED or turn.cancelled:
                stop = "cancelled"
            else:
                stop, error = "failed", error_text(exc)
                logger.warning("turn %d of %s failed: %s", index, session.id, error)
        except Exception as exc:
            stop, error = "failed", error_text(exc)
            logger.exception("turn %d of %s failed", index, session.id)
        except GreenletExit as exc:
            if host.backend.name == "gevent":
                raise  # the actor's greenlet is being killed: this agent stops (_agent.py)
            stop, error = "failed", error_text(exc)  # a behaviour's own (threads have no kill)
        except BaseException as exc:
            # SystemExit, KeyboardInterrupt, GeneratorExit raised by the behaviour (a
            # tool's sys.exit, say) fail this turn alone: out of the actor, pykka
            # would stop every actor of the process.
            stop, error = "failed", error_text(exc)
            logger.error(
                "turn %d of %s raised %s: recorded as failed",
                index,
                session.id,
                type(exc).__name__,
                exc_info=True,
            )
        record.elapsed = elapsed = time.perf_counter() - started
        if traced is not None:
            Telemetry.leave_turn(traced)
        if unrun is None:  # a turn that never ran is no turn to count, nor its time
            times = self.times
            if len(times) < WINDOW:
                times.append(elapsed)
            else:  # the ring's next slot: turns_ended counts exactly what it holds
                times[self.turns_ended % WINDOW] = elapsed
            host.counters.times.append(elapsed)
            self.turns_ended += 1
        self.current = None
        self.ended = turn
        if stop == "completed" and self._output_schema is not None:
            structured, error = validate_output(self._output_schema, output)
            if error is not None:
                stop = "failed"
        elif stop == "cancelled" and self.keep_accepted and error is None:
            if self._durable(d.message_id):
                error = KEPT  # its messages stay accepted: a model's history leaves them here
            elif self.one_shot:
                error = CLOSED_ONE_SHOT
        promised = None
        if self.expecting is not None:  # (a turn promises inside itself: no lock a turn)
            with self._lock:
                promised, self.expecting = self.expecting, None
        if promised and error != KEPT:  # a turn run again makes its promises anew
            self.owed = {**(self.owed or {}), **promised}
            sessions.owe(session, add=tuple(promised))  # (stored before the turn's end)
        usage = turn._usage
        # An injected clock is asked again; the system's dates the end by record.elapsed.
        end_at = None if clock is utcnow else clock()
        record.end = (stop, output, structured, error, usage, end_at)
        if not (
            (output is None or plain(output))
            and (structured is None or plain(structured))
            and (error is None or plain(error))
        ):
            try:  # the whole end, as the store encodes it: output and structured together
                encode_event(record.end_event())
            except SubagentError as exc:
                stop, output, structured = "failed", None, None
                error = error_text(exc, "output cannot be recorded: ")
                record.ended(stop, None, None, error, usage, end_at)
        # The turn's messages leave the durable inbox with its end, in one write
        # (a turn the closing runtime cancelled leaves them: they run again).
        done: tuple[Any, ...] = ()
        if sessions.strict:
            if not (stop == "cancelled" and self.keep_accepted):
                mid = d.message_id
                done = (mid, *(q.message_id for q in context)) if context else (mid,)
                box = turn._steer
                if box is not None and box.taken:  # only this loop moves ``taken``
                    done += tuple(m.message_id for m in box.messages[: box.taken])
        elif self.inboxed and not (stop == "cancelled" and self.keep_accepted):
            # Relaxed: only what came from the durable inbox leaves it.
            ran = (d.message_id, *(q.message_id for q in context))
            done = tuple(m for m in ran if m in self.inboxed)
            self.inboxed.difference_update(done)
        try:
            sessions.end_turn(session, record, done, later)
        except Exception:
            logger.exception("recording the end of turn %d of %s failed", index, session.id)
        if traced is not None:
            Telemetry.end(traced[0], stop, error)
        on_end = d.on_end
        if on_end is not None:
            d.on_end = None  # the log keeps the envelope: not its observer
            notify(on_end, TurnOutcome(index, stop, output, structured, error))

    def record_steered(self, messages: list[Message]) -> bool:
        """Log messages the running turn took from steering, inside the turn; False
        (nothing logged: not the turn's to see) once this activation lost its
        lease -- the new holder runs them, as it would a turn's messages."""
        if self._session.token is not None and not self._still_held():
            return False
        events = [trusted_message(m.message_id, m.content, m.source) for m in messages]
        self._host.sessions.append(self._session, events, defer=True)  # stored with turn/end
        if self.owed:
            kept = arrived(self.owed, (m.message_id for m in messages))
            self._host.sessions.owe(self._session, drop=kept)
        return True

    def record_expected(self, turn: Turn, event: ExpectedEvent) -> None:
        """Log a message promised to the session inside ``turn`` (see
        :meth:`Turn.expect`); ``INVALID_ARGUMENT`` once the turn is no longer running."""
        with self._lock:
            if self.current is not turn:
                raise SubagentError(
                    "a turn that is not running promises nothing", code=ErrorCode.INVALID_ARGUMENT
                )
            if self.expecting is None:
                self.expecting = {}
            self.expecting[event.message_id] = event
        self._host.sessions.append(self._session, (event,), defer=True)  # stored with turn/end
