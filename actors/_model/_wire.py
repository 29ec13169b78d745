"""The chat-completions wire format, sans I/O: bytes and maps in, a completion out.

* :class:`SSEDecoder` -- server-sent events from a byte stream split anywhere
  (inside a line, a ``\\r\\n`` pair, or a UTF-8 character);
* :class:`Completion` / :class:`ToolCall` -- one assistant answer, assembled
  from a whole ``chat.completion`` (:func:`completion_from_response`) or from
  ``chat.completion.chunk`` deltas (:class:`ChunkAccumulator`: tool calls keyed
  by ``index``, ``id`` and ``name`` from their first fragment, ``arguments``
  concatenated; a fragment with another ``id``, or a ``name`` when the call has
  one, begins a new call, as servers sending parallel calls under one ``index``
  or none mark them).

How long to wait before retrying a refused request is :mod:`._retry`'s.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from subagents.actors._agents import valid_tool_name
from subagents.protocol import ErrorCode, SubagentError

__all__ = [
    "MODEL_ERROR",
    "UNTAKEN_NAME",
    "ChunkAccumulator",
    "Completion",
    "ModelError",
    "SSEDecoder",
    "ToolCall",
    "check_answer",
    "completion_from_response",
    "encode_body",
    "error_from_body",
]

#: The code of a :class:`ModelError`.
MODEL_ERROR: Final = ErrorCode.MODEL_ERROR

#: The name a call to a name the API does not take goes back under (:meth:`Completion.message`).
UNTAKEN_NAME: Final = "invalid_tool_name"


class ModelError(SubagentError):
    """The model's API refused a request or broke off an answer.

    ``status`` is the HTTP status (``None`` for an error inside a stream or an
    answer that cannot be read); ``body`` the ``error`` object the API sent, if any.
    """

    default_code = MODEL_ERROR

    def __init__(
        self, message: str, *, status: int | None = None, body: Any = None, code: str | None = None
    ) -> None:
        super().__init__(message, code=code, hint={"status": status})
        self.status = status
        self.body = body


def error_from_body(status: int | None, raw: Any, *, streamed: bool = True) -> ModelError:
    """A :class:`ModelError` from an ``{"error": {...}}`` body (or anything else):
    with a ``status``, a refusal; without, an error in the stream (``streamed``) or
    in a whole answer's body."""
    error = raw.get("error") if isinstance(raw, Mapping) else None
    if isinstance(error, Mapping):
        message = str(error.get("message") or error.get("type") or "error")
    elif isinstance(error, str):
        message = error
    else:
        message = "no error message"
    if status is not None:
        where = f"HTTP {status}"
    else:
        where = "in the stream" if streamed else "in its answer"
    return ModelError(
        f"the model API failed ({where}): {message}"[:1000], status=status, body=error
    )


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call of an assistant answer: its id, name and JSON arguments."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class Completion:
    """One assistant answer: text, tool calls, why it stopped, token usage, and the
    model's ``refusal`` (its text; ``None`` when it did not refuse)."""

    content: str | None
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str | None = None
    usage: Mapping[str, Any] | None = None
    refusal: str | None = None

    def message(self) -> dict[str, Any]:
        """The answer as the assistant message of the next request. A call to a name
        the API does not take (the model's ``functions.x``, a name left out) goes
        back named ``invalid_tool_name``: the API refuses the whole request otherwise
        (400), and the call's result already names what the model called."""
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {
                        "name": c.name if valid_tool_name(c.name) else UNTAKEN_NAME,
                        "arguments": c.arguments,
                    },
                }
                for c in self.tool_calls
            ]
        return msg


def check_answer(answer: Completion, *, structured: bool = False) -> None:
    """Raise when ``answer`` is no answer: the model refused, or the content filter
    stopped it (its text, if any, cut off) -- or, for a ``structured`` run, its final
    answer was cut off at the token limit (``finish_reason: "length"``): half a
    JSON value is no output (it may even parse, as ``12`` of ``123``). Text cut off
    in a run without a schema is still the output.

    Raises:
        ModelError: a refusal (its text in the message), ``content_filter``, or a
            structured answer cut off (``length``).
    """
    if answer.refusal:
        raise ModelError(f"the model refused: {answer.refusal}"[:1000])
    if answer.finish_reason == "content_filter":
        raise ModelError("the model's answer was stopped by the content filter")
    if structured and answer.finish_reason == "length" and not answer.tool_calls:
        raise ModelError(
            "the model's answer was cut off (finish_reason length: it reached its token"
            " limit) before it was complete; a structured output needs the whole answer"
        )


def _joined(text: str) -> str:
    """Pair surrogates a JSON escape split across two chunks left apart."""
    if text.isascii():
        return text
    try:
        return text.encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeDecodeError:
        return text


def _text(text: str) -> str:
    """A text of the answer as the log can keep it: surrogate pairs split between
    two chunks joined (:func:`_joined`), a half still alone replaced by U+FFFD."""
    if text.isascii():
        return text
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _arguments_text(value: Any) -> str:
    """A call's ``arguments`` as JSON text: some servers send the object itself."""
    if isinstance(value, (Mapping, list)):
        return json.dumps(value, ensure_ascii=False)
    return _joined(str(value)) if value is not None else ""


def _first_choice(raw: Any) -> Mapping[str, Any] | None:
    choices = raw.get("choices") if isinstance(raw, Mapping) else None
    if not isinstance(choices, list):
        return None
    for choice in choices:
        if isinstance(choice, Mapping) and choice.get("index", 0) == 0:
            return choice
    return None


def completion_from_response(raw: Any) -> Completion:
    """The answer of a non-streamed ``chat.completion`` body.

    Raises:
        ModelError: an ``error`` body, or no first choice with a message.
    """
    if isinstance(raw, Mapping) and raw.get("error") is not None:
        raise error_from_body(None, raw, streamed=False)
    choice = _first_choice(raw)
    message = choice.get("message") if choice is not None else None
    if not isinstance(message, Mapping):
        raise ModelError("the model's answer has no choices[0].message")
    calls = []
    for i, call in enumerate(_calls_of(message)):
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping):
            raise ModelError("a tool call of the model's answer has no function")
        calls.append(
            ToolCall(
                str(call.get("id") or f"call_{i}"),
                str(fn.get("name") or ""),
                _arguments_text(fn.get("arguments")),
            )
        )
    content = message.get("content")
    usage = raw.get("usage")
    refusal = message.get("refusal")
    return Completion(
        _text(content) if isinstance(content, str) else None,
        tuple(calls),
        choice.get("finish_reason") if choice is not None else None,
        usage if isinstance(usage, Mapping) else None,
        _text(refusal) if isinstance(refusal, str) and refusal else None,
    )


def _calls_of(message: Mapping[str, Any]) -> list[Any]:
    """A message's (or delta's) ``tool_calls``: absent, null, or a list."""
    calls = message.get("tool_calls")
    if calls is None:
        return []
    if not isinstance(calls, list):
        raise ModelError(f"the model's tool_calls is not a list: {type(calls).__name__}")
    return calls


@dataclass
class _Partial:
    id: str | None = None
    name: str = ""
    arguments: list[str] = field(default_factory=list)

    def starts_anew(self, call_id: str, name: str) -> bool:
        """Whether a fragment with this ``id`` and ``name`` begins the next call: an
        id other than this call's, or (under the same or no id) a name when this
        call has one -- servers that stream parallel calls under one ``index`` (or
        none) mark each new call so."""
        if call_id and self.id and call_id != self.id:
            return True
        if call_id and call_id == self.id:
            return False  # the call's head sent again
        return bool(name) and bool(self.name)


class ChunkAccumulator:
    """Assembles ``chat.completion.chunk`` deltas into one :class:`Completion`.

    ``chunks`` counts the chunks folded in, ``choices`` those that carried a first
    choice: a stream none of whose chunks did holds no answer (the usage-only last
    chunk of ``stream_options.include_usage`` has none, after those that did).
    """

    def __init__(self) -> None:
        self._content: list[str] = []
        self._refusal: list[str] = []
        self._calls: list[_Partial] = []  # in the order they began
        self._current: dict[int | None, _Partial] = {}  # the latest call of each index
        self._finish: str | None = None
        self._usage: Mapping[str, Any] | None = None
        self.chunks = 0
        self.choices = 0

    def add(self, chunk: Any) -> None:
        """Fold one decoded chunk in.

        Raises:
            ModelError: the chunk is an error event, or its ``choices`` is neither
                a list nor null.
        """
        if not isinstance(chunk, Mapping):
            raise ModelError("a stream chunk is not a JSON object")
        if chunk.get("error") is not None:
            raise error_from_body(None, chunk)
        choices = chunk.get("choices")
        if choices is not None and not isinstance(choices, list):
            raise ModelError(f"a stream chunk's choices is not a list: {type(choices).__name__}")
        self.chunks += 1
        usage = chunk.get("usage")
        if isinstance(usage, Mapping):
            self._usage = usage
        choice = _first_choice(chunk)
        if choice is None:
            return  # the usage chunk has no choices
        self.choices += 1
        delta = choice.get("delta")
        if isinstance(delta, Mapping):
            text = delta.get("content")
            if isinstance(text, str):
                self._content.append(text)
            refusal = delta.get("refusal")
            if isinstance(refusal, str):
                self._refusal.append(refusal)
            for call in _calls_of(delta):
                if isinstance(call, Mapping):
                    self._add_call(call)
        if choice.get("finish_reason"):
            self._finish = str(choice["finish_reason"])

    def _add_call(self, call: Mapping[str, Any]) -> None:
        """One tool-call fragment: the call of its ``index`` goes on unless the
        fragment begins another (:meth:`_Partial.starts_anew`); a fragment without
        an index continues the latest call."""
        index = call.get("index")
        key = index if type(index) is int else None
        fn = call.get("function")
        fn = fn if isinstance(fn, Mapping) else {}
        call_id = str(call.get("id") or "")
        name = str(fn.get("name") or "")
        part = self._current.get(key)
        if part is None and key is None and self._calls:
            part = self._calls[-1]
        if part is None or part.starts_anew(call_id, name):
            part = _Partial()
            self._calls.append(part)
        self._current[key] = part
        if call_id:
            part.id = call_id
        if name and not part.name:
            part.name = name
        arguments = fn.get("arguments")
        if isinstance(arguments, str):
            part.arguments.append(arguments)
        elif isinstance(arguments, (Mapping, list)):
            part.arguments.append(_arguments_text(arguments))

    def completion(self) -> Completion:
        """The answer so far (the whole answer once the stream ended)."""
        calls = tuple(
            ToolCall(p.id or f"call_{i}", p.name, _joined("".join(p.arguments)))
            for i, p in enumerate(self._calls)
        )
        content = _text("".join(self._content)) if self._content or not calls else None
        refusal = _text("".join(self._refusal)) or None
        return Completion(content, calls, self._finish, self._usage, refusal)


class SSEDecoder:
    """Server-sent events (``data:`` lines up to a blank line) from raw bytes.

    :meth:`feed` takes bytes split anywhere and returns the complete events'
    data, one string per event (``data`` lines joined with ``\\n``); comments,
    the ``id``/``retry`` fields and a byte-order mark opening the stream are
    skipped, an ``event:`` name other than ``message`` is kept as ``(name, data)``.
    """

    def __init__(self) -> None:
        self._utf8 = codecs.getincrementaldecoder("utf-8-sig")("replace")  # BOM: skipped
        self._line = ""
        self._cr = False  # the last character was a CR: a following LF ends nothing
        self._data: list[str] = []
        self._event = ""

    def feed(self, data: bytes) -> list[tuple[str, str]]:
        """The events completed by ``data``, as ``(event name, data)``."""
        text = self._utf8.decode(data)
        events: list[tuple[str, str]] = []
        start = 0
        for i, ch in enumerate(text):
            if ch == "\n" and self._cr:
                self._cr = False
                start = i + 1
                continue
            self._cr = False
            if ch == "\r" or ch == "\n":
                self._cr = ch == "\r"
                self._line_done(self._line + text[start:i], events)
                self._line = ""
                start = i + 1
        self._line += text[start:]
        return events

    def _line_done(self, line: str, events: list[tuple[str, str]]) -> None:
        if not line:
            if self._data:
                events.append((self._event or "message", "\n".join(self._data)))
            self._data = []
            self._event = ""
            return
        if line.startswith(":"):
            return
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value


def decode_json(text: str | bytes, what: str) -> Any:
    """``json.loads`` with a :class:`ModelError` for what is not JSON: bytes that
    are not UTF-8, bad syntax, or nesting deeper than the parser recurses."""
    try:
        if isinstance(text, bytes):
            text = text.decode("utf-8")
        return json.loads(text)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        raise ModelError(f"the model's {what} is not JSON: {text[:200]!r}") from None


def bad_request(message: str) -> SubagentError:
    """An ``INVALID_ARGUMENT`` for a configuration the client cannot use."""
    return SubagentError(message, code=ErrorCode.INVALID_ARGUMENT)


def encode_body(body: Mapping[str, Any]) -> bytes:
    """``body`` as UTF-8 JSON; a lone surrogate in a text becomes U+FFFD.

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` for a value JSON cannot carry (NaN, an
            object it does not know).
    """
    try:
        text = json.dumps(body, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise SubagentError(
            f"the request cannot be sent as JSON: {exc}"[:300], code=ErrorCode.INVALID_ARGUMENT
        ) from None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        # Pairs written as two code points join up again; a lone half is replaced.
        fixed = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
        return fixed.encode("utf-8")
