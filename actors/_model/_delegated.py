"""What a model reads of a ``delegate`` (for the dispatcher, :mod:`._dispatch`).

* A run's result as a tool result: ``id``, ``stop_reason``, ``output`` (and
  ``structured``); a run that did not complete also carries ``error``, the
  ``{"code", "message"}`` of why, as a refused call's result does
  (:func:`run_result`). The reason is the child's: its last ``turn/end`` records
  it (``"ModelError: [MODEL_ERROR] ..."`` gives that code and message; a failure
  that names no code -- a behaviour's own exception, an output that does not
  match its schema -- is ``INTERNAL`` with the recorded text). A run whose log is
  not here (another provider's) says that it recorded no reason.
* Background delegation is refused to a one-shot child (:func:`one_shot`,
  :func:`background_refused`): its run ends with the turn that would start the
  background run, which the child's disposal cancels, and the result could reach
  nobody -- a one-shot run takes no follow-up. Refused before anything starts,
  the model reads why and what to do instead: wait for the result (the
  ``delegate`` calls of one answer run at once).
* A background run whose result never came (:func:`lost_result`): the process
  running it stopped -- a crash, the runtime closing or disposing the agent --
  before the run ended. Its agent's next activation delivers this in the
  result's place (``Turn.expect``): stop reason ``cancelled``, error
  ``CANCELLED``. A run that did end there, its result never delivered, has
  its real result delivered instead, read from its child's log
  (:func:`kept_result`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from subagents.actors._agents import SessionService, Turn
from subagents.actors._children import RunResult
from subagents.protocol import (
    ErrorCode,
    ExpectedEvent,
    SubagentDescriptorEvent,
    SubagentError,
    error_text,
)

__all__ = [
    "LOST",
    "background_refused",
    "failure",
    "kept_result",
    "lost_result",
    "one_shot",
    "run_result",
]

#: The longest ``message`` of an ``error`` a tool result carries.
MAX_MESSAGE: Final = 2000

#: ``error_text`` of a ``SubagentError``: ``"Type: [CODE] message"``.
_CODED: Final = re.compile(r"[A-Za-z_][\w.]*: \[([A-Z][A-Z0-9_]*)\] (.*)", re.DOTALL)


def failure(exc: BaseException) -> dict[str, str]:
    """``{"code", "message"}`` of ``exc``: a ``SubagentError``'s own, else ``INTERNAL``."""
    if isinstance(exc, SubagentError):
        message = exc.args[0] if exc.args else ""
        return {"code": exc.code, "message": str(message)[:MAX_MESSAGE]}
    return {"code": ErrorCode.INTERNAL, "message": error_text(exc)[:MAX_MESSAGE]}


def _recorded_failure(sessions: SessionService, run_id: str, stop_reason: str) -> dict[str, str]:
    """Why the run ``run_id`` ended ``stop_reason``: its child's last recorded error."""
    text: str | None = None
    try:
        ends = sessions.turn_ends(run_id)
    except SubagentError:  # not a session of this store (another provider's run)
        ends = []
    if ends and isinstance(ends[-1].error, str):
        text = ends[-1].error
    if stop_reason == "cancelled":
        return {
            "code": ErrorCode.CANCELLED,
            "message": (text or "the subagent's run was cancelled")[:MAX_MESSAGE],
        }
    if text is None:
        text = f"the subagent's run ended {stop_reason!r} and recorded no reason"
        return {"code": ErrorCode.INTERNAL, "message": text[:MAX_MESSAGE]}
    coded = _CODED.fullmatch(text)
    if coded is not None:
        return {"code": coded[1], "message": coded[2][:MAX_MESSAGE]}
    return {"code": ErrorCode.INTERNAL, "message": text[:MAX_MESSAGE]}


def run_result(
    sessions: SessionService, run_id: object, result: RunResult, *, structured: bool = True
) -> dict[str, Any]:
    """The tool result of a settled run (see the module docstring), the reason of a
    failure read from ``sessions``; ``structured``: with the run's structured
    output, when it has one."""
    out: dict[str, Any] = {
        "id": str(run_id),
        "stop_reason": result.stop_reason,
        "output": result.output,
    }
    if structured and result.structured is not None:
        out["structured"] = result.structured
    if result.stop_reason != "completed":
        out["error"] = _recorded_failure(sessions, str(run_id), str(result.stop_reason))
    return out


#: Why a background run's result never came (the ``message`` of its ``error``).
LOST: Final = (
    "its process stopped before the run ended (a crash, or the runtime closed or disposed"
    " the agent that started it): the run delivers no result"
)


def kept_result(sessions: SessionService, promise: ExpectedEvent) -> dict[str, Any] | None:
    """The ``delegate_result`` a background run's promise stands for, read from its
    child's log where the run ended there (completed, or failed) though its result
    never reached the agent -- its process stopped as it was delivered, or the
    delivery failed: what :func:`run_result` would have said, once delivered. None
    for another promise, a run that did not end (or was cancelled: the stand-in
    says so), or a child whose log is not here."""
    content, source = promise.content, promise.source
    if source is None or source.kind != "child" or source.session_id is None:
        return None
    if not isinstance(content, Mapping) or not isinstance(content.get("delegate_result"), Mapping):
        return None
    try:
        ends = sessions.turn_ends(source.session_id)
    except SubagentError:  # not a session of this store, or a damaged log: the stand-in
        return None
    if not ends or ends[-1].stop_reason == "cancelled":
        return None
    end = ends[-1]
    ran = RunResult(output=end.output, structured=None, stop_reason=end.stop_reason)
    return {"delegate_result": run_result(sessions, source.session_id, ran, structured=False)}


def lost_result(run_id: object) -> dict[str, Any]:
    """The ``delegate_result`` delivered in place of a background run's result that
    never came (see the module docstring)."""
    error = {"code": ErrorCode.CANCELLED, "message": LOST}
    return {
        "delegate_result": {
            "id": str(run_id),
            "stop_reason": "cancelled",
            "output": None,
            "error": error,
        }
    }


def one_shot(turn: Turn) -> bool:
    """Whether the turn's agent is a one-shot child: its ``subagent/descriptor``
    (the first after its seed) says so. A top-level agent is none, nor is an agent
    whose log cannot say."""
    agent = turn.agent
    if agent.parent_session is None:
        return False
    try:
        records = agent.host.sessions.read(agent.session_id, agent.header.seed_len)
    except SubagentError:
        return False
    for record in records:
        event = record.event
        if isinstance(event, SubagentDescriptorEvent):
            payload = event.payload
            return isinstance(payload, Mapping) and payload.get("mode") == "one-shot"
    return False


def background_refused() -> SubagentError:
    """The refusal of a one-shot child's background ``delegate`` (``INVALID_ARGUMENT``)."""
    return SubagentError(
        "a one-shot subagent cannot delegate in the background: its run ends with this"
        " turn, so the result would reach nobody. Call delegate without background and"
        " wait for the result (the delegate calls of one answer run at the same time).",
        code=ErrorCode.INVALID_ARGUMENT,
    )
