"""What the fake OpenAI server (:mod:`._testing_openai`) serves and checks: scripted
answers, the requests it received, and the wire details it reproduces."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from subagents.actors._agents import valid_tool_name

__all__ = [
    "USAGE",
    "Answer",
    "FakeCall",
    "FakeRequest",
    "event_bytes",
    "split_pair",
    "tool_ids_error",
    "utf8_cut",
]

#: The usage an answer reports unless it says otherwise.
USAGE: Mapping[str, int] = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}


@dataclass(frozen=True)
class FakeCall:
    """One tool call of a scripted answer; ``arguments`` a map, or raw (invalid) text."""

    name: str
    arguments: Mapping[str, Any] | str = field(default_factory=dict)
    id: str | None = None

    def text(self) -> str:
        """The call's arguments as the model sends them (JSON text)."""
        if isinstance(self.arguments, str):
            return self.arguments
        return json.dumps(self.arguments, ensure_ascii=False)


@dataclass(frozen=True)
class Answer:
    """One scripted response (see the module docstring for each field's effect)."""

    content: str | None = None
    tool_calls: Sequence[FakeCall] = ()
    usage: Mapping[str, int] | None = None
    status: int = 200
    error: str | None = None
    headers: Mapping[str, str] | None = None
    stream_error_after: int | None = None
    omit_ids: bool = False
    split_utf8: bool = False
    stall: bool = False
    raw: bytes | None = None
    cut_stream: bool = False
    trickle: bool = False

    @property
    def finish_reason(self) -> str:
        """``tool_calls`` when the answer calls tools, else ``stop``."""
        return "tool_calls" if self.tool_calls else "stop"


@dataclass(frozen=True)
class FakeRequest:
    """A request the fake received: its path, headers and decoded JSON body."""

    path: str
    headers: Mapping[str, str]
    body: Any

    @property
    def messages(self) -> list[Any]:
        """The request's ``messages``."""
        return list(self.body.get("messages", ())) if isinstance(self.body, dict) else []

    @property
    def tool_names(self) -> list[str]:
        """The function names in the request's ``tools``."""
        tools = self.body.get("tools", ()) if isinstance(self.body, dict) else ()
        return [t["function"]["name"] for t in tools]


def _bad_call_name(i: int, msg: Any) -> str | None:
    """The real API's refusal of an assistant message's call to a name it does not take."""
    for j, call in enumerate(msg.get("tool_calls") or ()):
        name = (call.get("function") or {}).get("name")
        if not valid_tool_name(name):  # what the real API takes, ``messages`` included
            return (
                f"Invalid 'messages[{i}].tool_calls[{j}].function.name': string does not"
                " match pattern. Expected a string that matches the pattern '^[a-zA-Z0-9_-]+$'."
            )
    return None


def tool_ids_error(messages: Any) -> str | None:
    """The real API's refusal of ``tool`` messages that answer no open call, and of
    an assistant message's call to a name it does not take."""
    if not isinstance(messages, list) or not messages:
        return "'messages' must be a non-empty array"
    open_ids: set[str] | None = None
    for i, msg in enumerate(messages):
        role = msg.get("role") if isinstance(msg, dict) else None
        if role == "assistant" and (bad := _bad_call_name(i, msg)) is not None:
            return bad
        if role == "tool":
            call_id = msg.get("tool_call_id")
            if open_ids is None or call_id not in open_ids:
                return (
                    "Invalid parameter: messages with role 'tool' must be a response to a"
                    f" preceeding message with 'tool_calls' (tool_call_id {call_id!r})."
                )
            open_ids.discard(call_id)
            continue
        if open_ids:
            return (
                "An assistant message with 'tool_calls' must be followed by tool messages"
                " responding to each 'tool_call_id'. The following tool_call_ids did not"
                f" have response messages: {', '.join(sorted(open_ids))}"
            )
        calls = msg.get("tool_calls") if role == "assistant" else None
        open_ids = {c.get("id") for c in calls} if calls else None
    if open_ids:
        return f"tool_call_ids without response messages: {', '.join(sorted(open_ids))}"
    return None


def split_pair(text: str) -> list[str]:
    """``text`` in pieces of about a third, one cut between a surrogate pair's halves
    (as ``\\ud83d`` / ``\\ude00`` escapes) where it holds an astral character."""
    units = text.encode("utf-16-le", "surrogatepass")
    n = len(units) // 2
    cuts = sorted({max(1, n // 3), max(1, 2 * n // 3)})
    for i in range(n):
        if 0xD800 <= int.from_bytes(units[2 * i : 2 * i + 2], "little") < 0xDC00:
            cuts = sorted({*cuts, i + 1})
            break
    pieces, last = [], 0
    for cut in [*cuts, n]:
        if cut > last:
            pieces.append(units[2 * last : 2 * cut].decode("utf-16-le", "surrogatepass"))
            last = cut
    return pieces or [text]


def utf8_cut(data: bytes) -> int | None:
    """An offset inside the first multi-byte UTF-8 character of ``data``, if any."""
    for i, b in enumerate(data):
        if b >= 0xC0:
            return i + 1
    return None


def event_bytes(event: Any) -> bytes:
    """One ``data:`` event as UTF-8 (escapes only where a lone surrogate needs them)."""
    try:
        return f"data: {json.dumps(event, ensure_ascii=False)}\n\n".encode()
    except UnicodeEncodeError:
        return f"data: {json.dumps(event)}\n\n".encode()
