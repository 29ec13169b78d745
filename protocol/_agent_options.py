"""The versioned ``agent/options``: what a top-level agent was spawned with.

A top-level agent has no ``subagent/descriptor``; this event is its durable
counterpart, so a new process can resume the agent without being given its model
again. It records explicit resolved fields only -- ``model``, ``provider``,
``persona``, ``tool_filter`` and the ``output_schema`` its turns' output must
satisfy -- never a merge-extensible options object.

Wire payload (version 1)::

    {"v": 1, "model": "echo", "provider": "local"|None,
     "persona": "..."|None, "tool_filter": ["a", "b"]|None,
     "output_schema": {...}}

``output_schema`` is there only when the agent has one, and a record with it is
version 2 (the same fields and ``output_schema``): a runtime from before it reads
such a record as *unsupported* (a newer runtime's), not as corrupt, and a record
without it is the version-1 payload every runtime wrote before.

:func:`fold_agent_options` is last-wins over a log and never raises. A
current-version payload that is malformed is *corrupt*; any other int version is
*unsupported* (a newer runtime may still read it); no event is *absent*.

The field rules are the descriptor's (:mod:`._descriptor`): a name is a non-blank
str of at most 200 characters, a persona a str of at most 65536 characters, a
tool filter at most 1024 non-empty str names (an empty filter means "no tools");
an output schema is a map with str keys (whether it is a valid JSON Schema is
checked where an agent is spawned).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from ._descriptor import _keys, _name, _persona, _tool_filter
from ._errors import ErrorCode, SubagentError
from ._vocabulary import AgentOptionsEvent, Event

__all__ = [
    "AGENT_OPTIONS_VERSION",
    "OptionsFold",
    "RecordedOptions",
    "agent_options_event",
    "fold_agent_options",
]

AGENT_OPTIONS_VERSION: Final = 1
#: The version of a record that carries an output schema.
_SCHEMA_VERSION: Final = 2
_FIELDS: Final = frozenset({"v", "model", "provider", "persona", "tool_filter"})
_SCHEMA_FIELDS: Final = _FIELDS | {"output_schema"}


@dataclass(frozen=True, slots=True, kw_only=True)
class RecordedOptions:
    """The options a top-level agent was spawned with, as ``agent/options`` records them.

    ``provider``, ``persona``, ``tool_filter`` and ``output_schema`` are ``None``
    when unset; an empty ``tool_filter`` is set ("no tools"), not unrestricted.
    """

    model: str
    provider: str | None = None
    persona: str | None = None
    tool_filter: tuple[str, ...] | None = None
    output_schema: Mapping[str, Any] | None = None


class _Unsupported(Exception):
    """A payload of another version: not this runtime's to classify."""


def _checked(record: Mapping[str, Any], err: type[Exception]) -> RecordedOptions:
    """Build options from ``record``'s fields, raising ``err`` for an invalid one."""
    tools = record.get("tool_filter")
    if tools is not None and not isinstance(tools, (list, tuple)):
        raise err("tool_filter must be a list or tuple of tool names")
    provider = record.get("provider")
    schema = record.get("output_schema")
    if schema is not None and not (
        isinstance(schema, Mapping) and all(type(k) is str for k in schema)
    ):
        raise err("output_schema must be a map with str keys")
    return RecordedOptions(
        model=_name(record.get("model"), "model", err),
        provider=None if provider is None else _name(provider, "provider", err),
        persona=_persona(record.get("persona"), err),
        tool_filter=_tool_filter(tools, err),
        output_schema=schema,
    )


def agent_options_event(options: RecordedOptions) -> AgentOptionsEvent:
    """Validate ``options`` and return its version-stamped ``agent/options`` event.

    The payload is a fresh map (the tool filter a fresh list): nothing the caller
    holds is shared with it.

    Raises:
        SubagentError: code ``INVALID_ARGUMENT`` -- ``options`` is not a
            :class:`RecordedOptions`, or a field breaks the rules above.
    """
    if not isinstance(options, RecordedOptions):
        raise SubagentError(
            f"expected RecordedOptions, got {type(options).__name__}",
            code=ErrorCode.INVALID_ARGUMENT,
        )
    fields = {name: getattr(options, name) for name in RecordedOptions.__slots__}
    try:
        checked = _checked(fields, ValueError)
    except ValueError as exc:
        raise SubagentError(str(exc), code=ErrorCode.INVALID_ARGUMENT) from None
    schema = checked.output_schema
    payload: dict[str, Any] = {
        "v": AGENT_OPTIONS_VERSION if schema is None else _SCHEMA_VERSION,
        "model": checked.model,
        "provider": checked.provider,
        "persona": checked.persona,
        "tool_filter": None if checked.tool_filter is None else list(checked.tool_filter),
    }
    if schema is not None:  # absent without one: the version-1 payload, as before
        payload["output_schema"] = copy.deepcopy(dict(schema))
    return AgentOptionsEvent(payload=payload)


def _parse(payload: Any) -> RecordedOptions:
    """Classify one stored payload: ``_Unsupported``, ``ValueError`` (corrupt) or options."""
    if not isinstance(payload, Mapping):
        raise ValueError("agent options payload is not a map")
    version = payload.get("v")
    if type(version) is not int:
        raise ValueError(f"agent options version must be an int, got {version!r}"[:200])
    if version not in (AGENT_OPTIONS_VERSION, _SCHEMA_VERSION):
        raise _Unsupported(f"agent options version {version} is not supported by this runtime")
    extra = set(payload) - (_FIELDS if version == AGENT_OPTIONS_VERSION else _SCHEMA_FIELDS)
    if extra:
        raise ValueError(f"agent options carry unknown field(s) {_keys(extra)}")
    if payload.get("tool_filter") is not None and not isinstance(payload["tool_filter"], list):
        raise ValueError("tool_filter must be an array")
    return _checked(payload, ValueError)


@dataclass(frozen=True, slots=True, kw_only=True)
class OptionsFold:
    """Result of :func:`fold_agent_options`; never an exception.

    ``verdict`` is ``"ok"`` (``options`` set), ``"absent"`` (no ``agent/options``
    event), ``"corrupt"`` (the newest is a malformed current-version payload, or
    reading the log failed) or ``"unsupported"`` (the newest has another version);
    ``reason`` says why for the last two.
    """

    verdict: Literal["ok", "absent", "corrupt", "unsupported"]
    options: RecordedOptions | None = None
    reason: str | None = None


def fold_agent_options(events: Iterable[Event]) -> OptionsFold:
    """Last-wins fold of a log's ``agent/options`` events; never raises.

    The newest event decides, even when it is corrupt: an older valid record is
    never fallen back to. Other event types are ignored.
    """
    last: AgentOptionsEvent | None = None
    try:
        for event in events:
            if isinstance(event, AgentOptionsEvent):
                last = event
        if last is None:
            return OptionsFold(verdict="absent")
        return OptionsFold(verdict="ok", options=_parse(last.payload))
    except _Unsupported as exc:
        return OptionsFold(verdict="unsupported", reason=str(exc)[:300])
    except Exception as exc:  # a projection fold must never raise
        return OptionsFold(verdict="corrupt", reason=str(exc)[:300])
