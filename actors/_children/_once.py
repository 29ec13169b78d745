"""A one-shot start with a message id: it takes effect once per parent and id.

A model's turn that a crash cut short runs again, and its model delegates again
(see ``_model/_calls.py``); the call carries the same message id. A continuable
start is deduplicated by its child's id, derived from the parent's id and the
message id (``_intake.start_child_id``): a second start finds the child. A
one-shot start does the same, with an attempt number in the derivation (and a
personalisation of its own, so a one-shot and a continuable child never share
an id), and the child's prompt carries the message id -- the child's session is
the record of the start.

A start with ``message_id`` reads the children of attempts 0, 1, ... by their
ids -- each one keyed read of a header and that child's log, never a scan of
the store -- and stops at the first of them that answers:

* a child whose run completed (its turn ended ``completed``): the start returns
  a run already settled with that turn's recorded output, structured result and
  stop reason, as the first call returned it -- no local agent, nothing runs,
  nothing to dispose (the service still opens the run's ``subagent/start`` /
  ``subagent/end`` pair, ``local`` false, as for any run it returns);
* an id no session has: the new child takes it.

A child that did not complete -- its process died in the run, or it failed or
was cancelled -- is passed over: the start runs once more, as the next attempt.
So one id leaves at most one completed child. A child of the id still running
here (live, its turn not ended) is refused (``SESSION_EXISTS``) rather than run
twice. Starts with one id are meant to follow one another (a replay follows the
crash that cut the first short): two at once in two processes may both run.
Without a store a disposed child leaves no session, and a start runs again.
"""

from __future__ import annotations

from typing import Any

from subagents.actors._agents import SessionService
from subagents.actors._kernel import ResultFuture
from subagents.protocol import (
    ErrorCode,
    MessageEvent,
    MessageId,
    SessionId,
    SubagentError,
    TurnEnd,
)

from ._intake import derived_id
from ._types import RunResult, SubagentRun, SubagentStartRequest

__all__ = ["check_message_id", "earlier_run", "oneshot_child_id"]


def check_message_id(request: Any) -> None:
    """``request.message_id``, when given, is a message id (32 lowercase hex digits).

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` for one that is not.
    """
    if not isinstance(request, SubagentStartRequest) or request.message_id is None:
        return  # another request: the start's own checks refuse it
    try:
        MessageId(request.message_id)
    except SubagentError as exc:
        raise SubagentError(
            f"request.message_id: {exc.args[0]}"[:300], code=ErrorCode.INVALID_ARGUMENT
        ) from None


def oneshot_child_id(parent: SessionId, message_id: MessageId, attempt: int) -> SessionId:
    """The id of the child of attempt ``attempt`` of a one-shot start with ``message_id``."""
    return derived_id(
        b"subagents-once", parent.to_bytes(), message_id.to_bytes(), attempt.to_bytes(4, "big")
    )


def earlier_run(
    sessions: SessionService, parent: SessionId, message_id: MessageId
) -> tuple[SubagentRun | None, SessionId]:
    """What a start with ``message_id`` under ``parent`` finds (see the module
    docstring): the settled run of the earlier child that completed, else None
    and the id the new child takes.

    Raises:
        SubagentError: ``SESSION_EXISTS`` when a child of the id runs here now;
            ``CORRUPT_RECORD`` for an earlier child's log that does not decode.
    """
    attempt = 0
    while True:
        child_id = oneshot_child_id(parent, message_id, attempt)
        header = sessions.header(child_id)
        if header is None:
            return None, child_id
        if header.parent_session == parent:
            end = _ended(sessions, child_id, header.seed_len, message_id)
            if end is not None and end.stop_reason == "completed":
                return _settled(child_id, end), child_id
            if end is None and sessions.live(child_id) is not None:
                raise SubagentError(
                    f"a one-shot start with message id {message_id} runs now (child {child_id})",
                    code=ErrorCode.SESSION_EXISTS,
                )
        attempt += 1


def _ended(
    sessions: SessionService, child_id: SessionId, seed_len: int, message_id: MessageId
) -> TurnEnd | None:
    """The end of the child's run -- the first turn after its seed (a ``fork``
    child's log begins with its parent's history) -- when its prompt is the one of
    ``message_id``; else None."""
    prompt: MessageId | None = None
    for record in sessions.read(child_id, seed_len):
        event = record.event
        if prompt is None and isinstance(event, MessageEvent):
            prompt = event.message_id
        elif isinstance(event, TurnEnd):
            return event if prompt == message_id else None
    return None


def _settled(child_id: SessionId, end: TurnEnd) -> SubagentRun:
    """A run already settled with ``end``'s outcome; nothing to dispose."""
    result: ResultFuture[RunResult] = ResultFuture()
    result.set_result(RunResult(end.output, end.structured, end.stop_reason))
    return SubagentRun(id=child_id, local_agent=None, result=result, dispose=lambda _t: None)
