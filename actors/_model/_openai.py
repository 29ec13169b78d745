"""``openai_chat``: a behaviour that thinks through an OpenAI-compatible chat API.

Theory of operation
-------------------
Each turn builds the conversation -- the agent's persona as the system prompt
(else the ``system`` given to :func:`openai_chat`), the session's history as
messages (its messages and reports as ``user`` messages, each completed turn's
output as an ``assistant`` message), the quiet reports delivered since, and the
turn's message -- and runs the tool-call loop: ask the model; when it answers
with tool calls, run them through the :class:`~._dispatch.ToolDispatcher`
(up to eight at once when it asked for several), answer each with a ``tool``
message carrying its ``tool_call_id`` (a result that cannot be rendered as text
is an ``INTERNAL`` error result, as a raising tool's: :func:`~._history.tool_text`),
and ask again; when it answers with text, that text is the turn's output. An
answer that is a refusal (``refusal``, streamed or not) or that the content filter
stopped (``finish_reason: "content_filter"``) fails the turn with ``MODEL_ERROR``
naming it; so does, in a run with an ``output_schema``, a final answer cut off at
the token limit (``finish_reason: "length"``), rather than a schema mismatch on
half an answer.
Every call's token ``usage`` is added to the turn (``turn/end`` records the
sum). A turn that asks for tools in its last allowed round (``max_tool_rounds``)
fails with ``MODEL_ERROR`` before those tools run or a steered message is taken
(that message runs as a turn of its own).

A run with an ``output_schema`` sends it as the request's ``response_format``
(a JSON-schema format, when the schema is an object's) and the answer's JSON
text becomes the output the turn checks against it; a schema that takes the
text as it is (``{"type": "string"}``) gets the text.

The HTTP side (:mod:`._http`) streams by default, retries as the ``openai``
package does, times out, and is aborted by the turn's signal. A turn's tool
calls are not replayed in later turns' history, only its output: the model
finds its children again with ``list_agents``. A turn a crash cut short runs
again; the calls its model makes again at the same place -- delegate, start a
child, send it a message, report -- take effect once (:mod:`._calls`).
"""

from __future__ import annotations

import contextvars
import functools
import json
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

from subagents.actors._agents import AgentOptions, SessionService, Turn, validate_output
from subagents.protocol import ErrorCode, ExpectedEvent, SubagentError

from ._delegated import kept_result
from ._dispatch import ToolDispatcher
from ._history import history_messages, text, tool_text
from ._wire import Completion, ModelError, ToolCall, check_answer, encode_body

__all__ = [
    "DEFAULT_BASE_URL",
    "PARALLEL_TOOL_CALLS",
    "REDELIVERED_NOTE",
    "OpenAIChat",
    "openai_chat",
]

#: The longest ``timeout`` (seconds, about 11 days): beyond it the socket layer's
#: clocks overflow, and every request would fail.
MAX_TIMEOUT: Final = 1e6

#: Tool calls of one answer that run at once; the rest wait for one to end.
PARALLEL_TOOL_CALLS: Final = 8

#: Where requests go when neither ``base_url`` nor ``OPENAI_BASE_URL`` says otherwise.
DEFAULT_BASE_URL: Final = "https://api.openai.com/v1"


#: What a model is told of a turn that runs again after the runtime stopped in it.
REDELIVERED_NOTE = (
    "This turn runs again: the runtime stopped while it ran. Tool calls made in it"
    " before may have taken effect. The same call with the same arguments takes"
    " effect once; check what exists (list_agents) before starting anything anew."
)


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
        max_history: int | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.model = model
        self.dispatcher = dispatcher
        self.system = system
        self.stream = stream
        self.max_tool_rounds = max_tool_rounds
        self.max_history = max_history
        self.parameters = dict(parameters)
        self.calls = 0

    def messages(self, turn: Turn) -> list[dict[str, Any]]:
        """The messages of the turn's first request: the system prompt first, if any,
        then the history (of earlier turns, the last ``max_history`` messages). A
        turn that runs again after a crash is told so at the end of that one system
        message (a system message anywhere but first is refused by the chat
        templates of many OpenAI-compatible servers)."""
        system = turn.persona if turn.persona is not None else self.system
        if turn.redelivered:
            system = f"{system}\n\n{REDELIVERED_NOTE}" if system else REDELIVERED_NOTE
        head = [{"role": "system", "content": system}] if system else []
        conversation = history_messages(turn)
        if self.max_history is not None:
            # The turn's own messages (its context, its message) always go.
            earlier = len(conversation) - len(turn.context) - len(turn.messages)
            cut = max(0, earlier - self.max_history)
            while cut < earlier and conversation[cut]["role"] != "user":
                cut += 1  # from a user message on: many chat templates insist
            conversation = conversation[cut:]
        return head + conversation

    def promised_message(self, sessions: SessionService, promise: ExpectedEvent) -> Any:
        """What a background run whose result never came was promised to deliver, read
        from the store (``None``: the stand-in stays; see :func:`._delegated.kept_result`)."""
        return kept_result(sessions, promise)

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
        schema = turn.output_schema
        if schema is not None and schema.get("type") == "object":
            body.setdefault(
                "response_format",
                {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}},
            )
        signal = turn.signal
        with ChatSession(self.endpoint, signal, turn.agent.host.backend) as session:
            rounds = 0
            while True:
                answer = session.complete(body)
                self.calls += 1
                if answer.usage is not None:
                    turn.add_usage(answer.usage)
                # A refusal, a filtered answer or a structured one cut off fails the turn.
                check_answer(answer, structured=schema is not None)
                if not answer.tool_calls:
                    content = answer.content if answer.content is not None else ""
                    return content if schema is None else _structured(schema, content)
                if rounds == self.max_tool_rounds:
                    # Before its tools run or a steered message is taken: those
                    # stay accepted and run as the next turn.
                    raise ModelError(
                        f"the model asked for tools more than {self.max_tool_rounds}"
                        " rounds in one turn"
                    )
                messages.append(answer.message())
                messages.extend(self._run_calls(turn, answer, rounds))
                # A safe point: messages steered into the turn join the conversation.
                for steered in turn.steering():
                    messages.append({"role": "user", "content": text(steered.content)})
                rounds += 1

    def _run_calls(self, turn: Turn, answer: Completion, round_no: int) -> list[dict[str, Any]]:
        """Run the answer's tool calls (at once when there are several); their messages.
        Each is placed by ``round_no`` and its position (its message id, when it sends one)."""
        calls = answer.tool_calls
        results: list[Any] = [None] * len(calls)
        dispatcher = self.dispatcher

        def run(i: int, call: ToolCall) -> None:
            if dispatcher is None:
                results[i] = {"error": {"code": "INVALID_ARGUMENT", "message": "no tools"}}
            else:
                place = f"{round_no}.{i}"
                results[i] = dispatcher.dispatch(turn, call.name, call.arguments, place=place)

        if len(calls) == 1:
            run(0, calls[0])
        else:
            _parallel(turn, [functools.partial(run, i, c) for i, c in enumerate(calls)])
        turn.signal.raise_if_aborted()
        # A result that cannot be rendered is an error result too, as a raising tool's.
        return [
            {"role": "tool", "tool_call_id": call.id, "content": tool_text(result, call.name)}
            for call, result in zip(calls, results)
        ]


def _structured(schema: Mapping[str, Any], content: str) -> Any:
    """The answer as the output schema wants it: the text itself when the schema
    takes it, else the JSON value the text holds (the turn then checks it)."""
    if validate_output(schema, content)[1] is None:
        return content
    try:
        return json.loads(content)
    except (ValueError, RecursionError):
        return content  # not JSON: the schema's check says what is wrong


def _parallel(turn: Turn, jobs: list[Callable[[], None]]) -> None:
    """Run ``jobs`` in at most :data:`PARALLEL_TOOL_CALLS` tasks of the agent's
    backend (the turn's own thread or greenlet is one) and join them all; re-raise
    the first failure (a cancelled turn's ``CANCELLED``) once every one has ended.
    Once the turn is cancelled no further job starts (the ones running end as
    their tools see the cancel)."""
    backend = turn.agent.host.backend
    errors: list[BaseException] = []
    queue = iter(jobs)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                job = None if turn.signal.aborted else next(queue, None)
            if job is None:
                return
            try:
                job()
            except BaseException as exc:
                errors.append(exc)

    count = min(len(jobs), PARALLEL_TOOL_CALLS)
    # Each task in a copy of the turn's context: its span stays current there (what
    # a call starts or follows up continues the turn's trace, as in the turn's own).
    tasks = [
        backend.spawn(contextvars.copy_context().run, worker, name="tool-call")
        for _ in range(count - 1)
    ]
    worker()
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
    max_history: int | None = None,
    headers: Mapping[str, str] | None = None,
    **parameters: Any,
) -> Callable[[AgentOptions], OpenAIChat]:
    """A model factory for ``runtime.models.register``: agents that think through an
    OpenAI-compatible ``/chat/completions`` API.

    ``base_url``, ``api_key``, ``organization`` and ``project`` default to
    ``OPENAI_BASE_URL`` (else :data:`DEFAULT_BASE_URL`), ``OPENAI_API_KEY``,
    ``OPENAI_ORG_ID`` and ``OPENAI_PROJECT_ID``, read now, as the ``openai``
    package reads them. ``tools``: ``True`` offers the subagent tools (a
    :class:`ToolDispatcher` of its own; ``report`` to an agent with a parent),
    ``False``/``None`` none, or a dispatcher. ``system`` is the system prompt
    of agents without a persona. ``timeout`` bounds each request, a streamed
    answer's whole length included (connecting: 5 s at most), ``max_retries``
    the retries of a refused one. ``max_history`` bounds the messages of earlier
    turns each request carries (the session's messages and reports, the turns'
    answers): the last that many, from a user message on (``None``: all -- a
    long-lived continuable child's history grows with every turn, and would in
    time overflow the model's context). Other keyword ``parameters`` (``temperature``,
    ``max_completion_tokens``, ...) go into every request body. Needs the
    ``openai`` extra (httpx).

    Example::

        runtime.models.register("planner", openai_chat(model="gpt-4o-mini"))

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` for no API key (none given, none in
            the environment), a bad model name, URL or limit, a URL, key, account
            id or ``system`` that is not a str (or ``None``), headers that are
            not str to str, a key, account id or header HTTP cannot send (not
            printable ASCII, a CR/LF/NUL, a name that is not a token), a
            ``stream`` that is not a bool, a ``max_history`` that is not an int
            >= 0 or ``None``, ``parameters`` JSON cannot carry
            (NaN included), or a parameter each request sets itself
            (``messages``, ``stream_options``).
    """
    if type(model) is not str or not model:
        raise SubagentError("model is a non-empty str", code=ErrorCode.INVALID_ARGUMENT)
    for name, value in (
        ("base_url", base_url),
        ("api_key", api_key),
        ("organization", organization),
        ("project", project),
        ("system", system),
    ):
        if value is not None and not isinstance(value, str):
            # The type only: a key's value is never shown.
            raise SubagentError(
                f"{name} is a str or None, got {type(value).__name__}",
                code=ErrorCode.INVALID_ARGUMENT,
            )
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
    _check_settings(timeout, max_retries, max_tool_rounds, max_history, headers, parameters)
    if type(stream) is not bool:
        raise SubagentError("stream is True or False", code=ErrorCode.INVALID_ARGUMENT)
    try:
        from ._http import Endpoint, check_endpoint
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
    check_endpoint(endpoint)
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
            max_history=max_history,
        )

    return factory


def _check_settings(
    timeout: Any,
    max_retries: Any,
    max_tool_rounds: Any,
    max_history: Any,
    headers: Mapping[str, str] | None,
    parameters: Mapping[str, Any],
) -> None:
    """Refuse now what would fail every turn later (``INVALID_ARGUMENT``)."""

    def refuse(message: str) -> SubagentError:
        return SubagentError(message, code=ErrorCode.INVALID_ARGUMENT)

    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout <= MAX_TIMEOUT  # NaN fails it too
    ):
        raise refuse(f"timeout is a number of seconds > 0 and <= {MAX_TIMEOUT:g}")
    counts = [("max_retries", max_retries), ("max_tool_rounds", max_tool_rounds)]
    if max_history is not None:
        counts.append(("max_history", max_history))
    for what, value in counts:
        if type(value) is not int or value < 0:
            raise refuse(f"{what} is an int >= 0")
    if headers is not None and (
        not isinstance(headers, Mapping)
        or not all(type(k) is str and type(v) is str for k, v in headers.items())
    ):
        raise refuse("headers maps str names to str values")
    # Each turn's request sets these itself: a parameter of that name would be dropped.
    owned = sorted(set(parameters) & {"messages", "stream_options"})
    if owned:
        raise refuse(f"{owned[0]} is not a parameter: each turn's request sets it")
    encode_body(parameters)  # what every request body will hold, refused now
