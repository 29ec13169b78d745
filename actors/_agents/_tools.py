"""The tool registry (``runtime.tools``): runtime-wide tools an agent may call.

An agent sees the registered tools its ``tool_filter`` allows, plus the tools a
setup contribution installed into its own scope (``extra``), which no filter hides.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from subagents.protocol import ErrorCode, SubagentError, check_name

__all__ = ["ToolFn", "ToolRegistry"]

ToolFn = Callable[..., Any]


class ToolRegistry:
    """Runtime-wide tools by name. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._tools: dict[str, ToolFn] = {}

    def register(self, name: str, fn: ToolFn) -> None:
        """Register ``fn`` under ``name`` (replacing one of that name).

        Raises:
            SubagentError: ``INVALID_ARGUMENT`` for an empty name or a non-callable.
        """
        if type(name) is not str or not name or not callable(fn):
            raise SubagentError(
                "a tool is a non-empty name and a callable", code=ErrorCode.INVALID_ARGUMENT
            )
        check_name(name, "a tool name")  # a model sees it: UTF-8 must encode it
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
