"""Making a persisted session live again: lease, state, the crash's loose ends, replay.

A resume takes the session's lease first (``LEASE_HELD`` if another live process
has it), then reads the checkpoint and the events after it, rebuilds the agent,
and deals with what a crash may have left:

* a turn that started and never ended (the process died inside it) gets its
  ``turn/end`` -- ``failed``, "cut short" -- so the log stays well formed;
* events that do not decode refuse the resume (``CORRUPT_RECORD``), unless the
  caller -- a user authority repairing a tree -- asks for ``damaged="skip"``: the
  agent is then rebuilt around them (they stay in the store, untouched; their
  seqs are logged and kept on ``agent.damaged_seqs``; turn numbers skip ahead so
  none is reused). A subagent session without its descriptor is
  ``DESCRIPTOR_CORRUPT`` either way: nothing says what it was;
* a message promised to the session that never came (a background run's result,
  the run gone with its process: :mod:`._expected`) is accepted now, as its
  stand-in, under the promised id -- nothing new where the inbox accepted that id;
  the message itself where the behaviour reads it from the store (a run that
  ended, its result never delivered: ``promised_message``);
* the messages still pending in the durable inbox are handed to the new
  activation (recorded in the store before they run) and replayed in acceptance
  order with their original ids and sources; those that an earlier activation
  had taken, and so may have started, carry ``redelivered=True``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from typing import Any

from subagents.protocol import (
    AgentOptionsEvent,
    ContinuableDescriptor,
    CorruptRecordError,
    DescriptorFold,
    ErrorCode,
    Event,
    ExpectedEvent,
    MessageId,
    SessionHeader,
    SessionId,
    SubagentError,
    TurnEnd,
    TurnStart,
    agent_options_event,
    fold_agent_options,
    parse_descriptor_payload,
    try_fold_subagent_descriptor,
)
from subagents.store import InboxEntry

from ._agent import Agent
from ._ahead import replay, replay_first
from ._behaviours import Behaviour, ModelRegistry, as_behaviour
from ._expected import behind, checkpointed, fold_owed, settled, stand_ins, unstored
from ._host import AgentHost
from ._options import AgentOptions
from ._outcome import KEPT
from ._sessions import SessionService
from ._write_faults import unsure

__all__ = [
    "CUT_SHORT",
    "DAMAGED_POLICIES",
    "Restored",
    "recorded_payload",
    "replay",
    "replay_first",
    "restore",
    "stored_options",
]

logger = logging.getLogger("subagents")

#: What a resume does with events that do not decode: refuse, or rebuild around them.
DAMAGED_POLICIES = ("refuse", "skip")

#: The error text of the ``turn/end`` a resume writes for a turn a crash cut short.
CUT_SHORT = "cut short: the runtime stopped before the turn ended"


class Restored:
    """A resumed agent (started, not yet registered), its pending messages, and the
    ids of those it took from nobody (to give back if it rolls back unpublished)."""

    __slots__ = ("agent", "handed", "pending")

    def __init__(self, agent: Agent, pending: list[InboxEntry], handed: list[Any]) -> None:
        self.agent = agent
        self.pending = pending
        self.handed = handed

    def give_back(self) -> None:
        """Return the messages this resume took, unrun (before disposing the agent)."""
        if self.handed:
            agent = self.agent
            token = agent.session.token
            assert token is not None
            agent.host.sessions.give_back(agent.session_id, self.handed, token[1])


def restore(
    host: AgentHost,
    models: ModelRegistry,
    sid: SessionId,
    *,
    behaviour: Any = None,
    options: AgentOptions | None = None,
    output_schema: Any = None,
    start: Callable[..., Agent],
    damaged: str = "refuse",
) -> Restored:
    """Resume ``sid`` (see the module docstring); ``start`` builds the agent."""
    if damaged not in DAMAGED_POLICIES:
        raise SubagentError("damaged is 'refuse' or 'skip'", code=ErrorCode.INVALID_ARGUMENT)
    skipped: list[int] | None = [] if damaged == "skip" else None
    sessions = host.sessions
    leases = sessions.leases
    token = None
    if leases is not None:
        # An earlier epoch of this runtime may still have writes queued (its last
        # turn/end, its release): they land before the lease moves on, or the
        # new epoch's fence would refuse them.
        sessions.flush()
        token = leases.acquire(sid).token()
    try:
        try:
            header, next_seq, state, records = sessions.load_state(sid, skipped)
        except CorruptRecordError as exc:
            raise _damaged(sessions.header(sid), exc) from exc
        events = [r.event for r in records]
        fold = _fold(header, state, events)
        if options is None:
            options = options_from_fold(fold, sid, behaviour, events, state)
        if output_schema is None and header.parent_session is None:
            output_schema = recorded_schema(events, state)  # what it was spawned with
        built: Behaviour = (
            as_behaviour(behaviour)
            if behaviour is not None
            else models.create(options.model, options)
        )
        next_turn = (state or {}).get("next_turn", 0) + sum(
            1 for e in events if isinstance(e, TurnStart)
        )
        if skipped:
            seen = [e.turn for e in events if isinstance(e, (TurnStart, TurnEnd))]
            next_turn = max([next_turn, *(t + 1 for t in seen)]) + len(skipped)
            logger.warning(
                "resuming %s around %d damaged events: seqs %s", sid, len(skipped), skipped
            )
        live = sessions.attach(header, next_seq, token)
    except BaseException:
        if token is not None:
            sessions.give_up(sid, token)
        raise
    live.replay_due = True  # until its owner queues the replay (_ahead.replay_first)
    agent = start(live, built, options, next_turn, output_schema, sessions.release)
    agent.damaged_seqs = tuple(skipped or ())
    if fold.verdict == "ok" and isinstance(fold.descriptor, ContinuableDescriptor):
        agent._descriptor = fold.descriptor
    elif header.parent_session is None:
        agent._recorded = recorded_payload(events, state)
    try:
        open_turn = _open_turn(events)
        if open_turn is not None:
            sessions.append(
                live,
                (TurnEnd(turn=open_turn, at=host.clock(), stop_reason="failed", error=CUT_SHORT),),
            )
        kept, promised = checkpointed(state), records
        if kept is None:  # an older runtime's checkpoint: its promises are behind it
            assert state is not None
            promised = behind(state, lambda: sessions.read_decodable(sid, []), records)
        owed = fold_owed(promised, header.seed_len, kept or {}, _runs_again(sessions, sid, token))
        owed = settled(owed, built, sessions)  # a promise kept after all: its message
        agent._turns.owed = owed or None
        pending: list[InboxEntry] = []
        fresh: list[Any] = []
        if token is not None:  # (relaxed too: a strict process's, a crash's)
            if owed:  # their stand-ins, where the inbox has not accepted their ids
                sessions.accept(sid, stand_ins(owed), live)
            # In the inbox now, the store's record goes -- also a row the log does
            # not back (its turn cut short after it was written): else owed for good.
            logged = owed or kept or any(type(r.event) is ExpectedEvent for r in promised)
            if logged or sessions.owes(sid):
                sessions.owe(live, clear=True)
            pending = sessions.pending(sid)
            fresh = [e.message_id for e in pending if e.epoch is None]
            if fresh:
                fresh = _take(sessions, live, fresh)
                # One it did not take was taken back meanwhile (its caller told so).
                held = set(fresh)
                pending = [e for e in pending if e.epoch is not None or e.message_id in held]
        elif owed:  # no durable inbox (a memory store): delivered as if accepted
            pending = unstored(owed)
        if state is not None and not any(isinstance(e, TurnStart) for e in events):
            # Quiet reports the checkpoint kept; those still in the durable inbox
            # are replayed from there instead.
            replayed = {e.message_id for e in pending}
            context = [c for c in state.get("context") or () if c[0] not in replayed]
            agent._restore_context(context)
    except BaseException:
        agent.dispose(flush=False)
        raise
    return Restored(agent, pending, fresh)


def _take(sessions: SessionService, live: Any, fresh: list[MessageId]) -> list[MessageId]:
    """A resume's hand-over of the messages nobody took. One whose answer was lost
    may have taken them all the same: the resume fails (nothing of them ran), and
    they go back to nobody first -- else the next activation would take them for
    messages a turn of this one had run (``redelivered``). A give-back that fails
    too leaves them so: they still run, once."""
    try:
        taken: list[MessageId] = sessions.hand_over(live.id, fresh, live)
    except SubagentError as exc:
        if unsure(exc):
            with contextlib.suppress(SubagentError):
                sessions.give_back(live.id, fresh, live.token[1])
        raise
    return taken


def _runs_again(
    sessions: SessionService, sid: SessionId, token: Any
) -> Callable[[tuple[MessageId, ...], TurnEnd | None], bool]:
    """Whether a turn of the log runs again at this activation (``fold_owed``): one
    cut short by a crash, or kept by a closing runtime, whose message is still in
    the durable inbox -- always, under strict durability; under relaxed, where it
    came from the inbox (a strict process's, a send's), read once if asked."""
    pending: set[MessageId] | None = None

    def runs_again(mids: tuple[MessageId, ...], end: TurnEnd | None) -> bool:
        nonlocal pending
        if end is not None and end.error not in (CUT_SHORT, KEPT):
            return False
        if sessions.strict:
            return True
        if pending is None:
            pending = set()
            if token is not None:
                pending = {e.message_id for e in sessions.pending(sid)}
        return any(mid in pending for mid in mids)

    return runs_again


def _damaged(header: SessionHeader | None, exc: CorruptRecordError) -> SubagentError:
    """What a resume that read a row that does not decode raises: a subagent's
    descriptor row (at ``seed_len``) is ``DESCRIPTOR_CORRUPT`` -- nothing says what
    the child was; another row ``CORRUPT_RECORD``, with the way around the damage
    where there is one (a top-level session: ``resume(..., damaged="skip")``)."""
    if header is None or header.origin != "subagent":
        way = "; a user authority may resume it around the damage (resume(..., damaged='skip'))"
    elif exc.seq == header.seed_len:
        return SubagentError(
            f"session {header.id} has a corrupt descriptor: its row (seq {exc.seq}) does not"
            f" decode ({exc.args[0]})",
            code=ErrorCode.DESCRIPTOR_CORRUPT,
            hint={"session_id": header.id, "seq": exc.seq},
        )
    else:
        way = "; a subagent's log is resumed whole or not at all"
    return CorruptRecordError(f"{exc.args[0]}{way}", session_id=exc.session_id, seq=exc.seq)


def _open_turn(events: list[Event]) -> int | None:
    """The index of a turn that started and has no end, if the log ends inside one."""
    started: int | None = None
    for event in events:
        if isinstance(event, TurnStart):
            started = event.turn
        elif isinstance(event, TurnEnd) and event.turn == started:
            started = None
    return started


def stored_options(sessions: SessionService, sid: SessionId) -> tuple[SessionHeader, AgentOptions]:
    """A persisted session's header, and the options a resume would rebuild it with,
    read without activating it (no lease taken): what a start by the parent's id
    needs of a parent live in another process.

    Raises:
        SubagentError: ``SESSION_NOT_FOUND``, ``CORRUPT_RECORD``,
            ``DESCRIPTOR_CORRUPT`` / ``DESCRIPTOR_UNSUPPORTED``, ``MODEL_NOT_FOUND``
            (it records no model).
    """
    header, _next_seq, state, records = sessions.load_state(sid)
    events = [r.event for r in records]
    return header, options_from_fold(_fold(header, state, events), sid, None, events, state)


def recorded_payload(
    events: Sequence[Event], state: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """A top-level session's recorded options as its log (after ``state``, a
    checkpoint that carries them) records them: the ``agent/options`` payload a
    checkpoint of it keeps, or None (none recorded, or not readable: then its
    resumes are told, as without a checkpoint)."""
    recorded = fold_agent_options(_with_checkpointed(events, state))
    if recorded.verdict != "ok" or recorded.options is None:
        return None
    return dict(agent_options_event(recorded.options).payload)


def _with_checkpointed(events: Sequence[Event], state: dict[str, Any] | None) -> Sequence[Event]:
    """``events``, after the options a checkpoint carries (the log's own record of
    them is before the checkpoint; a later record wins)."""
    kept = None if state is None else state.get("options")
    return events if kept is None else [AgentOptionsEvent(payload=kept), *events]


def recorded_schema(events: Sequence[Event], state: dict[str, Any] | None) -> Any:
    """A top-level session's recorded output schema (``agent/options``; after
    ``state``, a checkpoint that carries them), or None: none recorded (older
    records have none), or the record not readable."""
    recorded = fold_agent_options(_with_checkpointed(events, state))
    options = recorded.options if recorded.verdict == "ok" else None
    return None if options is None else options.output_schema


def options_from_fold(
    fold: Any,
    sid: SessionId,
    behaviour: Any,
    events: Sequence[Event] = (),
    state: dict[str, Any] | None = None,
) -> AgentOptions:
    """The options a resumed agent is rebuilt with: from its continuable descriptor,
    else (a top-level agent) from its recorded ``agent/options`` (``state``: a
    checkpoint, which carries them)."""
    if fold.verdict == "ok" and isinstance(fold.descriptor, ContinuableDescriptor):
        d = fold.descriptor
        return AgentOptions(
            model=d.model,
            provider=d.agent_provider,
            persona=d.persona,
            tool_filter=d.tool_filter,
        )
    if fold.verdict in ("corrupt", "unsupported"):
        code = (
            ErrorCode.DESCRIPTOR_CORRUPT
            if fold.verdict == "corrupt"
            else ErrorCode.DESCRIPTOR_UNSUPPORTED
        )
        raise SubagentError(
            f"session {sid} has a {fold.verdict} descriptor: {fold.reason}", code=code
        )
    recorded = fold_agent_options(_with_checkpointed(events, state))
    if recorded.verdict == "ok" and recorded.options is not None:
        o = recorded.options
        return AgentOptions(
            model=o.model,
            provider=o.provider or "local",
            persona=o.persona,
            tool_filter=o.tool_filter,
        )
    if behaviour is not None:
        return AgentOptions()
    if recorded.verdict in ("corrupt", "unsupported"):
        raise SubagentError(
            f"session {sid} has {recorded.verdict} agent options: {recorded.reason}",
            code=ErrorCode.DESCRIPTOR_CORRUPT
            if recorded.verdict == "corrupt"
            else ErrorCode.DESCRIPTOR_UNSUPPORTED,
        )
    raise SubagentError(
        f"session {sid} records no model; pass options= or behaviour=",
        code=ErrorCode.MODEL_NOT_FOUND,
    )


def _fold(
    header: SessionHeader, state: dict[str, Any] | None, events: list[Event]
) -> DescriptorFold:
    """Fold the descriptor from a checkpoint plus the events after it (last wins); a
    subagent session with none at all is corrupt."""
    fold = try_fold_subagent_descriptor(events)
    if fold.verdict != "absent" or state is None or state.get("descriptor") is None:
        if fold.verdict == "absent" and header.origin == "subagent" and state is None:
            return DescriptorFold(verdict="corrupt", reason="its descriptor is missing")
        return fold
    try:
        return DescriptorFold(
            verdict="ok", descriptor=parse_descriptor_payload(state["descriptor"])
        )
    except SubagentError as exc:
        if exc.code == ErrorCode.DESCRIPTOR_UNSUPPORTED:
            return DescriptorFold(verdict="unsupported", reason=str(exc))
        return DescriptorFold(verdict="corrupt", reason=str(exc))
