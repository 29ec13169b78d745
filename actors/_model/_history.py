"""A turn's conversation as chat messages: the session's history, then the turn's own.

The session's messages and reports become ``user`` messages (a child's or a
host's marked with where it came from), each completed turn's output an
``assistant`` message, and the quiet reports delivered since, then the turn's
message, come last.

A message runs again after a turn that did not finish it: a crash cut the turn
short (the resume logs it ended so, and under strict durability the message,
still accepted, runs again; a message steered into that turn runs after it as a
turn of its own), or a host giving a placed child back cancelled it keeping
what it accepted. The model sees each message once, where it runs last: under
strict durability the messages of a cut-short turn are left out, and of a
message logged more than once only its last place is kept. (Under relaxed
durability nothing runs again: a cut-short turn's messages stay, unanswered.)
"""

from __future__ import annotations

import json
import logging
from typing import Any

from subagents.actors._agents import CUT_SHORT, KEPT, Turn
from subagents.protocol import (
    ErrorCode,
    Event,
    MessageEvent,
    ReportEvent,
    TurnEnd,
    TurnStart,
    error_text,
)

__all__ = ["history_messages", "text", "tool_text"]

logger = logging.getLogger("subagents")


def text(content: Any) -> str:
    """A message's content as the text a model reads (JSON for anything but a str)."""
    if isinstance(content, str):
        return content
    try:
        return json.dumps(content, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):
        return str(content)


def tool_text(result: Any, name: str | None = None) -> str:
    """A tool's result as the text of its ``tool`` message (:func:`text`). A result
    that cannot be rendered -- its ``__str__`` or encoding raises, it is nested
    deeper than the encoder recurses -- is an ``INTERNAL`` error result instead,
    ``{"error": {"code", "message"}}`` as a tool that raised gets: the model reads
    it and the turn goes on."""
    try:
        return text(result)
    except Exception as exc:  # RecursionError included: the stack has unwound here
        logger.warning("the result of tool %r cannot be rendered: %s", name, type(exc).__name__)
        message = error_text(exc, "the tool's result cannot be rendered as text: ")[:2000]
        error = {"error": {"code": ErrorCode.INTERNAL, "message": message}}
        return json.dumps(error, ensure_ascii=False)


def _from(source: Any, kind: str) -> str:
    if source is None or source.session_id is None:
        return ""
    return f"[{kind} from {source.kind} {source.session_id}] "


#: The ends of turns whose messages run again (a crash, a closing runtime).
_RUN_AGAIN = (CUT_SHORT, KEPT)


def _settled_events(turn: Turn) -> list[Event]:
    """The history without the messages of cut-short turns, each message once (last)."""
    kept: list[Event] = []
    open_from: int | None = None  # where the open turn's events start in ``kept``
    runs_again = bool(getattr(turn.agent.host.sessions, "strict", False))
    for event in turn.history:
        if isinstance(event, TurnStart):
            open_from = len(kept)
        elif isinstance(event, TurnEnd):
            if runs_again and open_from is not None and event.error in _RUN_AGAIN:
                kept[open_from:] = [e for e in kept[open_from:] if not _is_message(e)]
            open_from = None
        kept.append(event)
    later = {m.message_id for m in (*turn.messages, *turn.context)}
    settled: list[Event] = []
    for event in reversed(kept):
        if _is_message(event):
            mid = event.message_id  # type: ignore[attr-defined]
            if mid in later:
                continue
            later.add(mid)
        settled.append(event)
    settled.reverse()
    return settled


def _is_message(event: Event) -> bool:
    return isinstance(event, (MessageEvent, ReportEvent))


def history_messages(turn: Turn) -> list[dict[str, Any]]:
    """The turn's conversation without the system prompt: history, context, message."""
    messages: list[dict[str, Any]] = []
    for event in _settled_events(turn):
        if isinstance(event, MessageEvent):
            source = event.source
            marked = source is not None and source.kind in ("child", "host")
            prefix = _from(source, "message") if marked else ""
            messages.append({"role": "user", "content": prefix + text(event.content)})
        elif isinstance(event, ReportEvent):
            prefix = _from(event.source, "report") or "[report] "
            messages.append({"role": "user", "content": prefix + text(event.content)})
        elif (
            isinstance(event, TurnEnd)
            and event.stop_reason == "completed"
            and event.output is not None
        ):
            messages.append({"role": "assistant", "content": text(event.output)})
    for quiet in turn.context:
        prefix = _from(quiet.source, "report") or "[report] "
        messages.append({"role": "user", "content": prefix + text(quiet.content)})
    for message in turn.messages:
        kind = "report" if message.kind == "report" else "message"
        src = message.source
        prefix = _from(src, kind) if kind == "report" or (src and src.kind == "child") else ""
        messages.append({"role": "user", "content": prefix + text(message.content)})
    return messages
