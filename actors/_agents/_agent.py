"""The Agent: a pykka actor whose mailbox is its FIFO inbox.

Theory of operation
-------------------
:class:`Agent` is the handle callers hold: its identity, ``followup``,
``dispose``, and -- from :class:`~._inbox.Inbox`, which it is built on --
admission into its inbox, the gate, cancellation and quiescence. The turns
themselves belong to the actor (:class:`~._loop.TurnRunner`); the agent sees the
rest of the runtime only through its :class:`~._host.AgentHost`.

Messages the actor accepts: ``Deliver`` (one turn), ``Quiet`` (context for the
next turn), ``Call`` (a function run in its context, in order) -- see
:mod:`._messages`.

Disposal stops the actor after the message it is running; the release -- an
optional checkpoint of folded state, the identity row of a leaving session, a
best-effort flush, the session leaving the live set, dispose listeners --
happens in the actor's ``on_stop``, in its own context.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import greenlet
import pykka
from subagents.actors._kernel._actorclass import actor_class
from subagents.actors._kernel._checks import check_listener, check_timeout
from subagents.actors._kernel._listeners import hear
from subagents.actors._kernel._pykka import STOP
from subagents.protocol import (
    ErrorCode,
    MessageSource,
    SessionHeader,
    SessionId,
    SubagentError,
    descriptor_payload,
    resolve_delegation_depth,
)

from ._agent_actor import _AgentActor
from ._behaviours import Behaviour
from ._commits import Commits
from ._expected import forsaken, to_checkpoint
from ._followups import Followups
from ._host import AgentHost
from ._inbox import CLOSED
from ._live import LiveSession
from ._loop import TurnRunner
from ._options import AgentOptions

__all__ = ["Agent"]

logger = logging.getLogger("subagents")

# Held for a few bytecodes: a stopped event made by its first waiter, against its
# disposal finishing (see Agent._stopped_event).
_MAKING = threading.Lock()


class Agent(Followups):
    """A live agent: a session, a behaviour, and an actor running its turns.

    Created through ``runtime.spawn()`` (top-level), the subagent service
    (children) or ``runtime.agents``. All methods are thread-safe.
    """

    # Agent's own state in slots: an agent's instance dict (its bases', the
    # mailbox's) then keeps few keys. CPython shares the keys of a class's instance
    # dicts only up to 30 names (all ever set on any instance); past that, every
    # instance keeps a dict of its own -- 1.3 KiB more for each resident child
    # (tests/runtime/test_agent_footprint.py).
    __slots__ = (
        "_cancel_listeners",
        "_checkpoint_on_stop",
        "_commits",
        "_descriptor",
        "_done",
        "_extra_tools",
        "_flush_on_stop",
        "_host",
        "_loop",
        "_parent_source_cache",
        "_recorded",
        "_ref",
        "_session",
        "_stopped",
        "_taking",
        "_turns",
        "damaged_seqs",
        "options",
    )

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
        super().__init__()
        self._host = host
        self._session = session
        self.options = options
        self._done = False  # its disposal finished (see _stopped_event)
        self._stopped: Any = None
        # Held while messages nobody took are taken and queued (the mail pickup, a
        # follow-up's take-ahead with its own message): one taker at a time, in order.
        self._taking = host.backend.lock()
        self._commits = Commits(host.backend)  # taken by this activation, under way
        self._loop: Any = None  # the actor's greenlet (its own thread's, on threads)
        self._flush_on_stop = True
        self._checkpoint_on_stop = False
        self._descriptor: Any = None  # a continuable child's folded descriptor
        # A top-level agent's recorded options (its agent/options payload): its
        # checkpoint carries them, the log's record of them being before it.
        self._recorded: Any = None
        #: Seqs of the log's events that did not decode when it was resumed with
        #: ``damaged="skip"`` (they stay in the store); empty otherwise.
        self.damaged_seqs: tuple[int, ...] = ()
        # Made on first use by parent_source (one attribute read a follow-up, and
        # no MessageSource for an agent that never follows up).
        self._parent_source_cache: MessageSource | None = None
        # Made on first use by add_cancel_listener: most agents never have one.
        self._cancel_listeners: list[Callable[[Any], object]] | None = None
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
        """The agent's session id (what stores, listings and follow-ups name)."""
        return self._session.header.id

    @property
    def header(self) -> SessionHeader:
        """The session's :class:`~subagents.protocol.SessionHeader`."""
        return self._session.header

    @property
    def label(self) -> str | None:
        """The session's label, or ``None``."""
        return self._session.header.label

    @property
    def parent_session(self) -> SessionId | None:
        """The parent's session id (``None`` for a top-level agent)."""
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
        """The source of messages this agent sends its children (built once; when
        the runtime traces, carrying the current span's context)."""
        source = self._parent_source_cache
        if source is None:
            source = self._parent_source_cache = MessageSource(
                kind="parent", session_id=self._session.header.id
            )
        tel = self._host.telemetry
        return source if tel is None else tel.stamp(source)

    @property
    def header_delegation_depth(self) -> int:
        """The delegation depth recorded in the session's header."""
        return self._session.header.delegation_depth

    @property
    def subagent_depth(self) -> int | None:
        """The agent's own subagent depth limit, or ``None``."""
        return self.options.subagent_depth

    @property
    def delegation_depth(self) -> int:
        """Effective delegation depth (the header floor, raised by the option)."""
        return resolve_delegation_depth(
            self._session.header.delegation_depth, self.options.subagent_depth
        )

    @property
    def disposed(self) -> bool:
        """Whether disposal began (it accepts nothing more)."""
        return self._disposed

    @property
    def subagents(self) -> Any:
        """The runtime's subagent service bound with this agent as parent."""
        return self._host.bind(self, None)

    def __repr__(self) -> str:
        return (
            f"<Agent {self.session_id} label={self.label!r}{' disposed' if self._disposed else ''}>"
        )

    # -- cancellation ---------------------------------------------------------------

    def cancel(
        self, cause: Any = None, *, keep_inbox: bool = True, keep_accepted: bool = False
    ) -> None:
        """Abort the running turn's signal; returns without waiting (see
        :meth:`Inbox.cancel`). A cancel without ``keep_inbox`` -- dispose, a
        drain, the runtime closing -- also calls the cancel listeners, with
        ``cause``: work the agent started beyond its turns (background runs)
        ends with it.

        Raises:
            SubagentError: ``INVALID_ARGUMENT`` for a ``keep_inbox`` that is no bool
                (``"no"`` is true: it kept the inbox it was meant to drop);
                ``WRONG_PROCESS`` in the child of a fork (as every call but
                ``Runtime.close``: the agent is the parent's).
        """
        self._host.sessions.check_process()
        if type(keep_inbox) is not bool or type(keep_accepted) is not bool:
            raise SubagentError(
                "keep_inbox and keep_accepted must be bools, got"
                f" {type(keep_inbox).__name__} and {type(keep_accepted).__name__}",
                code=ErrorCode.INVALID_ARGUMENT,
            )
        super().cancel(cause, keep_inbox=keep_inbox, keep_accepted=keep_accepted)
        listeners = self._cancel_listeners
        if not keep_inbox and listeners:
            for fn in list(listeners):
                hear(fn, cause, "cancel listener")

    def running_for(self, ago: float) -> Any:
        """The turn running now if it began at least ``ago`` seconds ago (on the
        monotonic clock ``Turn.began`` reads): the turn an interrupt asked ``ago``
        seconds ago means; None when there is none."""
        turn = self._turns.current
        return turn if turn is not None and turn.began <= time.perf_counter() - ago else None

    def cancel_turn(self, turn: Any, cause: Any) -> None:
        """Abort ``turn``'s signal if it is still the running turn: a turn that began
        since (the interrupt that meant ``turn`` came late) is left alone."""
        with self._lock:
            current = self._turns.current
            if current is None or current is not turn:
                return
            controller = current._controller_locked()
        controller.abort(cause)

    def add_cancel_listener(self, fn: Callable[[Any], object]) -> None:
        """Call ``fn(cause)`` at each cancel without ``keep_inbox`` (in the caller's
        context, after the turn's signal was aborted; ``INVALID_ARGUMENT`` when ``fn``
        is not callable)."""
        check_listener(fn)
        if self._cancel_listeners is None:
            self._cancel_listeners = []
        self._cancel_listeners.append(fn)

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

        The running turn is cancelled and every queued message is discarded: the
        behaviour never sees it, and the log keeps it as a turn that ended
        ``cancelled`` with error ``discarded unrun`` (``Runtime.close()`` keeps
        queued messages for the next activation instead, under strict
        durability).

        Idempotent; a concurrent second call waits for the first to finish.
        Called from the agent's own turn, or with ``wait=False``, it does not wait
        for the actor: the release completes in the actor's ``on_stop``.
        ``checkpoint=True`` (a continuable child settling) writes its folded state
        first, so a cold resume reads the checkpoint instead of the whole log. A
        top-level agent spawned by model name always writes one (with its
        recorded options), unless resumed around damaged events.

        Raises:
            SubagentError: ``TIMEOUT`` when a waiting first call sees the actor not
                stopped within ``timeout`` (a turn that does not end at its
                cancellation): the disposal completes when that turn ends.
        """
        self._host.sessions.check_process()
        timeout = check_timeout(timeout)
        if not (type(flush) is bool and type(wait) is bool and type(checkpoint) is bool):
            # "no" is true: it would do what it was told not to.
            raise SubagentError(
                "flush, wait and checkpoint must be bools", code=ErrorCode.INVALID_ARGUMENT
            )
        with self._lock:
            first = not self._disposed
            self._disposed = True
            if first:
                self._checkpoint_on_stop = checkpoint
                self._turns.keeps_context = self._checkpoints(checkpoint)
        if first:
            self._host.counters.leave(self)  # summed as live until it retires
            self._host.forget(self)
            self._flush_on_stop = flush
            self.cancel("disposed", keep_inbox=False)
            # Stop after this turn; the actor's on_stop finishes the disposal and
            # sets _stopped last (a stop future would be a second wait and timer).
            with contextlib.suppress(pykka.ActorDeadError):
                self._ref.tell(STOP)
        if not wait or self._in_own_loop():
            return
        if not self._stopped_event().wait(timeout) and first:  # (a second call: silent)
            late = f"agent {self.session_id} did not stop within {timeout} s (its turn goes on)"
            raise SubagentError(late, code=ErrorCode.TIMEOUT)

    def _finish_dispose(self) -> None:
        """Runs in the actor's ``on_stop``: after the last turn, before the loop exits."""
        with self._lock:
            # dispose() marks it first and takes it out of the registry itself.
            by_dispose = self._disposed
            self._disposed = True  # also when stopped from outside (ActorRegistry.stop_all)
            self._gate = CLOSED
        host = self._host
        if not by_dispose:
            host.counters.leave(self)
            host.forget(self)
        _running, _inbox, turns, accepted, replayed, _reports = self._counts()
        host.counters.retire(self, turns, accepted, replayed)
        sessions = host.sessions
        try:
            self._let_go(sessions)
        except SubagentError as exc:
            # The store or the writer is gone (a runtime closing under a late
            # activation): nothing more to release, and the disposal still ends.
            logger.warning("releasing session %s failed: %s", self.session_id, exc)
        finally:
            for fn in list(self._dispose_listeners):
                hear(fn, self, "dispose listener")
            # Heard for the last time: a listener closing over what holds this agent
            # (a child's activation) would otherwise keep both for the cycle collector.
            self._idle_listeners.clear()
            self._dispose_listeners.clear()
            # A thread's greenlet must not outlive the thread through this handle:
            # freed later by another thread's garbage collector, it crashes the
            # interpreter.
            self._loop = None
            self._turns.detach()
            with _MAKING:
                self._done = True
                stopped = self._stopped
            if stopped is not None:
                stopped.set()
            host.released(self)

    def _checkpoints(self, asked: bool) -> bool:
        """Whether its disposal writes a checkpoint: a continuable child's when
        ``asked`` (settling, or idle as the runtime closes) or quiet reports no turn
        saw would be lost (a closing runtime, relaxed); a top-level agent's that
        records its options always, unless it was resumed around damaged events (a
        checkpoint would hide them)."""
        if self._descriptor is not None:
            return asked or bool(self._turns.context)
        return self._recorded is not None and not self.damaged_seqs

    def _let_go(self, sessions: Any) -> None:
        """Checkpoint (a settling child, a top-level agent), flush and release the session."""
        if self._checkpoints(self._checkpoint_on_stop):
            # Quiet reports no turn saw yet are folded state too (R-REP-5).
            pending = self._turns.pending_context()
            state = {"next_turn": self._turns.next_turn, "context": pending}
            if self._descriptor is not None:
                state["descriptor"] = descriptor_payload(self._descriptor)
            else:
                state["options"] = dict(self._recorded)
            # Promised messages that never came, always (none: []; see ._expected).
            state["expected"] = owed = to_checkpoint(self._turns.owed or {})
            # Payloads nest two levels, not an output schema; reports are free-form.
            free = pending or owed or "output_schema" in (self._recorded or ())
            sessions.checkpoint(self._session, state, shaped=not free)
        forsaken(self)  # a disposal: its promises are no sweep's work (see ._expected)
        self._host.leaving(self._session, self._descriptor)
        if self._flush_on_stop and sessions.persistence is not None:
            try:
                sessions.flush(self.session_id)
            except Exception as exc:
                # A typed error is the store's (an outage, a takeover's LEASE_LOST):
                # one line. A traceback only for what is a bug of ours.
                bug = not isinstance(exc, SubagentError) or exc.code == ErrorCode.INTERNAL
                logger.error("flushing %s failed: %s", self.session_id, exc, exc_info=bug)
        if not self._commits.close(30.0):  # (see ._commits: given back before the release)
            logger.warning("a follow-up to %s was still being committed", self.session_id)
        sessions.release(self._session)

    def _restore_context(self, pending: Any) -> None:
        """Quiet reports a checkpoint kept for the next turn (before the agent runs)."""
        self._turns.restore_context(pending)

    def wait_disposed(self, timeout: float | None = None) -> bool:
        """Wait until its disposal finished (its session released); False on timeout."""
        self._host.sessions.check_process()
        return bool(self._stopped_event().wait(check_timeout(timeout)))

    def disposed_now(self) -> bool:
        """Whether its disposal finished (its session released)."""
        return self._done

    def _stopped_event(self) -> Any:
        """The event set once its disposal finished, made on first use (an idle
        child that nobody waits for keeps none)."""
        stopped = self._stopped
        if stopped is None:
            made = self._host.backend.event()
            with _MAKING:
                stopped = self._stopped
                if stopped is None:
                    stopped = self._stopped = made
                    if self._done:
                        made.set()
        return stopped
