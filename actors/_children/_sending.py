"""The subagent service's follow-up beyond its common case (a live parent, no wait,
no tracing, which goes straight to the continuation manager): a parent named by
its session id (:mod:`._remote`; a steer by it: :func:`steer_by_id`), waiting for
room in a bounded inbox (:mod:`._room`), and the acceptance's span when the
runtime traces."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from subagents.actors._agents import (
    Agent,
    AgentRegistry,
    SessionService,
    Steered,
    check_steer,
    not_open,
)
from subagents.actors._kernel import AbortSignal, Telemetry, check_timeout, stamp, traced
from subagents.protocol import MessageId, MessageSource, SessionId

from ._continuation import ContinuationManager
from ._remote import followup_by_id
from ._room import until_room
from ._validate import check_signal

__all__ = ["send_followup"]


def send_followup(
    agents: AgentRegistry,
    sessions: SessionService,
    continuation: ContinuationManager,
    telemetry: Telemetry | None,
    parent: Any,
    child_id: Any,
    content: Any,
    *,
    source: Any,
    signal: Any,
    message_id: Any,
    steer: Any,
    wait_for_room: Any,
) -> MessageId | Steered:
    """See :meth:`SubagentService.followup`."""
    wait = check_timeout(wait_for_room, "wait_for_room")
    call: Callable[[], MessageId | Steered]
    waits_for_room = True
    if isinstance(parent, Agent):
        parent_id = parent.session_id

        def call() -> MessageId | Steered:
            src = source if source is None else stamp(telemetry, source)
            return continuation.followup(
                parent, child_id, content, source=src, signal=signal,
                message_id=message_id, steer=steer,
            )  # fmt: skip
    else:
        parent_id = SessionId(parent)
        check_signal(signal)  # as the live parent's path, before anything is accepted
        if signal is not None:
            signal.raise_if_aborted()
        where = (agents, sessions, continuation, parent_id, SessionId(child_id), content)
        default = MessageSource(kind="parent", session_id=parent_id)

        def stamped() -> Any:  # inside the span: the message carries its context
            if telemetry is None:
                return source
            return stamp(telemetry, default if source is None else source)

        if steer is not False:  # a steer waits for no room; traced as any follow-up
            waits_for_room = False

            def call() -> MessageId | Steered:
                return steer_by_id(*where, stamped(), steer, message_id, signal)
        else:

            def call() -> MessageId | Steered:
                mid: MessageId = followup_by_id(*where, source=stamped(), message_id=message_id)
                return mid

    def run() -> MessageId | Steered:
        return until_room(call, wait, signal) if waits_for_room else call()

    if telemetry is None:
        return run()
    attrs = {"child_id": child_id, "parent_session_id": parent_id}
    return traced(telemetry, "subagents.followup", attrs, run)


def steer_by_id(
    agents: AgentRegistry,
    sessions: SessionService,
    continuation: ContinuationManager,
    parent_id: SessionId,
    child_id: SessionId,
    content: Any,
    source: MessageSource | None,
    steer: Any,
    message_id: MessageId | str | None = None,
    signal: AbortSignal | None = None,
) -> Steered:
    """A steer naming the parent by id: through the parent when it is live here
    (only a child resident here has a turn to steer), else queued by id --
    ``message_id`` deduplicating it either way."""
    strict = check_steer(steer)
    parent = agents.get(parent_id)
    if parent is not None:
        steered = continuation.followup(
            parent, child_id, content, source=source, signal=signal,
            message_id=message_id, steer=steer,
        )  # fmt: skip
        assert isinstance(steered, Steered)  # a steer was asked: the outcome
        return steered
    if strict:
        raise not_open(child_id)
    steered = followup_by_id(
        agents, sessions, continuation, parent_id, child_id, content,
        source=source, message_id=message_id, steer=steer,
    )  # fmt: skip
    assert isinstance(steered, Steered)  # a steer was asked: the outcome
    return steered
