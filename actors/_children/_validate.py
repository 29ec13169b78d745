"""Checks of what callers hand the subagent service, before anything is created."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from subagents.actors._agents import Agent, check_output_schema
from subagents.actors._kernel import AbortSignal, check_max_inbox
from subagents.protocol import (
    ErrorCode,
    MessageId,
    MessageSource,
    SessionId,
    SubagentError,
    check_name,
    check_source,
    check_value,
)

from ._types import ContinuableStartSpec, SubagentStartRequest

__all__ = ["bad", "check_signal", "check_start_request", "check_start_spec", "check_tool_filter"]


def bad(message: str) -> SubagentError:
    """An ``INVALID_ARGUMENT`` error."""
    return SubagentError(message, code=ErrorCode.INVALID_ARGUMENT)


def check_signal(signal: Any, what: str = "signal") -> None:
    """``INVALID_ARGUMENT`` unless ``signal`` is None or an ``AbortSignal``."""
    if signal is not None and not isinstance(signal, AbortSignal):
        raise bad(f"{what} must be an AbortSignal")


def check_tool_filter(tool_filter: Any) -> None:
    if tool_filter is None:
        return
    if isinstance(tool_filter, (str, bytes)) or not isinstance(
        tool_filter, (Sequence, frozenset, set)
    ):
        raise bad("tool_filter must be a sequence of tool names")
    if not all(type(t) is str and t for t in tool_filter):
        raise bad("tool_filter must hold non-empty str names")


def _optional_strs(obj: Any, names: Sequence[str], prefix: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if value is not None:  # the usual case: nothing to check, no message to build
            check_name(value, f"{prefix}.{name}")


def check_start_request(request: Any) -> None:
    """A one-shot ``SubagentStartRequest`` (the parent's liveness is the caller's)."""
    if not isinstance(request, SubagentStartRequest):
        raise bad(f"start() takes a SubagentStartRequest, got {type(request).__name__}")
    if not isinstance(request.signal, AbortSignal):
        raise bad("request.signal is required (an AbortSignal)")
    if not isinstance(request.parent, Agent):
        raise bad("request.parent must be an Agent")
    _optional_strs(request, ("label", "model", "persona"), "request")
    if request.max_depth is not None and (
        type(request.max_depth) is not int or request.max_depth < 1
    ):
        raise bad("request.max_depth must be an int >= 1")
    check_tool_filter(request.tool_filter)
    if request.output_schema is not None:
        check_output_schema(request.output_schema)
    check_value(request.prompt)


def check_start_spec(spec: Any) -> None:
    """A ``ContinuableStartSpec``."""
    if not isinstance(spec, ContinuableStartSpec):
        raise bad(f"start_continuable takes a ContinuableStartSpec, got {type(spec).__name__}")
    if isinstance(spec.parent, str):  # a start by the parent's id
        SessionId(spec.parent)  # INVALID_ARGUMENT unless a session id
    elif not isinstance(spec.parent, Agent):
        raise bad("spec.parent must be an Agent or a session id")
    if type(spec.provider) is not str:
        raise bad("spec.provider must be a provider name")
    if type(spec.label) is not str or not spec.label.strip():
        raise SubagentError(
            "a continuable child needs a non-empty label", code=ErrorCode.DESCRIPTOR_INVALID
        )
    check_name(spec.label, "spec.label")
    check_signal(spec.signal, "spec.signal")
    _optional_strs(spec, ("model", "persona"), "spec")
    check_tool_filter(spec.tool_filter)
    check_max_inbox(spec.max_inbox, "spec.max_inbox")
    if spec.source is not None:
        if not isinstance(spec.source, MessageSource):
            raise bad("spec.source must be a MessageSource or None")
        check_source(spec.source)  # what the log holds, also where nothing is encoded yet
    if spec.message_id is not None:
        MessageId(spec.message_id)  # INVALID_ARGUMENT unless 32 lowercase hex digits
    check_value(spec.prompt)
