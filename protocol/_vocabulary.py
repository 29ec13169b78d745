"""The session-event vocabulary: frozen, slotted, keyword-only dataclasses.

A session's log is a sequence of these events (see :mod:`._events` for their
wire form). The session header is not a log event: a store keeps it beside the
log, but it uses the same codec.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal

from ._ids import MessageId, SessionId

__all__ = [
    "ORIGINS",
    "SOURCE_KINDS",
    "STOP_REASONS",
    "AgentOptionsEvent",
    "Checker",
    "Event",
    "ExpectedEvent",
    "InterruptEvent",
    "MessageEvent",
    "MessageSource",
    "ReportEvent",
    "SessionHeader",
    "SubagentDescriptorEvent",
    "TurnEnd",
    "TurnStart",
    "UnknownEvent",
]

StopReason = Literal["completed", "cancelled", "failed"]
STOP_REASONS: Final = frozenset({"completed", "cancelled", "failed"})
Delivery = Literal["quiet", "waking"]
#: ``"user"`` for top-level agents, ``"subagent"`` for delegated children.
ORIGINS: Final = frozenset({"user", "subagent"})
SOURCE_KINDS: Final = frozenset({"user", "parent", "child", "host", "self"})


#: A field checker: a decoded wire value in, the field value out (or DecodeError).
Checker = Callable[[Any], Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageSource:
    """Who supplied a message. It records the sender and grants no authority.

    ``trace``: the W3C ``traceparent`` of the span that accepted the message, when
    the runtime traces (OpenTelemetry): the turn that runs it, in any process,
    continues that trace. Provenance only, like the rest.
    """

    kind: str
    session_id: SessionId | None = None
    trace: str | None = None

    def to_wire(self) -> dict[str, Any]:
        """The source as the log encodes it: ``kind``, ``session_id`` and, when set,
        ``trace`` (left off otherwise: untraced messages keep their bytes)."""
        if self.trace is None:
            return {"kind": self.kind, "session_id": self.session_id}
        return {"kind": self.kind, "session_id": self.session_id, "trace": self.trace}


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionHeader:
    """The durable identity of a session, stored beside its log.

    ``delegation_depth`` is the persisted floor of the agent's delegation depth:
    runtime options may raise it, never lower it. ``max_inbox`` bounds the
    session's inbox (messages accepted and not yet done) against follow-ups;
    ``None``: unbounded.
    """

    id: SessionId
    parent_session: SessionId | None
    origin: str
    delegation_depth: int
    created_at: _dt.datetime
    label: str | None = None
    seed_len: int = 0
    max_inbox: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """Base of every log event; ``type`` is the wire name of the subclass."""

    type: ClassVar[str] = ""
    _checkers: ClassVar[tuple[tuple[str, Checker, bool], ...]] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageEvent(Event):
    """One delivered message (prompt, follow-up or waking report) of a turn."""

    type: ClassVar[str] = "message"
    message_id: MessageId
    content: Any
    source: MessageSource | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportEvent(Event):
    """A child's report as the parent received it (quiet context or waking turn)."""

    type: ClassVar[str] = "report"
    message_id: MessageId
    content: Any
    source: MessageSource | None = None
    delivery: str = "quiet"


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnStart(Event):
    """A turn began; ``message_ids`` are the messages it claimed.

    ``redelivered``: those messages may have run before -- a crash cut their turn
    short, or ended the activation they had been handed to -- so the behaviour
    should be idempotent about them. Left off the wire when False.
    """

    type: ClassVar[str] = "turn/start"
    turn: int
    at: _dt.datetime
    message_ids: tuple[MessageId, ...] = ()
    redelivered: bool = False


@dataclass(frozen=True, slots=True, kw_only=True)
class TurnEnd(Event):
    """A turn ended with a stop reason (completed / cancelled / failed).

    ``usage`` is what the turn's model calls consumed, by counter name (an OpenAI
    ``usage`` block's ``prompt_tokens``, ``completion_tokens``, ``total_tokens``,
    summed over the turn's calls), or ``None`` for a turn that called no model.
    Left off the wire when ``None``.
    """

    type: ClassVar[str] = "turn/end"
    turn: int
    at: _dt.datetime
    stop_reason: str
    output: Any = None
    structured: Any = None
    error: str | None = None
    usage: Mapping[str, int] | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class InterruptEvent(Event):
    """An admitted interrupt (cancel with the inbox kept)."""

    type: ClassVar[str] = "interrupt"
    at: _dt.datetime
    cause: str | None = None
    authority: str = "self"
    by_session: SessionId | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SubagentDescriptorEvent(Event):
    """The durable ``subagent/descriptor``; ``payload`` is folded, not trusted.

    The payload stays a raw map so a malformed or future-version descriptor can be
    stored and later classified (corrupt vs unsupported) by the fold.
    """

    type: ClassVar[str] = "subagent/descriptor"
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentOptionsEvent(Event):
    """The durable ``agent/options`` of a top-level agent; ``payload`` is folded, not trusted.

    It records what the agent was spawned with (model, provider, persona, tool
    filter) so a new process can resume it without being given its model again.
    Like the descriptor's, the payload stays a raw map so a malformed or
    future-version record can be stored and later classified by the fold.
    """

    type: ClassVar[str] = "agent/options"
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ExpectedEvent(Event):
    """A message the session is owed, written inside the turn that made it owed.

    Someone promised the session a message under ``message_id`` (a background
    run's result). If that turn ended -- and does not run again -- and no message
    with this id reached the session when its activation ended (a crash, the
    runtime closing, a disposal), its next activation delivers ``content``, from
    ``source``, under ``message_id`` in its place: once, as any message id is
    accepted once. A runtime that does not know this type keeps it verbatim
    (:class:`UnknownEvent`) and delivers nothing.
    """

    type: ClassVar[str] = "message/expected"
    message_id: MessageId
    content: Any
    source: MessageSource | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class UnknownEvent(Event):
    """An event of a type this runtime does not know, kept verbatim."""

    type_name: str
    data: Mapping[str, Any] = field(default_factory=dict)
