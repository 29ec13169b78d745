"""The Agent: a pykka actor whose mailbox is its FIFO inbox.

Theory of operation
-------------------
:class:`Agent` is the handle callers hold. It owns *admission into its inbox*:
a counter of accepted messages, a count of messages in flight, the discard
watermark of a cancel without ``keep_inbox``, and a gate. All four change
together under one native lock held for a few bytecodes (never across a call out
or a greenlet switch, so it excludes threads and greenlets alike). The turns
themselves belong to the actor (:class:`~._loop.TurnRunner`).

The gate is how admission is closed atomically with respect to quiescence:

* ``OPEN`` -- everything is admitted;
* ``DRAINED`` -- a drain cutoff covers this continuable child: follow-ups through
  the continuation manager are refused with ``ADMISSION_CLOSED``;
* ``CLOSED`` -- the agent is retiring or disposed: nothing is admitted.

The registry asks for ``DRAINED`` (:meth:`close_admission`) and for ``CLOSED``
(:meth:`close_if_idle`, which succeeds only while nothing is in flight); both
are decisions the agent makes on its own state, so a follow-up is either
admitted before the gate moved (and counted, so the agent is not idle) or refused
after it.

Messages the actor accepts: ``Deliver`` (one turn), ``Quiet`` (context for the
next turn), ``Call`` (a function run in its context, in order) -- see
:mod:`._messages`.

``cancel(cause, keep_inbox=...)`` is out of band: it aborts the running turn's
signal directly (the actor is busy running it), and with ``keep_inbox=False``
also raises the discard watermark so every message accepted before the cancel is
skipped unrun. Work already claimed into the interrupted turn is never requeued.

Quiescence: ``idle`` is "nothing in flight". Idle listeners run in the actor's
context each time the agent becomes quiescent (the continuation manager derives
residency from them); ``wait_idle`` waits for it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Final

import greenlet
import pykka
from subagents.actors._kernel._actorclass import actor_class
from subagents.actors._kernel._backend import EventLike
from subagents.protocol import (
    ErrorCode,
    Event,
    MessageId,
    MessageSource,
    SessionHeader,
    SessionId,
    SubagentError,
    descriptor_payload,
    new_message_id,
    packb,
    resolve_delegation_depth,
)

from ._behaviours import Behaviour
from ._host import AgentHost
from ._live import LiveSession
from ._loop import TurnRunner
from ._messages import OWN, Call, Deliver, Quiet, plain
from ._options import AgentOptions
from ._outcome import TurnOutcome

__all__ = ["Agent"]

logger = logging.getLogger("subagents")

OPEN: Final = 0
DRAINED: Final = 1
CLOSED: Final = 2


def _disposed(agent: Agent) -> SubagentError:
    return SubagentError(f"agent {agent.session_id} is disposed", code=ErrorCode.AGENT_DISPOSED)


class Agent:
    """A live agent: a session, a behaviour, and an actor running its turns.

    Created through ``runtime.spawn()`` (top-level), the subagent service
    (children) or ``runtime.agents``. All methods are thread-safe.
    """

    def __init__(
        self,
        host: AgentHost,
        session: LiveSession,
        behaviour: Behaviour,
        options: AgentOptions,
        *,
        next_turn: int = 0,
        output_schema: Any = None,
    ) -> None:
        self._host = host
        self._session = session
        self.options = options
        self._lock = threading.Lock()
        # Made by the first wait_idle() that finds the agent busy, set and dropped
        # when it next goes idle: a threading.Event set and cleared every turn
        # cost a threaded fan-out turn about 0.9 us of Python, for no waiter.
        self._idle_waiter: EventLike | None = None
        self._stopped = host.backend.event()
        self._accepted = 0  # messages accepted so far (monotone)
        self._inflight = 0
        self._discard_through = 0  # messages with n <= this are skipped (cancel without inbox)
        self._gate = OPEN
        self._disposed = False
        self._idle_listeners: list[Callable[[Agent], object]] = []
        self._dispose_listeners: list[Callable[[Agent], object]] = []
        self._loop: Any = None  # the actor's greenlet (its own thread's, on threads)
        self._flush_on_stop = True
        self.idle_since = time.monotonic()  # when the agent last became quiescent
        self._checkpoint_on_stop = False
        self._descriptor: Any = None  # a continuable child's folded descriptor
        self._extra_tools: dict[str, Callable[..., Any]] = {}  # from setup contributions
        self._turns = TurnRunner(
            self,
            host,
            session,
            behaviour,
            next_turn=next_turn,
            output_schema=output_schema,
            lock=self._lock,
        )
        self._ref: pykka.ActorRef[Any] = actor_class(host.backend.actor_class, _AgentActor).start(
            self
        )

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
    def session(self) -> LiveSession:
        """The live session this agent appends to."""
        return self._session

    @property
    def host(self) -> AgentHost:
        """The services of the runtime this agent lives in."""
        return self._host

    @property
    def extra_tools(self) -> dict[str, Callable[..., Any]]:
        """Tools installed into this agent's scope by setup contributions."""
        return self._extra_tools

    @property
    def parent_source(self) -> MessageSource:
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
        """The runtime's subagent service bound with this agent as parent."""
        return self._host.bind(self, None)

    def __repr__(self) -> str:
        return (
            f"<Agent {self.session_id} label={self.label!r}{' disposed' if self._disposed else ''}>"
        )

    # -- admission -------------------------------------------------------------------

    def _put(self, message: Any) -> None:
        # What ActorRef.tell does, minus two calls and the Envelope: our own
        # messages are their own envelopes (see _messages.Own).
        ref = self._ref
        if ref.actor_stopped.is_set():
            self._settle_one()
            raise _disposed(self)
        ref.actor_inbox.put(message)

    def _reserve(self, drop: bool = False) -> int:
        with self._lock:
            if self._gate is CLOSED or self._disposed:
                raise _disposed(self)
            self._accepted += 1
            self._inflight += 1
            if drop:
                self._discard_through = self._accepted
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
        if not plain(content):
            packb(content)  # refuse what the log cannot hold before anything is accepted
        return self.deliver(content, source, message_id=message_id)

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
    ) -> MessageId:
        """Accept one turn; the caller has validated ``content`` and ``source``.

        ``drop=True`` accepts it and, in the same step, discards it and everything
        accepted before it unrun (a child published below a drain cutoff).

        Raises:
            SubagentError: ``AGENT_DISPOSED`` once the gate is closed.
        """
        mid = message_id if message_id is not None else new_message_id()
        n = self._reserve(drop)
        self._put(Deliver(n, mid, content, source, kind, extra, on_end))
        return mid

    def admit_followup(self, content: Any, source: MessageSource, message_id: MessageId) -> bool:
        """A continuation follow-up: admitted (True), or the agent is retiring (False).

        Raises:
            SubagentError: ``ADMISSION_CLOSED`` below a drain cutoff.
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
            self._accepted += 1
            self._inflight += 1
            n = self._accepted
        self._put(Deliver(n, message_id, content, source, "message", (), None))
        return True

    def inject_quiet(
        self, content: Any, source: MessageSource | None, message_id: MessageId
    ) -> None:
        """Accept a quiet report (context of the next turn); ``content`` is validated."""
        n = self._reserve()
        self._put(Quiet(n, message_id, content, source))

    def call_in_loop(self, fn: Callable[[], object]) -> None:
        """Run ``fn`` in the actor's context after everything accepted so far."""
        n = self._reserve()
        self._put(Call(n, fn))

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

    # -- cancellation and quiescence ----------------------------------------------

    def cancel(self, cause: Any = None, *, keep_inbox: bool = True) -> None:
        """Abort the running turn's signal; returns without waiting.

        With ``keep_inbox=True`` queued messages still run later, in order; with
        ``False`` every message accepted before this call is skipped. Work claimed
        into the interrupted turn is not requeued either way.
        """
        with self._lock:
            turn = self._turns.current
            controller = turn._controller_locked() if turn is not None else None
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
        turn = self._turns.current
        return None if turn is None else turn.index

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Block until quiescent; True when idle, False on timeout.

        Raises:
            SubagentError: ``WRONG_THREAD`` from a foreign OS thread on gevent.
        """
        self._host.check_thread()
        with self._lock:
            if self._inflight == 0:
                return True
            waiter = self._idle_waiter
            if waiter is None:
                waiter = self._idle_waiter = self._host.backend.event()
        return bool(waiter.wait(timeout))

    def add_idle_listener(self, fn: Callable[[Agent], object]) -> Callable[[], None]:
        """Call ``fn(agent)`` in the actor's context whenever it becomes idle."""
        self._idle_listeners.append(fn)
        return lambda: self._idle_listeners.remove(fn) if fn in self._idle_listeners else None

    def add_dispose_listener(self, fn: Callable[[Agent], object]) -> None:
        """Call ``fn(agent)`` once the agent is disposed (in its actor's ``on_stop``)."""
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
        self,
        *,
        flush: bool = True,
        timeout: float | None = 30.0,
        wait: bool = True,
        checkpoint: bool = False,
    ) -> None:
        """Cancel everything, stop the actor, unregister, release the session.

        Idempotent; a concurrent second call waits for the first to finish.
        Called from the agent's own turn, or with ``wait=False``, it does not wait
        for the actor: the release completes in the actor's ``on_stop``.
        ``checkpoint=True`` (a continuable child settling) writes its folded state
        first, so a cold resume reads the checkpoint instead of the whole log.
        """
        with self._lock:
            first = not self._disposed
            self._disposed = True
            if first:
                self._checkpoint_on_stop = checkpoint
        if not first:
            if wait and not self._in_own_loop():
                self._stopped.wait(timeout)
            return
        self._host.forget(self)
        self._flush_on_stop = flush
        self.cancel("disposed", keep_inbox=False)
        if not wait or self._in_own_loop():
            # Stop after this turn; the actor's on_stop finishes the disposal.
            with contextlib.suppress(pykka.ActorDeadError):
                self._ref.stop(block=False)
            return
        with contextlib.suppress(pykka.ActorDeadError):
            self._ref.stop(block=True, timeout=timeout)
        self._stopped.wait(timeout)

    def _finish_dispose(self) -> None:
        """Runs in the actor's ``on_stop``: after the last turn, before the loop exits."""
        with self._lock:
            self._disposed = True  # also when stopped from outside (ActorRegistry.stop_all)
            self._gate = CLOSED
        host = self._host
        host.forget(self)
        sessions = host.sessions
        if self._checkpoint_on_stop and self._descriptor is not None:
            # Quiet reports not yet seen by a turn are folded state too: the next
            # turn of the next epoch sees them (R-REP-5).
            pending = self._turns.pending_context()
            sessions.checkpoint(
                self._session,
                {
                    "next_turn": self._turns.next_turn,
                    "descriptor": descriptor_payload(self._descriptor),
                    "context": pending,
                },
                # A descriptor payload nests two levels; report contents are free-form.
                shaped=not pending,
            )
        host.leaving(self._session, self._descriptor)
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
        self._turns.restore_context(pending)

    def wait_disposed(self, timeout: float | None = None) -> bool:
        return bool(self._stopped.wait(timeout))

    # -- the actor side ------------------------------------------------------------

    def _handle(self, message: Any) -> None:
        try:
            if message.n <= self._discard_through:
                self._turns.discard(message)
            else:
                self._turns.handle(message)
        finally:
            if self._settle_one() and self._idle_listeners:
                for fn in list(self._idle_listeners):
                    try:
                        fn(self)
                    except Exception:
                        logger.exception("idle listener %r raised", fn)


class _AgentActor:
    """The agent's actor behaviour; built into an actor class per backend."""

    def __init__(self, agent: Agent) -> None:
        super().__init__()
        self._agent = agent

    def on_start(self) -> None:
        self._agent._loop = greenlet.getcurrent()

    def _handle_receive(self, message: Any) -> Any:
        # Our own messages first: pykka's dispatch tests four of its own types
        # before it reaches on_receive (kernel/_pykka.py lists this override).
        if type(message) in OWN:
            self._agent._handle(message)
            return None
        return super()._handle_receive(message)  # type: ignore[misc]

    def on_receive(self, message: Any) -> Any:
        self._agent._handle(message)

    def on_stop(self) -> None:
        self._agent._finish_dispose()
