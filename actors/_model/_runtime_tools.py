"""The runtime's tools as a model sees them: a function definition from a signature.

A tool registered on the runtime (``runtime.tools.register``) or installed into a
child's scope by a setup contribution is a Python function ``fn(turn, ...)``
with no JSON Schema of its own. Shown to a model, its parameters after ``turn``
become the properties of an object schema -- required when they have no default,
typed when annotated ``str``, ``int``, ``float``, ``bool``, ``list``, ``tuple`` or
``dict`` (or a generic form, ``list[str]``; or one of them or ``None``; a
``Literal`` is an enum: :func:`_schema_of`) -- and its docstring's first
paragraph the description. The call then goes through ``turn.call_tool``, so
the agent's tool filter decides as it does for a behaviour's own calls.
``runtime.tools`` refuses a name the model API refuses
(:data:`~._schemas.TOOL_NAME_PATTERN`: a dot, a space, over 64 characters); a
scope tool so named is not shown -- a request carrying it would fail every
turn -- and is logged once (:class:`UnshownNames`).
"""

from __future__ import annotations

import inspect
import logging
import threading
import types
import typing
from collections.abc import Callable
from typing import Any, Final

from ._schemas import TOOL_NAME_PATTERN, ModelTool, valid_tool_name

__all__ = ["UnshownNames", "runtime_tool"]

logger = logging.getLogger("subagents")

_JSON_TYPES: Final = {
    str: "string",
    int: "integer",
    float: "number",
    bool: "boolean",
    list: "array",
    tuple: "array",
    dict: "object",
}

_P = inspect.Parameter


def runtime_tool(name: str, fn: Callable[..., Any]) -> ModelTool:
    """``fn`` (a runtime or scope tool named ``name``) as a :class:`ModelTool`."""
    try:
        params = list(inspect.signature(fn).parameters.values())[1:]  # after ``turn``
    except (TypeError, ValueError):  # a callable it cannot read: any arguments
        params = [_P("arguments", _P.VAR_KEYWORD)]
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # an annotation that does not resolve: leave it untyped
        hints = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    positional: list[tuple[str, Any]] = []  # positional-only: name, default
    open_ended = False
    for p in params:
        if p.kind is _P.VAR_KEYWORD:
            open_ended = True
            continue
        if p.kind is _P.VAR_POSITIONAL:
            continue
        properties[p.name] = _schema_of(hints.get(p.name))
        if p.default is _P.empty:
            required.append(p.name)
        if p.kind is _P.POSITIONAL_ONLY:
            positional.append((p.name, p.default))
    schema = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": open_ended,
    }
    doc = inspect.getdoc(fn) or ""
    description = doc.split("\n\n")[0].strip() or f"the tool {name!r}"

    def call(turn: Any, **arguments: Any) -> Any:
        # Positional-only parameters in order, up to the last one given; one left
        # out before it takes its default (the schema requires those without).
        given = [i for i, (p, _d) in enumerate(positional) if p in arguments]
        args = [
            arguments.pop(p) if p in arguments else default
            for p, default in positional[: given[-1] + 1 if given else 0]
        ]
        return turn.call_tool(name, *args, **arguments)

    return ModelTool(description=description[:1000], parameters=schema, fn=call)


def _schema_of(hint: Any) -> dict[str, Any]:
    """The JSON Schema of a parameter annotated ``hint``: its JSON type for ``str``,
    ``int``, ``float``, ``bool``, ``list``, ``tuple``, ``dict`` and their generic
    forms (``list[str]``), the same or ``null`` for one of them or ``None`` (``int |
    None``, ``Optional[int]``), an enum for a ``Literal`` of JSON scalars; anything
    (``{}``) for the rest."""
    try:
        kind = _JSON_TYPES.get(hint) or _JSON_TYPES.get(typing.get_origin(hint))
    except TypeError:  # an unhashable annotation
        return {}
    if kind:
        return {"type": kind}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Literal and all(type(a) in (str, int, bool) for a in args):
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType) and len(args) == 2 and type(None) in args:
        inner = _schema_of(next(a for a in args if a is not type(None)))
        if "type" in inner:
            return {"type": [inner["type"], "null"]}
    return {}


class UnshownNames:
    """Runtime tool names the model API would refuse: :meth:`skip` says to leave
    one out, and logs a warning the first time it meets it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: set[str] = set()

    def skip(self, name: str) -> bool:
        """Whether ``name`` must not be shown (warned about once)."""
        if valid_tool_name(name):
            return False
        with self._lock:
            first = name not in self._seen
            self._seen.add(name)
        if first:
            logger.warning(
                "runtime tool %r is not shown to models: the model API takes names matching %s",
                name[:80],
                TOOL_NAME_PATTERN,
            )
        return True
