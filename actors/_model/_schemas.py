"""The model-facing subagent tools as JSON-schema function definitions.

Each entry is what an OpenAI-compatible ``tools`` list carries for one function:
a name, a description the model reads, and the JSON Schema of its arguments.
The dispatcher validates every call against the same schema before it acts.
A function's name follows the tool registry's rule (:data:`TOOL_NAME_PATTERN`,
defined there and re-exported here).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import jsonschema
from subagents.actors._agents import TOOL_NAME_PATTERN, check_tool_fn, valid_tool_name
from subagents.protocol import ErrorCode, SubagentError

__all__ = [
    "SUBAGENT_TOOLS",
    "TOOL_NAME_PATTERN",
    "ModelTool",
    "parse_arguments",
    "tool_definition",
    "tool_table",
    "valid_tool_name",
]

_ID: Final = {"type": "string", "pattern": "^[0-9a-f]{32}$", "description": "an agent's id"}
_TEXT: Final = {"type": "string", "minLength": 1, "maxLength": 100_000}
# The descriptor's rule for a label, model, provider or tool name: non-blank, at
# most 200 characters (protocol's MAX_LABEL_LEN; a test keeps the two equal), so a
# call the schema lets through is not refused by the start after it.
_NAME: Final = {"type": "string", "minLength": 1, "maxLength": 200, "pattern": "\\S"}
_CHILD_FIELDS: Final = {
    "provider": {**_NAME, "description": "where the child runs (default: local)"},
    "model": {**_NAME, "description": "the child's model (default: your own)"},
    "persona": {
        "type": "string",
        "maxLength": 4096,
        "description": "the child's system prompt (its persona)",
    },
    "tools": {
        "type": "array",
        "items": _NAME,
        "maxItems": 64,
        "uniqueItems": True,
        "description": "the only tools the child may use (never more than yours)",
    },
}


@dataclass(frozen=True, slots=True)
class ModelTool:
    """A function a model may call: ``fn(turn, **arguments)`` returns a JSON-able value.

    ``parameters`` is the JSON Schema of the arguments (an object schema); the
    dispatcher validates a call against it before calling ``fn``.
    """

    description: str
    parameters: Mapping[str, Any]
    fn: Any = field(default=None, compare=False)


def _object(properties: Mapping[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": dict(properties),
        "required": list(required),
        "additionalProperties": False,
    }


#: The six subagent tools, by name, in the order a model is shown them.
SUBAGENT_TOOLS: Final[Mapping[str, ModelTool]] = {
    "delegate": ModelTool(
        "Hand a self-contained task to a new one-shot subagent. By default wait for its"
        " result; with background=true return its id at once and receive the result"
        " later as a message.",
        _object(
            {
                "prompt": {**_TEXT, "description": "the task, complete in itself"},
                "label": {**_NAME, "description": "a short display name"},
                **_CHILD_FIELDS,
                "background": {"type": "boolean", "description": "do not wait for the result"},
            },
            ("prompt",),
        ),
    ),
    "start_agent": ModelTool(
        "Start a continuable subagent that keeps its conversation: it works on the"
        " prompt now, and you can send it follow-ups later by its id.",
        _object(
            {
                "prompt": {**_TEXT, "description": "its first task"},
                "label": {**_NAME, "description": "a short durable name (required)"},
                **_CHILD_FIELDS,
            },
            ("prompt", "label"),
        ),
    ),
    "send_message": ModelTool(
        "Send a follow-up message to one of your continuable subagents; it runs as"
        " the subagent's next turn. steer: deliver it into the turn the subagent is"
        " running now, if any (else it is queued as usual).",
        _object(
            {
                "id": _ID,
                "content": _TEXT,
                "steer": {"type": "boolean", "description": "default: false"},
            },
            ("id", "content"),
        ),
    ),
    "interrupt": ModelTool(
        "Cancel the current turn of one of your continuable subagents (or a deeper"
        " descendant). Its queued messages still run.",
        _object({"id": _ID}, ("id",)),
    ),
    "report": ModelTool(
        "Report to the agent that started you. quiet: it sees the report in its next"
        " turn; waking: the report starts a turn of its own.",
        _object(
            {
                "content": _TEXT,
                "delivery": {"enum": ["quiet", "waking"], "description": "default: quiet"},
            },
            ("content",),
        ),
    ),
    "list_agents": ModelTool(
        "List your subagents with their state: your direct children, or your whole"
        " subtree (each row then names its parent and depth).",
        _object(
            {"scope": {"enum": ["children", "descendants"], "description": "default: children"}}
        ),
    ),
}


def tool_definition(name: str, tool: ModelTool) -> dict[str, Any]:
    """The OpenAI ``tools`` entry of one function: ``{"type": "function", "function": ...}``."""
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": tool.description,
            "parameters": dict(tool.parameters),
        },
    }


def parse_arguments(
    name: str,
    arguments: str | Mapping[str, Any] | None,
    schema: Mapping[str, Any],
    validator: Any = None,
) -> dict[str, Any]:
    """A tool call's arguments -- JSON text as the model wrote it, or a mapping;
    none is ``{}`` -- checked against the tool's JSON Schema (``validator``: one
    made for it already).

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` for text that is not JSON (or nests
            deeper than the parser goes), a value that is not an object, or one
            the schema refuses (where, and why).
    """
    if arguments is None or arguments == "":
        args: Any = {}
    elif isinstance(arguments, str):
        try:
            args = json.loads(arguments)
        except (ValueError, RecursionError) as exc:
            raise SubagentError(
                f"the arguments of {name} are not valid JSON: {exc}",
                code=ErrorCode.INVALID_ARGUMENT,
            ) from None
    else:
        args = arguments
    if not isinstance(args, Mapping):
        raise SubagentError(
            f"the arguments of {name} must be a JSON object", code=ErrorCode.INVALID_ARGUMENT
        )
    if validator is None:
        validator = jsonschema.validators.validator_for(schema)(schema)
    error = jsonschema.exceptions.best_match(validator.iter_errors(args))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path)
        raise SubagentError(
            f"the arguments of {name} do not match its schema"
            f"{f' at {where}' if where else ''}: {error.message}",
            code=ErrorCode.INVALID_ARGUMENT,
        )
    return dict(args)


def tool_table(
    tools: Iterable[str] | None, extra: Mapping[str, ModelTool] | None
) -> tuple[dict[str, ModelTool], dict[str, Any]]:
    """A dispatcher's tools by name -- the subagent tools named in ``tools`` (all
    when ``None``), then ``extra`` -- and a JSON Schema validator for each.

    Checked now, because each mistake would fail later and far from where it was
    made: a description or schema the model API cannot take fails every request
    of every turn that shows the tool, and a schema of anything but an object
    fails every call (a call's arguments are a JSON object).

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` for a str as ``tools`` or a name in it
            that is no subagent tool; an ``extra`` that is not a mapping, or an
            entry whose name is a subagent tool's or one the API refuses
            (:data:`TOOL_NAME_PATTERN`), that is not a :class:`ModelTool` with a
            callable ``fn`` that takes the turn first, whose description is not
            a str, or whose parameters are not a valid JSON Schema, of an
            object, that JSON can carry.
    """

    def refuse(message: str) -> SubagentError:
        return SubagentError(message[:500], code=ErrorCode.INVALID_ARGUMENT)

    if isinstance(tools, str):  # iterating it would name its letters
        raise refuse(f"tools is an iterable of subagent tool names, not a str: {tools[:80]!r}")
    names = tuple(SUBAGENT_TOOLS) if tools is None else tuple(tools)
    unknown = [n for n in names if n not in SUBAGENT_TOOLS]
    if unknown:
        raise refuse(f"no subagent tool named {unknown[0]!r}")
    if extra is not None and not isinstance(extra, Mapping):
        raise refuse(f"extra maps tool names to ModelTool values, got {type(extra).__name__}")
    table: dict[str, ModelTool] = {n: SUBAGENT_TOOLS[n] for n in names}
    for name, tool in (extra or {}).items():
        if type(name) is not str or not name or name in SUBAGENT_TOOLS:
            raise refuse("an extra tool needs a name of its own")
        if not valid_tool_name(name):
            raise refuse(
                f"extra tool {name[:80]!r}: the model API takes names matching {TOOL_NAME_PATTERN}"
            )
        if not isinstance(tool, ModelTool) or not callable(tool.fn):
            raise refuse(f"extra tool {name!r} is not a ModelTool with a callable fn")
        check_tool_fn(tool.fn, name)
        if not isinstance(tool.description, str):
            raise refuse(
                f"extra tool {name!r}: its description is a str,"
                f" got {type(tool.description).__name__}"
            )
        table[name] = tool
    validators = {
        name: _builtin_validator(name) if name in SUBAGENT_TOOLS else _checked_validator(name, tool)
        for name, tool in table.items()
    }
    return table, validators


@functools.cache
def _builtin_validator(name: str) -> Any:
    """The validator of subagent tool ``name``, made once: its schema is a constant,
    and checking it again for every dispatcher (``openai_chat(tools=True)`` makes
    one per agent, at each activation) cost some 10 ms of CPU each time."""
    return _checked_validator(name, SUBAGENT_TOOLS[name])


def _checked_validator(name: str, tool: ModelTool) -> Any:
    """A JSON Schema validator of ``tool``'s arguments, once its definition is
    checked as :func:`tool_table` says (``INVALID_ARGUMENT``)."""

    def refuse(message: str) -> SubagentError:
        return SubagentError(message[:500], code=ErrorCode.INVALID_ARGUMENT)

    schema = tool.parameters
    if not isinstance(schema, Mapping):
        raise refuse(
            f"tool {name!r}: its parameters are a JSON Schema (a mapping),"
            f" got {type(schema).__name__}"
        )
    if schema.get("type", "object") != "object":
        raise refuse(
            f"tool {name!r}: its arguments are a JSON object, so its schema's"
            f" type is 'object', not {schema.get('type')!r}"
        )
    cls = jsonschema.validators.validator_for(schema)
    try:
        cls.check_schema(schema)
        json.dumps(tool_definition(name, tool), allow_nan=False)
    except jsonschema.SchemaError as exc:
        raise refuse(f"tool {name!r}: not a valid JSON Schema: {exc.message}") from exc
    except (TypeError, ValueError, RecursionError) as exc:
        raise refuse(f"tool {name!r}: JSON cannot carry its definition: {exc}") from exc
    return cls(schema)
