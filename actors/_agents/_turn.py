"""What a behaviour sees during one turn.

A :class:`Turn` is created by the agent's actor for each FIFO turn and handed to
the behaviour. It carries the delivered message (exactly one: a follow-up, the
initial prompt, or a waking report), the quiet reports injected as context since
the previous turn, the cancellation signal, the session history before the turn
(model history: descriptors are log-only and absent), and the agent's own service
bound as parent (``turn.subagents``, from the host: this layer never imports the
subagent service).
"""

from __future__ import annotations

import datetime as _dt
import logging
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from subagents.actors._kernel._signal import AbortController, AbortSignal
from subagents.protocol import (
    AgentOptionsEvent,
    CorruptRecordError,
    Event,
    ExpectedEvent,
    MessageId,
    MessageSource,
    SessionHeader,
    SessionId,
    SubagentDescriptorEvent,
    SubagentError,
    TurnRecord,
    check_name,
    check_source,
    check_value,
)
from subagents.store import LogRecord

from ._host import AgentHost
from ._options import AgentOptions
from ._steering import SteerBox

__all__ = ["Message", "Turn", "TurnAgent"]

_LOG_ONLY = (SubagentDescriptorEvent, AgentOptionsEvent, ExpectedEvent)

logger = logging.getLogger("subagents")


@dataclass(frozen=True, slots=True, kw_only=True)
class Message:
    """One delivered message: ``kind`` is ``"message"`` or ``"report"``."""

    message_id: MessageId
    content: Any
    source: MessageSource | None = None
    kind: str = "message"


class TurnAgent(Protocol):
    """The agent as a turn shows it (``turn.agent``; :class:`Agent` is one)."""

    options: AgentOptions

    @property
    def session_id(self) -> SessionId:
        """The agent's session id."""

    @property
    def header(self) -> SessionHeader:
        """The session's header."""

    @property
    def label(self) -> str | None:
        """The session's label, or ``None``."""

    @property
    def parent_session(self) -> SessionId | None:
        """The parent's session id, or ``None``."""

    @property
    def delegation_depth(self) -> int:
        """How deep below its root this agent delegates."""

    @property
    def idle(self) -> bool:
        """Whether no turn runs or waits."""

    @property
    def disposed(self) -> bool:
        """Whether disposal began."""

    @property
    def host(self) -> AgentHost:
        """What the agent sees of its runtime."""

    @property
    def extra_tools(self) -> Mapping[str, Callable[..., Any]]:
        """Tools only this agent has (from setup contributions), by name."""

    def followup(
        self,
        content: Any,
        *,
        source: MessageSource | None = None,
        message_id: MessageId | None = None,
    ) -> MessageId:
        """Submit one message as a later turn (see :meth:`Agent.followup`)."""

    def cancel(self, cause: Any = None, *, keep_inbox: bool = True) -> None:
        """Cancel the running turn (``keep_inbox=False``: and the queued ones)."""

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no turn runs or waits; False on timeout."""

    def dispose(
        self, *, flush: bool = True, timeout: float | None = 30.0, wait: bool = True
    ) -> None:
        """Cancel everything, stop, release the session (see :meth:`Agent.dispose`)."""


class Turn:
    """The behaviour's view of one running turn (valid only while it runs).

    Attributes:
        index: the turn's number in its session, from 0 (gapless unless a resume
            skipped damaged rows).
        context: quiet reports and other context delivered since the last turn,
            as :class:`Message` values, oldest first.
    """

    __slots__ = (
        "_agent",
        "_controller",
        "_delivered",
        "_history_through",
        "_lock",
        "_record",
        "_runner",
        "_steer",
        "_usage",
        "began",
        "context",
        "index",
    )

    def __init__(
        self,
        agent: TurnAgent,
        index: int,
        delivered: Any,
        context: tuple[Message, ...],
        history_through: int,
        lock: Any,
        runner: Any = None,
        record: TurnRecord | None = None,
    ) -> None:
        self._agent = agent
        self.index = index
        self._delivered = delivered  # the inbox envelope: id, content, source, kind
        self.context = context
        self._history_through = history_through  # last seq before this turn began
        self._lock = lock  # the agent's lock: cancel() may make the controller too
        self._controller: AbortController | None = None
        self._usage: dict[str, int] | None = None
        #: Messages steered into this turn (made by the first steer, under ``_lock``).
        self._steer: SteerBox | None = None
        #: The turn's runner: logs the steered messages the turn takes
        #: (``record_steered``); None outside a runner (nothing to log).
        self._runner = runner
        self._record = record  # the turn as logged: its start time, dated when read
        #: When the turn began on the monotonic clock (``time.perf_counter``): what a
        #: remote interrupt's age is measured against (no wall-clock step moves it).
        self.began = time.perf_counter()

    @property
    def started_at(self) -> _dt.datetime | None:
        """When the turn began: its ``turn/start`` time (None outside a runner)."""
        record = self._record
        return None if record is None else record.at

    def _controller_locked(self) -> AbortController:
        """The turn's controller, made on first use; the caller holds ``_lock``."""
        controller = self._controller
        if controller is None:
            controller = self._controller = AbortController()
        return controller

    @property
    def messages(self) -> tuple[Message, ...]:
        """The message(s) this turn claimed (one: a follow-up, prompt or waking report)."""
        d = self._delivered
        return (Message(message_id=d.message_id, content=d.content, source=d.source, kind=d.kind),)

    @property
    def agent(self) -> TurnAgent:
        """The agent running this turn."""
        return self._agent

    @property
    def content(self) -> Any:
        """Content of the delivered message."""
        return self._delivered.content

    @property
    def redelivered(self) -> bool:
        """This turn's message may have run before: a crash cut its turn short, or
        ended the activation it had been handed to. Be idempotent about it."""
        return bool(self._delivered.redelivered)

    @property
    def signal(self) -> AbortSignal:
        """Aborted when the turn is cancelled (interrupt, dispose, run abort)."""
        # Most turns are never cancelled: the controller is made on first use.
        with self._lock:
            return self._controller_locked().signal

    @property
    def cancelled(self) -> bool:
        """Whether this turn was cancelled (its ``signal`` aborted)."""
        controller = self._controller
        return controller is not None and controller.signal.aborted

    @property
    def history(self) -> tuple[Event, ...]:
        """Session events before this turn, without the log-only ``subagent/descriptor``,
        ``agent/options`` and ``message/expected`` records.

        A stored row that does not decode is left out: an agent resumed around
        damage (``damaged="skip"``, or a damaged row behind the checkpoint its
        resume started from) sees the rows that decode, in order. Each such seq
        is logged once per agent (a warning), unless its resume named it already.
        """
        agent = self._agent
        if _skipped(agent) or agent in _DAMAGE_SEEN:
            records = _decodable(agent)
        else:
            try:  # the common case: one read of a log with nothing damaged
                records = agent.host.sessions.read(agent.session_id)
            except CorruptRecordError:
                records = _decodable(agent)
        return tuple(
            r.event
            for r in records
            if r.seq <= self._history_through and not isinstance(r.event, _LOG_ONLY)
        )

    @property
    def persona(self) -> str | None:
        """The agent's persona, or ``None``."""
        return self._agent.options.persona

    @property
    def output_schema(self) -> Mapping[str, Any] | None:
        """The JSON Schema this turn's output must satisfy (the run's
        ``output_schema``: a completed turn whose output fails it ends ``failed``),
        or ``None``."""
        runner = self._runner
        return runner.output_schema if runner is not None else None

    @property
    def tools(self) -> tuple[str, ...]:
        """Names of the tools this agent may call (after its tool filter)."""
        agent = self._agent
        return agent.host.tools.visible(agent.options.tool_filter, agent.extra_tools)

    def call_tool(self, name: str, /, *args: Any, **kwargs: Any) -> Any:
        """Call a tool registered on the runtime, if this agent's filter allows it.

        Raises:
            SubagentError: ``UNAUTHORIZED`` when filtered out, ``INVALID_ARGUMENT``
                when no such tool exists.
        """
        agent = self._agent
        return agent.host.tools.call(
            agent.options.tool_filter, agent.extra_tools, name, self, *args, **kwargs
        )

    def steering(self) -> tuple[Message, ...]:
        """Messages steered into this turn since the last call, oldest first.

        Call it at the behaviour's safe points -- between model calls -- to let
        ``followup(..., steer=True)`` reach the running turn. Each message
        returned is recorded in the session log inside this turn, so a replay sees
        the same turn content; a steered message the turn never takes runs as the
        next turn instead (see :mod:`~._steering`). A turn whose runtime lost the
        session's lease (another process took it over) is handed none: they are
        the new holder's to run.
        """
        box = self._steer
        if box is None:  # no steer yet; one arriving now is seen at the next safe point
            return ()
        with self._lock:
            fresh = box.take()
        if fresh and self._runner is not None and not self._runner.record_steered(fresh):
            return ()  # its holder lost the session: the new holder runs them
        return tuple(fresh)

    def expect(self, message_id: str, content: Any, source: MessageSource | None = None) -> None:
        """Promise the agent a later message under ``message_id`` (a background
        run's result), with ``content`` (from ``source``) to deliver in its place if
        the promise cannot be kept: logged inside this turn, and -- once the turn
        ended, unless it runs again -- if no message with that id reached the agent
        when its activation ends, its next activation delivers ``content`` under
        that id, once (``docs/durability.md``).

        Raises:
            SubagentError: ``INVALID_ARGUMENT`` for an id that is no message id, or a
                turn no longer running; ``ENCODE_ERROR`` for a ``content`` or
                ``source`` the log cannot hold.
        """
        mid = MessageId(message_id)
        check_value(content)
        if source is not None:
            check_source(source)
        event = ExpectedEvent(message_id=mid, content=content, source=source)
        if self._runner is not None:  # (outside a runner nothing is logged)
            self._runner.record_expected(self, event)

    @property
    def usage(self) -> Mapping[str, int] | None:
        """Token counters recorded so far by :meth:`add_usage` (``None`` before any);
        the turn's ``turn/end`` records them."""
        return self._usage

    def add_usage(self, counts: Mapping[str, Any]) -> None:
        """Add a model call's token counters to the turn's (an OpenAI ``usage`` block).

        Non-negative integer counters are summed by name, nested blocks
        (``prompt_tokens_details``) flattened as ``prompt_tokens_details.cached_tokens``;
        anything else is ignored, so a provider's extra fields never fail the turn:
        a name UTF-8 cannot encode, a counter past what the log stores (2**64 - 1;
        a sum stops there), names beyond the first :data:`MAX_COUNTERS` of a turn
        (a turn's end must stay a record the log holds).
        """
        usage = self._usage if self._usage is not None else {}
        for name, value in _counters(counts, ""):
            if name in usage:
                usage[name] = min(usage[name] + value, _MAX_COUNT)
            elif len(usage) < MAX_COUNTERS:
                usage[name] = value
        self._usage = usage

    @property
    def subagents(self) -> Any:
        """This agent's subagent service, bound as the delegating parent.

        One-shot calls default their cancellation signal to this turn's signal.
        """
        return self._agent.host.bind(self._agent, self)


#: The damaged seqs each agent's history has left out and logged: only agents
#: whose log holds damage have an entry, gone with the agent. A known one's
#: turns scan at once, no failing read first.
_DAMAGE_SEEN: weakref.WeakKeyDictionary[Any, set[int]] = weakref.WeakKeyDictionary()
_DAMAGE_LOCK = threading.Lock()


def _skipped(agent: TurnAgent) -> tuple[int, ...]:
    """The seqs the agent's resume went around (an :class:`Agent`'s ``damaged_seqs``)."""
    skipped: tuple[int, ...] = getattr(agent, "damaged_seqs", ())
    return skipped


def _decodable(agent: TurnAgent) -> list[LogRecord]:
    """The agent's log without its rows that do not decode (a scan); logs each
    damaged seq its resume did not name, once for the agent."""
    damaged: list[int] = []
    records = agent.host.sessions.read_decodable(agent.session_id, damaged)
    with _DAMAGE_LOCK:
        try:
            seen = _DAMAGE_SEEN.get(agent)
            if seen is None:
                seen = _DAMAGE_SEEN[agent] = set(_skipped(agent))
        except TypeError:  # an agent without weak references: remembered by none
            seen = set(_skipped(agent))
        fresh = [seq for seq in damaged if seq not in seen]
        seen.update(fresh)
    for seq in fresh:
        logger.warning(
            "turn history of %s leaves out seq %d: the stored event does not decode",
            agent.session_id,
            seq,
        )
    return records


_MAX_COUNT = 2**64 - 1  # the largest int the log's msgpack holds
#: The most usage counters a turn records (an OpenAI usage block has about ten).
MAX_COUNTERS = 256


def _storable_name(name: str) -> bool:
    try:
        check_name(name, "a usage counter's name")  # the log's rule for a name
    except SubagentError:
        return False
    return True


def _counters(counts: Any, prefix: str) -> list[tuple[str, int]]:
    if not isinstance(counts, Mapping):
        return []
    found: list[tuple[str, int]] = []
    for name, value in counts.items():
        if type(name) is not str or not _storable_name(name):
            continue
        if type(value) is int and 0 <= value <= _MAX_COUNT:
            found.append((prefix + name, value))
        elif isinstance(value, Mapping) and not prefix:
            found.extend(_counters(value, f"{name}."))
    return found
