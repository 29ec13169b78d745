"""The Agent: a pykka actor whose mailbox is its FIFO inbox.

Theory of operation
-------------------
:class:`Agent` is the handle callers hold; :class:`_AgentCore` is the state that
only the agent's actor touches. The actor's pykka mailbox is the *only* turn
queue: ``followup()`` mints a :class:`MessageId`, counts the message as in
flight and ``tell``s a :class:`_Deliver`; the actor turns each one into exactly one
turn, in mailbox order. A turn appends ``turn/start``, the delivered message and
``turn/end`` (stop reason ``completed`` / ``cancelled`` / ``failed``) to the live
session, and runs the behaviour between them.

Messages the actor accepts:

* ``_Deliver`` -- one turn (a follow-up, the initial prompt, or a waking report);
* ``_Quiet`` -- a quiet report: kept as context for the next turn, no turn of its own;
* ``_Call`` -- run a function in the actor's context (used for ordering).

``cancel(cause, keep_inbox=...)`` is out of band: it aborts the running turn's
signal directly (the actor is busy running it), and with ``keep_inbox=False``
also raises a discard watermark so every message accepted before the cancel is
skipped unrun. Work already claimed into the interrupted turn is never requeued.

Quiescence: a counter of messages in flight (incremented before ``tell``,
decremented after the message is handled) and an event set at zero back
``wait_idle``. Idle listeners run in the actor's context each time the agent
becomes quiescent (the supervisor derives residency from them).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import greenlet
import pykka
from subagents.actors._kernel._signal import AbortController
from subagents.protocol import (
    ErrorCode,
    Event,
    MessageId,
    MessageSource,
    ReportEvent,
    SessionHeader,
    SessionId,
    SubagentError,
    descriptor_payload,
    new_message_id,
    packb,
    resolve_delegation_depth,
)
from subagents.protocol._events import _message_event, _turn_end, _turn_start

from ._behaviours import AgentOptions, Behaviour
from ._sessions import LiveSession
from ._turn import Message, Turn

if TYPE_CHECKING:
    from subagents.actors._kernel._backend import EventLike
    from subagents.actors._runtime import Runtime

__all__ = ["Agent", "TurnOutcome"]

logger = logging.getLogger("subagents")


class TurnOutcome:
    """How one turn ended: stop reason, output, structured output, error text."""

    __slots__ = ("error", "output", "stop_reason", "structured", "turn")

    def __init__(
        self, turn: int, stop_reason: str, output: Any, structured: Any, error: str | None
    ) -> None:
        self.turn = turn
        self.stop_reason = stop_reason
        self.output = output
        self.structured = structured
        self.error = error

    def __repr__(self) -> str:
        return f"TurnOutcome({self.turn}, {self.stop_reason!r}, {self.output!r})"


class _Own:
    """Base of the agent's own messages. Each is put into the inbox as its own
    pykka envelope (``message`` is itself, ``reply_to`` is None: they are never
    asked), which saves an Envelope allocation per follow-up."""

    __slots__ = ()
    reply_to = None

    @property
    def message(self) -> _Own:
        return self


class _Deliver(_Own):
    # Using slots: one of these is allocated per follow-up on the hot path.
    __slots__ = ("content", "extra", "kind", "message_id", "n", "on_end", "source")

    def __init__(
        self,
        n: int,
        message_id: MessageId,
        content: Any,
        source: MessageSource | None,
        kind: str,
        extra: tuple[Event, ...],
        on_end: Callable[[TurnOutcome], object] | None,
    ) -> None:
        self.n = n
        self.message_id = message_id
        self.content = content
        self.source = source
        self.kind = kind
        self.extra = extra
        self.on_end = on_end


class _Quiet(_Own):
    __slots__ = ("content", "message_id", "n", "source")

    def __init__(
        self, n: int, message_id: MessageId, content: Any, source: MessageSource | None
    ) -> None:
        self.n = n
        self.message_id = message_id
        self.content = content
        self.source = source


class _Call(_Own):
    __slots__ = ("fn", "n")

    def __init__(self, n: int, fn: Callable[[], object]) -> None:
        self.n = n
        self.fn = fn


# Values the log always holds (str length aside, which packb checks): skipping the
# trial pack for them saves ~1.5 us per follow-up and per turn.
_SCALARS: frozenset[type] = frozenset({int, float, bool, type(None)})


def _plain(value: Any) -> bool:
    kind = type(value)
    if kind is str:
        return len(value) < 65536
    if kind is int:
        return bool(-(2**63) <= value < 2**64)
    return kind in _SCALARS


class Agent:
    """A live agent: a session, a behaviour, and an actor running its turns.

    Created through ``runtime.spawn()`` (top-level), the subagent service
    (children) or ``runtime.agents``. All methods are thread-safe.
    """

    def __init__(
        self,
        runtime: Runtime,
        session: LiveSession,
        behaviour: Behaviour,
        options: AgentOptions,
        *,
        next_turn: int = 0,
        output_schema: Any = None,
    ) -> None:
        self._runtime = runtime
        self._session = session
        self._behaviour = behaviour
        self.options = options
        self._output_schema = output_schema
        backend = runtime.backend
        self._lock = threading.Lock()
        # Made by the first wait_idle() that finds the agent busy, set and dropped
        # when it next goes idle: a threading.Event set and cleared every turn
        # cost a threaded fan-out turn about 0.9 us of Python, for no waiter.
        self._idle_waiter: EventLike | None = None
        self._stopped = backend.event()
        self._accepted = 0  # messages accepted so far (monotone)
        self._inflight = 0
        self._discard_through = 0  # messages with n <= this are skipped (cancel without inbox)
        self._current: Turn | None = None
        self._disposed = False
        self._idle_listeners: list[Callable[[Agent], object]] = []
        self._dispose_listeners: list[Callable[[Agent], object]] = []
        self._context: list[Message] = []
        self._next_turn = next_turn
        self._loop: Any = None
        self._flush_on_stop = True
        self.idle_since = time.monotonic()  # when the agent last became quiescent
        self._checkpoint_on_stop = False
        self._descriptor: Any = None  # a continuable child's folded descriptor
        self._extra_tools: dict[str, Callable[..., Any]] = {}  # from setup contributions
        self._setup_releases: dict[Any, Callable[[], object]] = {}
        self._ref: pykka.ActorRef[Any] = _actor_class(backend.actor_class).start(self)

    # -- identity ----------------------------------------------------------------

    @property
    def session_id(self) -> SessionId:
        return self._session.header.id

    @property
    def header(self) -> SessionHeader:
        return self._session.header

    @property
    def label(self) -> str | None:
        return self._session.header.label

    @property
    def parent_session(self) -> SessionId | None:
        return self._session.header.parent_session

    @property
    def _parent_source(self) -> MessageSource:
        """The source of messages this agent sends its children (built once)."""
        source = self.__dict__.get("_parent_source_cache")
        if source is None:
            source = MessageSource(kind="parent", session_id=self.session_id)
            self.__dict__["_parent_source_cache"] = source
        return source

    @property
    def header_delegation_depth(self) -> int:
        return self._session.header.delegation_depth

    @property
    def subagent_depth(self) -> int | None:
        return self.options.subagent_depth

    @property
    def delegation_depth(self) -> int:
        """Effective delegation depth (the header floor, raised by the option)."""
        return resolve_delegation_depth(
            self._session.header.delegation_depth, self.options.subagent_depth
        )

    @property
    def disposed(self) -> bool:
        return self._disposed

    @property
    def subagents(self) -> Any:
        """The runtime's service bound with this agent as parent."""
        from ._turn import BoundSubagents

        return BoundSubagents(self)

    def __repr__(self) -> str:
        return (
            f"<Agent {self.session_id} label={self.label!r}{' disposed' if self._disposed else ''}>"
        )

    # -- inbox -------------------------------------------------------------------

    def _admit(self, message: Any) -> None:
        # What ActorRef.tell does, minus two calls and the Envelope: our own
        # messages are their own envelopes (see _Own).
        ref = self._ref
        if ref.actor_stopped.is_set():
            self._settle_one()
            raise SubagentError(
                f"agent {self.session_id} is disposed", code=ErrorCode.AGENT_DISPOSED
            )
        ref.actor_inbox.put(message)

    def _reserve(self) -> int:
        with self._lock:
            if self._disposed:
                raise SubagentError(
                    f"agent {self.session_id} is disposed", code=ErrorCode.AGENT_DISPOSED
                )
            self._accepted += 1
            self._inflight += 1
            return self._accepted

    def followup(
        self,
        content: Any,
        *,
        source: MessageSource | None = None,
        message_id: MessageId | None = None,
    ) -> MessageId:
        """Submit one message; it becomes exactly one FIFO turn. Returns its id.

        Raises:
            SubagentError: ``AGENT_DISPOSED``; ``ENCODE_ERROR`` for content the
                session log cannot represent; ``INVALID_ARGUMENT``.
        """
        if source is not None and not isinstance(source, MessageSource):
            raise SubagentError("source must be a MessageSource", code=ErrorCode.INVALID_ARGUMENT)
        if message_id is not None and type(message_id) is not MessageId:
            message_id = MessageId(message_id)
        if not _plain(content):
            packb(content)  # refuse what the log cannot hold before anything is accepted
        return self._deliver(content, source, "message", (), None, message_id)

    def _deliver(
        self,
        content: Any,
        source: MessageSource | None,
        kind: str,
        extra: tuple[Event, ...],
        on_end: Callable[[TurnOutcome], object] | None,
        message_id: MessageId | None = None,
    ) -> MessageId:
        """Accept one turn; the caller has validated ``content`` and ``source``."""
        mid = message_id if message_id is not None else new_message_id()
        n = self._reserve()
        self._admit(_Deliver(n, mid, content, source, kind, extra, on_end))
        return mid

    def _inject_quiet(
        self, content: Any, source: MessageSource | None, message_id: MessageId
    ) -> None:
        """Accept a quiet report; the caller has validated ``content``."""
        n = self._reserve()
        self._admit(_Quiet(n, message_id, content, source))

    def _call_in_loop(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` in the actor's context after everything accepted so far."""
        n = self._reserve()
        self._admit(_Call(n, fn))

    # -- cancellation and quiescence ----------------------------------------------

    def _turn_controller(self, turn: Turn) -> AbortController:
        """The turn's controller, made on first use (most turns are never cancelled)."""
        with self._lock:
            return self._controller_locked(turn)

    @staticmethod
    def _controller_locked(turn: Turn) -> AbortController:
        if turn._controller is None:
            turn._controller = AbortController()
        return turn._controller

    def cancel(self, cause: Any = None, *, keep_inbox: bool = True) -> None:
        """Abort the running turn's signal; returns without waiting.

        With ``keep_inbox=True`` queued messages still run later, in order; with
        ``False`` every message accepted before this call is skipped. Work claimed
        into the interrupted turn is not requeued either way.
        """
        with self._lock:
            turn = self._current
            controller = self._controller_locked(turn) if turn is not None else None
            if not keep_inbox:
                self._discard_through = self._accepted
        if controller is not None:
            controller.abort(cause if cause is not None else "cancelled")

    @property
    def idle(self) -> bool:
        """True when nothing is in flight (no queued message, no open turn)."""
        return self._inflight == 0

    @property
    def running_turn(self) -> int | None:
        turn = self._current
        return None if turn is None else turn.index

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until quiescent; True when idle, False on timeout.

        Raises:
            SubagentError: ``WRONG_THREAD`` from a foreign OS thread on gevent.
        """
        self._runtime._check_thread()
        with self._lock:
            if self._inflight == 0:
                return True
            waiter = self._idle_waiter
            if waiter is None:
                waiter = self._idle_waiter = self._runtime.backend.event()
        return bool(waiter.wait(timeout))

    def add_idle_listener(self, fn: Callable[[Agent], object]) -> Callable[[], None]:
        """Call ``fn(agent)`` in the actor's context whenever it becomes idle."""
        self._idle_listeners.append(fn)
        return lambda: self._idle_listeners.remove(fn) if fn in self._idle_listeners else None

    def add_dispose_listener(self, fn: Callable[[Agent], object]) -> None:
        self._dispose_listeners.append(fn)

    def _settle_one(self) -> bool:
        with self._lock:
            self._inflight -= 1
            idle = self._inflight == 0
            if idle:
                self.idle_since = time.monotonic()
                waiter = self._idle_waiter
                if waiter is not None:
                    self._idle_waiter = None
                    waiter.set()
        return idle

    # -- disposal ----------------------------------------------------------------

    def _in_own_loop(self) -> bool:
        return self._loop is not None and greenlet.getcurrent() is self._loop

    def dispose(
        self, *, flush: bool = True, timeout: float | None = 30.0, wait: bool = True
    ) -> None:
        """Cancel everything, stop the actor, unregister, release the session.

        Idempotent; a concurrent second call waits for the first to finish.
        Called from the agent's own turn, or with ``wait=False``, it does not wait
        for the actor: the release completes in the actor's ``on_stop``.
        """
        with self._lock:
            first = not self._disposed
            self._disposed = True
        if not first:
            if wait and not self._in_own_loop():
                self._stopped.wait(timeout)
            return
        self._runtime.agents._unregister(self)
        self._flush_on_stop = flush
        self.cancel("disposed", keep_inbox=False)
        if not wait or self._in_own_loop():
            # Stop after this turn; the actor's on_stop finishes the disposal.
            with contextlib.suppress(pykka.ActorDeadError):
                self._ref.tell(pykka.messages._ActorStop())
            return
        with contextlib.suppress(pykka.ActorDeadError):
            self._ref.stop(block=True, timeout=timeout)
        self._stopped.wait(timeout)

    def _finish_dispose(self) -> None:
        """Runs in the actor's ``on_stop``: after the last turn, before the loop exits."""
        with self._lock:
            self._disposed = True  # also when stopped from outside (ActorRegistry.stop_all)
        self._runtime.agents._unregister(self)
        sessions = self._runtime.sessions
        if self._checkpoint_on_stop and self._descriptor is not None:
            # Quiet reports not yet seen by a turn are folded state too: the next
            # turn of the next epoch sees them (R-REP-5).
            pending = [
                [
                    m.message_id,
                    m.content,
                    *((m.source.kind, m.source.session_id) if m.source else ()),
                ]
                for m in self._context
            ]
            sessions.checkpoint(
                self._session,
                {
                    "next_turn": self._next_turn,
                    "descriptor": descriptor_payload(self._descriptor),
                    "context": pending,
                },
                # A descriptor payload nests two levels; report contents are free-form.
                shaped=not pending,
            )
        self._runtime._on_session_leaving(self._session, self._descriptor)
        if self._flush_on_stop:
            try:
                sessions.flush(self.session_id)
            except Exception:
                logger.exception("best-effort flush of session %s failed", self.session_id)
        sessions.release(self._session)
        for fn in list(self._dispose_listeners):
            try:
                fn(self)
            except Exception:
                logger.exception("dispose listener %r raised", fn)
        # A thread's greenlet must not outlive the thread through this handle: freed
        # later by another thread's garbage collector, it crashes the interpreter.
        self._loop = None
        self._stopped.set()

    def _restore_context(self, pending: Any) -> None:
        """Quiet reports a checkpoint kept for the next turn (before the agent runs)."""
        for message_id, content, *source in pending or ():
            src = MessageSource(kind=source[0], session_id=source[1]) if source else None
            self._context.append(
                Message(message_id=message_id, content=content, source=src, kind="report")
            )

    def wait_disposed(self, timeout: float | None = None) -> bool:
        return bool(self._stopped.wait(timeout))

    # -- the actor side ------------------------------------------------------------

    def _on_start(self) -> None:
        self._loop = greenlet.getcurrent()

    def _handle(self, message: Any) -> None:
        try:
            if message.n <= self._discard_through:
                if isinstance(message, _Deliver) and message.on_end is not None:
                    self._notify(
                        message.on_end, TurnOutcome(-1, "cancelled", None, None, "discarded unrun")
                    )
                return
            if isinstance(message, _Deliver):
                self._run_turn(message)
            elif isinstance(message, _Quiet):
                self._context.append(
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
                    logger.exception("call in the loop of %s raised", self.session_id)
        finally:
            if self._settle_one() and self._idle_listeners:
                for fn in list(self._idle_listeners):
                    try:
                        fn(self)
                    except Exception:
                        logger.exception("idle listener %r raised", fn)

    def _notify(self, fn: Callable[[TurnOutcome], object], outcome: TurnOutcome) -> None:
        try:
            fn(outcome)
        except Exception:
            logger.exception("turn observer %r raised", fn)

    def _run_turn(self, d: _Deliver) -> None:
        runtime = self._runtime
        sessions = runtime.sessions
        clock = runtime.clock
        session = self._session
        index = self._next_turn
        self._next_turn = index + 1
        turn = Turn(self, index, d, (), session.next_seq - 1)
        mid = d.message_id
        if d.kind == "report":
            delivered: Event = ReportEvent(
                message_id=mid, content=d.content, source=d.source, delivery="waking"
            )
        else:
            delivered = _message_event(mid, d.content, d.source)
        events: list[Event] = [_turn_start(index, clock(), (mid,))]
        if d.extra:
            events.extend(d.extra)
        if self._context:
            context = turn.context = tuple(self._context)
            self._context.clear()
            for q in context:
                events.append(
                    ReportEvent(
                        message_id=q.message_id,
                        content=q.content,
                        source=q.source,
                        delivery="quiet",
                    )
                )
        events.append(delivered)
        self._current = turn  # a reference swap; cancel() reads it under its lock
        output: Any = None
        structured: Any = None
        error: str | None = None
        try:
            sessions.append(session, events, defer=True)  # stored with turn/end
            output = self._behaviour.on_turn(turn)
            stop = "cancelled" if turn.cancelled else "completed"
        except SubagentError as exc:
            if exc.code == ErrorCode.CANCELLED or turn.cancelled:
                stop = "cancelled"
            else:
                stop, error = "failed", f"{type(exc).__name__}: {exc}"
                logger.warning("turn %d of %s failed: %s", index, self.session_id, exc)
        except Exception as exc:
            stop, error = "failed", f"{type(exc).__name__}: {exc}"
            logger.exception("turn %d of %s failed", index, self.session_id)
        self._current = None
        if stop == "completed" and self._output_schema is not None:
            structured, error = runtime._check_output(self._output_schema, output)
            if error is not None:
                stop = "failed"
        if not _plain(output):
            try:
                packb(output)
            except SubagentError as exc:
                stop, error, output = "failed", f"output cannot be recorded: {exc}", None
        try:
            sessions.append(session, (_turn_end(index, clock(), stop, output, structured, error),))
        except Exception:
            logger.exception("recording the end of turn %d of %s failed", index, self.session_id)
        if d.on_end is not None:
            self._notify(d.on_end, TurnOutcome(index, stop, output, structured, error))


_OWN = frozenset({_Deliver, _Quiet, _Call})
_ACTOR_CLASSES: dict[type[pykka.Actor], type[pykka.Actor]] = {}


def _actor_class(base: type[pykka.Actor]) -> type[pykka.Actor]:
    """The agent actor class for a backend's actor base (built once per base)."""
    cls = _ACTOR_CLASSES.get(base)
    if cls is None:

        class _AgentActor(base):  # type: ignore[valid-type,misc]
            def __init__(self, agent: Agent) -> None:
                super().__init__()
                self._agent = agent

            def on_start(self) -> None:
                self._agent._on_start()

            def _handle_receive(self, message: Any) -> Any:
                # Our own messages first: pykka's dispatch tests four of its own
                # types before it reaches on_receive.
                if type(message) in _OWN:
                    self._agent._handle(message)
                    return None
                return super()._handle_receive(message)

            def on_receive(self, message: Any) -> Any:
                self._agent._handle(message)

            def on_stop(self) -> None:
                self._agent._finish_dispose()

        _AgentActor.__name__ = f"AgentActor[{base.__name__}]"
        cls = _ACTOR_CLASSES[base] = _AgentActor
    return cls
