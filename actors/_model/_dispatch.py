"""The dispatcher: a model's tool call in, a JSON-able tool result out.

Theory of operation
-------------------
A :class:`ToolDispatcher` turns the six subagent tools (:data:`SUBAGENT_TOOLS`)
and any extra :class:`ModelTool` into calls on ``turn.subagents`` -- the
service bound with the turn's agent as parent -- so every authority rule of the
service applies unchanged: a follow-up reaches only the caller's own children, a
report only its parent, an interrupt only its descendants, a child's tools never
exceed the caller's.

What a model sees is decided by the agent's options: its ``tool_filter`` (when
set) names the only tools shown and callable, and ``report`` is shown only to an
agent that has a parent. The runtime's own tools (``runtime.tools``, and those a
setup contribution put in the agent's scope) are shown after them, as
:mod:`._runtime_tools` describes, unless ``runtime_tools=False``; a name the
dispatcher has itself wins. Arguments are parsed (a JSON string or a mapping) and
validated against the tool's JSON Schema. A refused call -- bad JSON, a schema
violation, an unknown or filtered tool, any ``SubagentError`` of the service --
comes back as ``{"error": {"code": ..., "message": ...}}``, a tool result the
model reads (so does a result that cannot be rendered as text, ``INTERNAL``: see
:func:`._history.tool_text`); only the turn's own cancellation propagates, ending
the turn. A ``delegate`` whose child did not complete says why the same way:
its result (or delivered result) carries ``error`` beside its stop reason
(:mod:`._delegated`).

Background delegation (``delegate`` with ``background=true``) returns the run's
id at once; when the run settles its result is delivered to the agent as a
follow-up (source ``child``, the run's id), which starts a later turn; the run
is disposed once its result was delivered (one settled but still delivering
holds on). Its result is delivered under an id derived from the call's message
id (see :mod:`._calls`) and the run's, so a replayed call whose earlier result
was delivered already delivers nothing new where the inbox remembers the id
(strict durability; see ``docs/durability.md``). The run is the process's, but
the promise of its result is logged in the turn (``Turn.expect``): when the
agent's activation ends before the result came -- a crash, the runtime closing,
a disposal -- its next activation delivers, under that id, a ``delegate_result``
saying the run stopped (``CANCELLED``; :func:`._delegated.lost_result`), once. A
continuable child stays resident while it has runs not yet disposed
(``hold_residency``): it does not settle between the turn that started a run and
the turn its result starts. A cancel without ``keep_inbox`` -- dispose, a drain,
the runtime closing, ``cancel(keep_inbox=False)`` -- cancels the agent's runs,
delivers no result of theirs, disposes each once it has settled, and only then
lets the agent go (a drain releases children first). A one-shot child is refused
background delegation (``INVALID_ARGUMENT``, before anything starts): its run
ends with its turn, and the result would reach nobody (:mod:`._delegated`).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from subagents.actors._agents import Turn
from subagents.actors._kernel import AbortController, check_timeout, stamp
from subagents.protocol import ErrorCode, MessageSource, SessionId, SubagentError, error_text

from ._background import (
    Background,
    Countdown,
    deliver_result,
    dispose_later,
    dispose_quietly,
    in_order,
)
from ._calls import (
    call_message_id,
    child_fields,
    interrupt,
    list_agents,
    report,
    result_message_id,
    send_message,
    start_agent,
)
from ._delegated import background_refused, lost_result, one_shot, run_result
from ._runtime_tools import UnshownNames, runtime_tool
from ._schemas import ModelTool, parse_arguments, tool_definition, tool_table

__all__ = ["ToolDispatcher"]

logger = logging.getLogger("subagents")

_UNKNOWN_TOOL: Final = "INVALID_ARGUMENT"


def _refusal(code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message[:2000]}}


class ToolDispatcher:
    """Subagent tools for a model: definitions to show it, and calls to run.

    Args:
        tools: which subagent tools to offer, by name (default: all six).
        extra: further functions, by name (they pass the same filter).
        delegate_timeout: seconds a waiting ``delegate`` waits for its result
            (``None``: as long as the turn runs); on expiry the run is disposed
            and the model gets a ``TIMEOUT`` result.
        runtime_tools: also show the tools the agent may call through
            ``turn.call_tool`` (the runtime's and its scope's), each described
            from its signature and docstring.

    Thread-safe; one dispatcher may serve many agents.

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` for what would fail later (see
            :func:`._schemas.tool_table`): an unknown subagent tool name (or a
            str for ``tools``), an ``extra`` that is not a mapping, an extra tool
            that is not a :class:`ModelTool` with a callable ``fn``, whose name
            the model API refuses (``^[a-zA-Z0-9_-]{1,64}$``), whose description
            is not a str, or whose schema is not a valid JSON Schema of an
            object that JSON can carry; a ``delegate_timeout`` that is not
            ``None`` or a number of seconds >= 0, or a ``runtime_tools`` that is
            not a bool.
    """

    def __init__(
        self,
        *,
        tools: Iterable[str] | None = None,
        extra: Mapping[str, ModelTool] | None = None,
        delegate_timeout: float | None = None,
        runtime_tools: bool = True,
    ) -> None:
        self._tools, self._validators = tool_table(tools, extra)
        self.delegate_timeout = check_timeout(delegate_timeout, "delegate_timeout")
        if type(runtime_tools) is not bool:
            raise SubagentError("runtime_tools is True or False", code=ErrorCode.INVALID_ARGUMENT)
        self.runtime_tools = runtime_tools
        self._lock = threading.Lock()
        self._background: dict[SessionId, Background] = {}
        self._unshown = UnshownNames()  # runtime tools the model API would refuse
        self._handlers: dict[str, Callable[..., Any]] = {
            "delegate": self._delegate,
            "start_agent": start_agent,
            "send_message": send_message,
            "interrupt": interrupt,
            "report": report,
            "list_agents": list_agents,
        }

    # -- what the model sees ------------------------------------------------------

    def visible(self, turn: Turn) -> tuple[str, ...]:
        """Names of the tools this turn's agent may see and call, in order."""
        return self._own(turn) + tuple(self._runtime(turn))

    def definitions(self, turn: Turn) -> list[dict[str, Any]]:
        """The OpenAI ``tools`` list for this turn's agent (``[]`` when it sees none)."""
        own = [tool_definition(name, self._tools[name]) for name in self._own(turn)]
        return own + [tool_definition(n, tool) for n, tool in self._runtime(turn).items()]

    def _own(self, turn: Turn) -> tuple[str, ...]:
        """This dispatcher's tools the turn's agent may see and call, in order."""
        agent = turn.agent
        allowed = agent.options.tool_filter
        has_parent = agent.parent_session is not None
        return tuple(
            name
            for name in self._tools
            if (allowed is None or name in allowed) and (name != "report" or has_parent)
        )

    def _runtime(self, turn: Turn, only: str | None = None) -> dict[str, ModelTool]:
        """The runtime tools this turn's agent may call (or just ``only``), as model
        tools; a name of this dispatcher's own is never one."""
        if not self.runtime_tools:
            return {}
        agent = turn.agent
        registry = agent.host.tools
        shown: dict[str, ModelTool] = {}
        for name in turn.tools if only is None else (only,):
            if name in self._tools:
                continue
            fn = registry.lookup(agent.options.tool_filter, agent.extra_tools, name)
            # Warned of only when it is a tool: a model's call may name anything.
            if fn is not None and not self._unshown.skip(name):
                shown[name] = runtime_tool(name, fn)
        return shown

    # -- calls ----------------------------------------------------------------------

    def dispatch(
        self,
        turn: Turn,
        name: str,
        arguments: str | Mapping[str, Any] | None,
        *,
        place: str | None = None,
    ) -> Any:
        """Run one tool call of the model for ``turn``; its JSON-able result.

        ``arguments`` is the call's JSON text (as the model produced it) or a
        mapping. A refusal is returned as ``{"error": {"code", "message"}}``.
        ``place``: where the call is in the turn (e.g. round and position); with
        it, ``delegate``, ``start_agent``, ``send_message`` and ``report`` carry a
        message id derived from the turn's message, ``place``, the name and the
        arguments, so a replayed turn making the same call again takes effect
        once (a ``delegate`` whose child completed gets its recorded result).

        Raises:
            SubagentError: ``CANCELLED`` only when the turn itself was cancelled --
                and then before the tool runs, if it was by the time it would.
        """
        turn.signal.raise_if_aborted()  # a cancelled turn starts nothing more
        self.dispose_settled(turn)
        try:
            tool, args = self._arguments(turn, name, arguments)
            handler = self._handlers.get(name)
            if handler is not None:
                mid = None if place is None else call_message_id(turn, place, name, args)
                return handler(turn, mid, **args)
            return tool.fn(turn, **args)
        except SubagentError as exc:
            if turn.cancelled:
                raise
            return _refusal(exc.code, exc.args[0] if exc.args else str(exc))
        except Exception as exc:  # an extra tool's own failure: the model reads it
            if turn.cancelled:
                raise
            # The type and the traceback: a tool's failure is a bug its author looks for.
            text = error_text(exc, "the tool failed: ")
            logger.warning("tool %r of %s: %s", name, turn.agent.session_id, text, exc_info=exc)
            return _refusal(ErrorCode.INTERNAL, text)

    def _arguments(
        self, turn: Turn, name: str, arguments: str | Mapping[str, Any] | None
    ) -> tuple[ModelTool, dict[str, Any]]:
        own = type(name) is str and name in self._tools
        tool = self._tools[name] if own else None
        if type(name) is str and not own:
            tool = self._runtime(turn, name).get(name)
        if tool is None:
            shown = repr(name)[:80] if type(name) is str else type(name).__name__
            raise SubagentError(f"no tool named {shown}", code=_UNKNOWN_TOOL)
        if own and name not in self._own(turn):
            raise SubagentError(
                f"tool {name!r} is not available to this agent", code=ErrorCode.UNAUTHORIZED
            )
        validator = self._validators[name] if own else None
        return tool, parse_arguments(name, arguments, tool.parameters, validator)

    # -- the six tools --------------------------------------------------------------

    def _delegate(
        self,
        turn: Turn,
        mid: str | None,
        prompt: str,
        provider: str = "local",
        background: bool = False,
        **rest: Any,
    ) -> Any:
        subs = turn.subagents
        fields = child_fields(rest)
        fields["message_id"] = mid  # the start once per call (None: every time)
        sessions = turn.agent.host.sessions
        if not background:
            run = subs.start(provider, prompt, **fields)
            try:  # (a failure's reason is read from the child's log before it goes)
                return run_result(sessions, run.id, run.result.get(timeout=self.delegate_timeout))
            finally:
                run.dispose()
        state = self._background_of(turn)
        if state.one_shot is None:
            state.one_shot = one_shot(turn)
        if state.one_shot:
            raise background_refused()  # before anything starts: see ._delegated
        with self._lock:  # counted from now: a run finishing meanwhile keeps the hold
            state.starting += 1
        try:
            if state.release is None:  # held before the run starts: no settling in between
                release = subs.hold_residency()
                if release is not None and not self._keep_hold(state, release):
                    release()  # a parallel call held first
            controller = state.controller
            run = subs.start(provider, prompt, signal=controller.signal, **fields)
        except BaseException:
            with self._lock:
                state.starting -= 1
            self._release_if_idle(state)
            raise
        with self._lock:
            state.starting -= 1
            state.runs[str(run.id)] = run
        agent = turn.agent
        # The result continues this turn's trace, and so does its stand-in.
        source = stamp(agent.host.telemetry, MessageSource(kind="child", session_id=run.id))
        delivery = result_message_id(mid, run.id)

        def deliver(_future: Any) -> None:
            retries = None
            try:
                retries = deliver_result(agent, run, controller.signal, source, delivery)
            finally:
                if retries is not None:  # (not in the run's thread: they wait)
                    state.backend.spawn(in_order, retries, disposing, name="background-result")
                else:
                    disposing()

        def disposing() -> None:
            with self._lock:  # (not if cancelled with them all meanwhile)
                mine = str(run.id) in state.runs
            if mine:
                # Its result is in the agent's inbox (or had nowhere to go): the
                # run is disposed -- in a task, this may be the run's own thread
                # -- and then the hold ends if it was the last.
                state.backend.spawn(finish, name="background-run-dispose")

        def finish() -> None:
            dispose_quietly(run)
            # Counted until disposed: the turn its result starts may end the hold
            # first, and the agent must not settle before its run (children first).
            with self._lock:
                mine = state.runs.pop(str(run.id), None) is not None
            if mine:
                self._release_if_idle(state)

        run.result.add_done_callback(deliver)
        try:  # the promise outlives this process: see ._delegated.lost_result
            turn.expect(delivery, lost_result(run.id), source)
        except SubagentError as exc:  # (only for a turn no longer running)
            logger.warning("background run %s is not recorded as owed: %s", run.id, exc)
        return {"id": str(run.id), "status": "running"}

    # -- background runs --------------------------------------------------------------

    def _background_of(self, turn: Turn) -> Background:
        agent = turn.agent
        with self._lock:
            state = self._background.get(agent.session_id)
            if state is not None:
                return state
            state = self._background[agent.session_id] = Background(agent.host.backend)
        add = getattr(agent, "add_dispose_listener", None)
        if add is not None:
            add(lambda _agent: self._forget(agent.session_id, state))
        on_cancel = getattr(agent, "add_cancel_listener", None)
        if on_cancel is not None:
            on_cancel(lambda cause: self._cancel_all(state, cause))
        return state

    def _forget(self, session_id: SessionId, state: Background) -> None:
        with self._lock:
            if self._background.get(session_id) is state:
                del self._background[session_id]
        self._cancel_all(state, "the agent that started it was disposed")

    def _cancel_all(self, state: Background, cause: Any) -> None:
        """Cancel every run of ``state``; dispose each once it has settled, and end
        the residency hold after the last (children first)."""
        with self._lock:
            runs = list(state.runs.values())
            state.runs.clear()
            controller, state.controller = state.controller, AbortController()
            release, state.release = state.release, None
        controller.abort(cause if cause is not None else "cancelled")
        # Each one is disposed in a task of its own: this runs in a cancel or in
        # the agent's stop, which must not wait for another actor.
        countdown = Countdown(len(runs), release)
        for run in runs:
            run.result.add_done_callback(
                functools.partial(dispose_later, state.backend, run, countdown)
            )

    def _keep_hold(self, state: Background, release: Callable[[], None]) -> bool:
        with self._lock:
            if state.release is not None:
                return False
            state.release = release
            return True

    def _release_if_idle(self, state: Background) -> None:
        with self._lock:
            if state.runs or state.starting or state.release is None:
                return
            release, state.release = state.release, None
        release()

    def background(self, turn: Turn) -> tuple[str, ...]:
        """Ids of the background runs of this turn's agent not yet disposed."""
        with self._lock:
            state = self._background.get(turn.agent.session_id)
            return tuple(state.runs) if state is not None else ()

    def dispose_settled(self, turn: Turn) -> None:
        """End the agent's residency hold when none of its background runs is left.

        A run is disposed once its result was delivered (a run settled and still
        delivering keeps the agent resident); the dispatcher calls this on every
        call, and a behaviour may too."""
        with self._lock:
            state = self._background.get(turn.agent.session_id)
        if state is not None:
            self._release_if_idle(state)
