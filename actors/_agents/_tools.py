"""The tool registry (``runtime.tools``): runtime-wide tools an agent may call.

An agent sees the registered tools its ``tool_filter`` allows, plus the tools a
setup contribution installed into its own scope (``extra``), which no filter hides.

A tool's name is one a model API takes as a function's (:data:`TOOL_NAME_PATTERN`,
OpenAI's rule): a model may be shown any registered tool, and a request naming
another fails. The rule is defined here, below the model layer, which checks
the names it shows by it.
"""

from __future__ import annotations

import inspect
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any, Final

from subagents.protocol import ErrorCode, SubagentError

__all__ = ["TOOL_NAME_PATTERN", "ToolFn", "ToolRegistry", "check_tool_fn", "valid_tool_name"]

ToolFn = Callable[..., Any]

#: The function names the OpenAI API accepts; it refuses a request with any other.
TOOL_NAME_PATTERN: Final = "^[a-zA-Z0-9_-]{1,64}$"
_TOOL_NAME: Final = re.compile(TOOL_NAME_PATTERN)


def valid_tool_name(name: object) -> bool:
    """Whether the OpenAI API accepts ``name`` as a function's (:data:`TOOL_NAME_PATTERN`)."""
    # fullmatch: ``$`` alone would let a trailing newline through.
    return type(name) is str and _TOOL_NAME.fullmatch(name) is not None


def check_tool_fn(fn: object, name: str) -> None:
    """Refuse a tool function that cannot take the turn as its first positional
    argument (how every tool is called): shown to a model, it would fail every
    call with a ``TypeError``. A callable whose signature cannot be read passes.

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` for a callable that takes no
            positional argument (no parameter, or a keyword-only ``turn``).
    """
    try:
        signature = inspect.signature(fn)  # type: ignore[arg-type]
    except (TypeError, ValueError):  # a builtin it cannot read: called as given
        return
    try:
        signature.bind_partial(None)
    except TypeError:
        raise SubagentError(
            f"tool {name[:80]!r}: a tool is called with the turn first, fn(turn, ...),"
            f" and {getattr(fn, '__qualname__', type(fn).__name__)[:80]} takes no"
            " positional argument",
            code=ErrorCode.INVALID_ARGUMENT,
        ) from None


class ToolRegistry:
    """Runtime-wide tools by name. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tools: dict[str, ToolFn] = {}

    def register(self, name: str, fn: ToolFn) -> None:
        """Register ``fn`` under ``name`` (replacing one of that name).

        ``name`` is one a model API accepts (:data:`TOOL_NAME_PATTERN`: ASCII
        letters, digits, ``_`` and ``-``, 1 to 64 of them), so any agent's model
        can be shown the tool.

        Raises:
            SubagentError: ``INVALID_ARGUMENT`` for an empty name, a name that does
                not match :data:`TOOL_NAME_PATTERN` (a dot, a space, over 64
                characters ...), a non-callable, or one that cannot take the
                turn first (:func:`check_tool_fn`).
        """
        if type(name) is not str or not name or not callable(fn):
            raise SubagentError(
                "a tool is a non-empty name and a callable", code=ErrorCode.INVALID_ARGUMENT
            )
        if not valid_tool_name(name):  # a model is shown it: a request naming it would fail
            raise SubagentError(
                f"tool name {name[:80]!r}: a tool's name must match {TOOL_NAME_PATTERN}"
                " (what OpenAI-compatible model APIs accept)",
                code=ErrorCode.INVALID_ARGUMENT,
            )
        check_tool_fn(fn, name)
        with self._lock:
            self._tools[name] = fn

    def visible(
        self, tool_filter: tuple[str, ...] | None, extra: Mapping[str, ToolFn]
    ) -> tuple[str, ...]:
        """Names an agent with ``tool_filter`` and scope tools ``extra`` may call."""
        names = tuple(self._tools)
        if tool_filter is not None:
            names = tuple(n for n in names if n in tool_filter)
        return names + tuple(n for n in extra if n not in names)

    def lookup(
        self, tool_filter: tuple[str, ...] | None, extra: Mapping[str, ToolFn], name: str
    ) -> ToolFn | None:
        """The function :meth:`call` would call for ``name``, or ``None`` (no such
        tool, or the filter hides it)."""
        own = extra.get(name)
        if own is not None:
            return own
        if tool_filter is not None and name not in tool_filter:
            return None
        return self._tools.get(name)

    def call(
        self,
        tool_filter: tuple[str, ...] | None,
        extra: Mapping[str, ToolFn],
        name: str,
        turn: Any,
        /,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """Call tool ``name`` for a turn, as :meth:`visible` allows.

        Raises:
            SubagentError: ``INVALID_ARGUMENT`` when no such tool exists,
                ``UNAUTHORIZED`` when the filter hides it.
        """
        fn = self.lookup(tool_filter, extra, name)
        if fn is None and name in self._tools:
            raise SubagentError(
                f"tool {name!r} is filtered out for this agent", code=ErrorCode.UNAUTHORIZED
            )
        if fn is None:
            raise SubagentError(f"no tool named {name!r}", code=ErrorCode.INVALID_ARGUMENT)
        return fn(turn, *args, **kwargs)
