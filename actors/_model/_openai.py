"""``openai_chat``: a behaviour that thinks through an OpenAI-compatible chat API.

Theory of operation
-------------------
Each turn builds the conversation -- the agent's persona as the system prompt
(else the ``system`` given to :func:`openai_chat`), the session's history as
messages (its messages and reports as ``user`` messages, each completed turn's
output as an ``assistant`` message), the quiet reports delivered since, and the
turn's message -- and runs the tool-call loop: ask the model; when it answers
with tool calls, run them through the :class:`~._dispatch.ToolDispatcher`
(several at once when it asked for several), answer each with a ``tool`` message
carrying its ``tool_call_id``, and ask again; when it answers with text, that
text is the turn's output. Every call's token ``usage`` is added to the turn
(``turn/end`` records the sum).

The HTTP side (:mod:`._http`) streams by default, retries as the ``openai``
package does, times out, and is aborted by the turn's signal. A turn's tool
calls are not replayed in later turns' history, only its output: the model
finds its children again with ``list_agents``.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Mapping
from typing import Any, Final

from subagents.actors._agents import AgentOptions, Turn
from subagents.protocol import (
    ErrorCode,
    MessageEvent,
    ReportEvent,
    SubagentError,
    TurnEnd,
)

from ._dispatch import ToolDispatcher
from ._wire import Completion, ToolCall

__all__ = ["DEFAULT_BASE_URL", "OpenAIChat", "openai_chat"]

#: Where requests go when neither ``base_url`` nor ``OPENAI_BASE_URL`` says otherwise.
DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    try:
        return json.dumps(content, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(content)


def _from(source: Any, kind: str) -> str:
    if source is None or source.session_id is None:
        return ""
    return f"[{kind} from {source.kind} {source.session_id}] "


def history_messages(turn: Turn) -> list[dict[str, Any]]:
    """The turn's conversation without the system prompt: history, context, message."""
    messages: list[dict[str, Any]] = []
    for event in turn.history:
        if isinstance(event, MessageEvent):
            prefix = (
                _from(event.source, "message")
                if event.source
                and event.source.kind
                in (
                    "child",
                    "host",
                )
                else ""
            )
            messages.append({"role": "user", "content": prefix + _text(event.content)})
        elif isinstance(event, ReportEvent):
            prefix = _from(event.source, "report") or "[report] "
            messages.append({"role": "user", "content": prefix + _text(event.content)})
        elif (
            isinstance(event, TurnEnd)
            and event.stop_reason == "completed"
            and event.output is not None
        ):
            messages.append({"role": "assistant", "content": _text(event.output)})
    for quiet in turn.context:
        prefix = _from(quiet.source, "report") or "[report] "
        messages.append({"role": "user", "content": prefix + _text(quiet.content)})
    for message in turn.messages:
        kind = "report" if message.kind == "report" else "message"
        src = message.source
        prefix = _from(src, kind) if kind == "report" or (src and src.kind == "child") else ""
        messages.append({"role": "user", "content": prefix + _text(message.content)})
    return messages


class OpenAIChat:
    """The behaviour :func:`openai_chat` builds for one agent (see the module docstring).

    Attributes:
        calls: model requests answered so far (retries not counted).
    """

    def __init__(
        self,
        endpoint: Any,
        model: str,
        *,
        dispatcher: ToolDispatcher | None,
        system: str | None,
        stream: bool,
        max_tool_rounds: int,
        parameters: Mapping[str, Any],
    ) -> None:
        self.endpoint = endpoint
        self.model = model
        self.dispatcher = dispatcher
        self.system = system
        self.stream = stream
        self.max_tool_rounds = max_tool_rounds
        self.parameters = dict(parameters)
        self.calls = 0

    def messages(self, turn: Turn) -> list[dict[str, Any]]:
        """The messages of the turn's first request (system prompt first, if any)."""
        system = turn.persona if turn.persona is not None else self.system
        head = [{"role": "system", "content": system}] if system else []
        return head + history_messages(turn)

    def on_turn(self, turn: Turn) -> Any:
        """Run the tool-call loop for one turn; the model's final text is the output."""
        from ._http import ChatSession  # the optional dependency, on first use

        dispatcher = self.dispatcher
        if dispatcher is not None:
            dispatcher.dispose_settled(turn)
        tools = dispatcher.definitions(turn) if dispatcher is not None else []
        messages = self.messages(turn)
        body: dict[str, Any] = {**self.parameters, "model": self.model, "messages": messages}
        if tools:
            body["tools"] = tools
        if self.stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        signal = turn.signal
        run_blocking = turn.agent.host.backend.run_blocking
        with ChatSession(self.endpoint, signal, run_blocking) as session:
            for _ in range(self.max_tool_rounds + 1):
                answer = session.complete(body)
                self.calls += 1
                if answer.usage is not None:
                    turn.add_usage(answer.usage)
                if not answer.tool_calls:
                    return answer.content if answer.content is not None else ""
                messages.append(answer.message())
                messages.extend(self._run_calls(turn, answer))
                # A safe point: messages steered into the turn join the conversation.
                for steered in turn.steering():
                    messages.append({"role": "user", "content": _text(steered.content)})
        raise SubagentError(
            f"the model asked for tools more than {self.max_tool_rounds} rounds in one turn",
            code=ErrorCode.INVALID_ARGUMENT,
        )

    def _run_calls(self, turn: Turn, answer: Completion) -> list[dict[str, Any]]:
        """Run the answer's tool calls (at once when there are several); their messages."""
        calls = answer.tool_calls
        results: list[Any] = [None] * len(calls)
        dispatcher = self.dispatcher

        def run(i: int, call: ToolCall) -> None:
            if dispatcher is None:
                results[i] = {"error": {"code": "INVALID_ARGUMENT", "message": "no tools"}}
            else:
                results[i] = dispatcher.dispatch(turn, call.name, call.arguments)

        if len(calls) == 1:
            run(0, calls[0])
        else:
            _parallel(turn, [functools.partial(run, i, c) for i, c in enumerate(calls)])
        turn.signal.raise_if_aborted()
        return [
            {"role": "tool", "tool_call_id": call.id, "content": _text(result)}
            for call, result in zip(calls, results)
        ]


def _parallel(turn: Turn, jobs: list[Callable[[], None]]) -> None:
    """Run ``jobs`` as tasks of the agent's backend and join them all; re-raise the
    first failure (a cancelled turn's ``CANCELLED``) once every one has ended."""
    backend = turn.agent.host.backend
    errors: list[BaseException] = []

    def guarded(job: Callable[[], None]) -> Callable[[], None]:
        def body() -> None:
            try:
                job()
            except BaseException as exc:
                errors.append(exc)

        return body

    tasks = [backend.spawn(guarded(job), name="tool-call") for job in jobs[1:]]
    guarded(jobs[0])()
    for task in tasks:
        task.join(None)
    if errors:
        raise errors[0]


def openai_chat(
    model: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    organization: str | None = None,
    project: str | None = None,
    tools: ToolDispatcher | bool | None = True,
    system: str | None = None,
    stream: bool = True,
    timeout: float = 600.0,
    max_retries: int = 2,
    max_tool_rounds: int = 32,
    headers: Mapping[str, str] | None = None,
    **parameters: Any,
) -> Callable[[AgentOptions], OpenAIChat]:
    """A model factory for ``runtime.models.register``: agents that think through an
    OpenAI-compatible ``/chat/completions`` API.

    ``base_url``, ``api_key``, ``organization`` and ``project`` default to
    ``OPENAI_BASE_URL`` (else :data:`DEFAULT_BASE_URL`), ``OPENAI_API_KEY``,
    ``OPENAI_ORG_ID`` and ``OPENAI_PROJECT_ID``, read now, as the ``openai``
    package reads them. ``tools``: ``True`` offers the six subagent tools (a
    :class:`ToolDispatcher` of its own), ``False``/``None`` none, or a dispatcher.
    ``system`` is the system prompt of agents without a persona. ``timeout``
    bounds each request (connecting: 5 s at most), ``max_retries`` the retries
    of a refused one. Other keyword ``parameters`` (``temperature``,
    ``max_completion_tokens``, ...) go into every request body. Needs the
    ``openai`` extra (httpx).

    Example::

        runtime.models.register("planner", openai_chat(model="gpt-4o-mini"))

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` for no API key (none given, none in
            the environment), a bad model name, URL or limit.
    """
    if type(model) is not str or not model:
        raise SubagentError("model is a non-empty str", code=ErrorCode.INVALID_ARGUMENT)
    base = base_url if base_url is not None else os.environ.get("OPENAI_BASE_URL") or None
    key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
    if not key:
        raise SubagentError(
            "no API key: pass api_key= or set OPENAI_API_KEY (as the openai package reads it)",
            code=ErrorCode.INVALID_ARGUMENT,
        )
    base = base or DEFAULT_BASE_URL
    if not base.startswith(("http://", "https://")):
        raise SubagentError(
            f"base_url must be an http(s) URL, got {base[:100]!r}", code=ErrorCode.INVALID_ARGUMENT
        )
    for what, value, low in (("timeout", timeout, 0.0), ("max_retries", max_retries, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
            raise SubagentError(
                f"{what} must be a number >= {low}", code=ErrorCode.INVALID_ARGUMENT
            )
    if type(max_tool_rounds) is not int or max_tool_rounds < 0:
        raise SubagentError("max_tool_rounds is an int >= 0", code=ErrorCode.INVALID_ARGUMENT)
    try:
        from ._http import Endpoint
    except ImportError as exc:  # pragma: no cover - the extra is not installed
        raise SubagentError(
            "openai_chat needs httpx: pip install 'subagents[openai]'",
            code=ErrorCode.INVALID_ARGUMENT,
        ) from exc
    endpoint = Endpoint(
        base_url=base,
        api_key=key,
        organization=organization or os.environ.get("OPENAI_ORG_ID"),
        project=project or os.environ.get("OPENAI_PROJECT_ID"),
        timeout=float(timeout),
        connect_timeout=min(5.0, float(timeout)),
        max_retries=int(max_retries),
        headers=dict(headers) if headers else None,
    )
    shared = tools if isinstance(tools, ToolDispatcher) else None
    if tools is not True and tools is not False and tools is not None and shared is None:
        raise SubagentError(
            "tools is True, False, None or a ToolDispatcher", code=ErrorCode.INVALID_ARGUMENT
        )

    def factory(_options: AgentOptions) -> OpenAIChat:
        dispatcher = shared if shared is not None else (ToolDispatcher() if tools else None)
        return OpenAIChat(
            endpoint,
            model,
            dispatcher=dispatcher,
            system=system,
            stream=stream,
            max_tool_rounds=max_tool_rounds,
            parameters=parameters,
        )

    return factory
