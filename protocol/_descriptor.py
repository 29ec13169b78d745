"""The versioned ``subagent/descriptor``: snapshot before provider work, fold on load.

A one-shot descriptor carries the provider name, the mode and an optional display
label. A continuable descriptor requires its creation label and records, as
explicit fields, the resolved child ``agent_options.provider``/``model`` plus the
optional ``persona`` and ``tool_filter`` -- everything cold resume needs, and
nothing else: never the merge-extensible agent options object, never the
subagent depth (the header's ``delegation_depth`` is the floor), never an output
schema (an Activation's result contract). :func:`snapshot_subagent_descriptor`
refuses any key it does not record, so an extension value never reaches a payload.

Wire payload (version 1)::

    {"v": 1, "mode": "one-shot", "provider": "local", "label": "..."|None}
    {"v": 1, "mode": "continuable", "provider": "local", "label": "...",
     "agent_options": {"provider": "local", "model": "echo"},
     "persona": "..."|None, "tool_filter": ["a", "b"]|None}

:func:`fold_subagent_descriptor` is last-wins over a log: the newest descriptor is
the identity. A current-version payload that is malformed is *corrupt*
(:class:`DescriptorCorruptError`); any other version is *unsupported*
(:class:`DescriptorUnsupportedError`), which a newer runtime may still read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from ._errors import DescriptorCorruptError, DescriptorInvalidError, DescriptorUnsupportedError
from ._vocabulary import Event, SubagentDescriptorEvent

__all__ = [
    "DESCRIPTOR_VERSION",
    "ContinuableDescriptor",
    "DescriptorFold",
    "OneShotDescriptor",
    "SubagentDescriptor",
    "descriptor_event",
    "descriptor_payload",
    "fold_subagent_descriptor",
    "parse_descriptor_payload",
    "snapshot_subagent_descriptor",
    "try_fold_subagent_descriptor",
]

DESCRIPTOR_VERSION: Final = 1
MAX_LABEL_LEN: Final = 200
MAX_NAME_LEN: Final = 200
MAX_PERSONA_LEN: Final = 64 * 1024
MAX_TOOLS: Final = 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class OneShotDescriptor:
    """Identity of a one-shot child: provider, optional display label."""

    provider: str
    label: str | None = None
    mode: Literal["one-shot"] = "one-shot"


@dataclass(frozen=True, slots=True, kw_only=True)
class ContinuableDescriptor:
    """Identity and the whole cold-resume input of a continuable child."""

    provider: str
    label: str
    agent_provider: str
    model: str
    persona: str | None = None
    tool_filter: tuple[str, ...] | None = None
    mode: Literal["continuable"] = "continuable"


SubagentDescriptor = OneShotDescriptor | ContinuableDescriptor


def _name(value: Any, what: str, err: type[Exception]) -> str:
    if type(value) is not str or not value.strip() or len(value) > MAX_NAME_LEN:
        raise err(f"{what} must be a non-empty str of at most {MAX_NAME_LEN} characters")
    return value


def _label(value: Any, *, required: bool, err: type[Exception]) -> str | None:
    if value is None and not required:
        return None
    if type(value) is not str or not value.strip() or len(value) > MAX_LABEL_LEN:
        what = "a continuable child's label" if required else "label"
        raise err(f"{what} must be a non-empty str of at most {MAX_LABEL_LEN} characters")
    return value


def _persona(value: Any, err: type[Exception]) -> str | None:
    if value is None:
        return None
    if type(value) is not str or len(value) > MAX_PERSONA_LEN:
        raise err(f"persona must be a str of at most {MAX_PERSONA_LEN} characters")
    return value


def _tool_filter(value: Any, err: type[Exception]) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple, frozenset, set)):
        raise err("tool_filter must be a sequence of tool names")
    tools = tuple(value)
    if len(tools) > MAX_TOOLS or not all(type(t) is str and t for t in tools):
        raise err("tool_filter must hold non-empty str tool names")
    # A set has no order; sort it (only once every name is known to be a str).
    return tuple(sorted(tools)) if isinstance(value, (set, frozenset)) else tools


def _keys(keys: set[Any]) -> list[str]:
    """Offending keys for a message; keys of mixed types do not sort."""
    return sorted(repr(k) for k in keys)[:10]


def _from_fields(record: Mapping[str, Any], err: type[Exception]) -> SubagentDescriptor:
    mode = record.get("mode")
    provider = _name(record.get("provider"), "provider", err)
    if mode == "one-shot":
        extra = set(record) - {"mode", "provider", "label", "v"}
        if extra:
            raise err(f"a one-shot descriptor has no field(s) {_keys(extra)}")
        return OneShotDescriptor(
            provider=provider, label=_label(record.get("label"), required=False, err=err)
        )
    if mode == "continuable":
        options = record.get("agent_options")
        if "agent_options" in record and ("agent_provider" in record or "model" in record):
            raise err("give agent_options or agent_provider/model, not both")
        if isinstance(options, Mapping):
            agent_provider, model = options.get("provider"), options.get("model")
        else:
            agent_provider, model = record.get("agent_provider"), record.get("model")
        allowed = {
            "mode",
            "provider",
            "label",
            "v",
            "agent_options",
            "agent_provider",
            "model",
            "persona",
            "tool_filter",
        }
        extra = set(record) - allowed
        if extra:
            raise err(f"a continuable descriptor has no field(s) {_keys(extra)}")
        if isinstance(options, Mapping) and set(options) - {"provider", "model"}:
            raise err("agent_options holds only provider and model")
        label = _label(record.get("label"), required=True, err=err)
        assert label is not None
        return ContinuableDescriptor(
            provider=provider,
            label=label,
            agent_provider=_name(agent_provider, "agent_options.provider", err),
            model=_name(model, "agent_options.model", err),
            persona=_persona(record.get("persona"), err),
            tool_filter=_tool_filter(record.get("tool_filter"), err),
        )
    raise err(f"mode must be 'one-shot' or 'continuable', got {mode!r}"[:200])


def snapshot_subagent_descriptor(
    record: SubagentDescriptor | Mapping[str, Any],
) -> SubagentDescriptor:
    """Validate descriptor input and return a detached, immutable copy.

    Called before any provider work: whatever the caller does with ``record``
    afterwards cannot change the descriptor that is appended.

    ``record`` is a descriptor object or a mapping with ``mode``, ``provider``,
    ``label`` and, for a continuable child, ``agent_options`` (exactly
    ``provider`` and ``model``; or the flat ``agent_provider``/``model``, not
    both), ``persona`` and ``tool_filter``; ``"v"`` may be given and must be
    :data:`DESCRIPTOR_VERSION`. Any other key -- at the top level or inside
    ``agent_options`` -- is refused: callers pass the explicit resolved fields,
    never their merge-extensible agent options, so an unrelated extension value
    can never reach the durable payload (and cannot break cold resume).

    Raises:
        DescriptorInvalidError: the input is not a valid descriptor.
    """
    if isinstance(record, (OneShotDescriptor, ContinuableDescriptor)):
        fields_map: dict[str, Any] = {name: getattr(record, name) for name in record.__slots__}
        if isinstance(record, ContinuableDescriptor):
            fields_map["agent_options"] = {"provider": record.agent_provider, "model": record.model}
            del fields_map["agent_provider"], fields_map["model"]
        return _from_fields(fields_map, DescriptorInvalidError)
    if not isinstance(record, Mapping):
        raise DescriptorInvalidError(f"a descriptor is a mapping, got {type(record).__name__}")
    if "v" in record and (type(record["v"]) is not int or record["v"] != DESCRIPTOR_VERSION):
        raise DescriptorInvalidError(
            f"descriptor version {record['v']!r} is not {DESCRIPTOR_VERSION}"[:200]
        )
    return _from_fields(record, DescriptorInvalidError)


def descriptor_payload(descriptor: SubagentDescriptor) -> dict[str, Any]:
    """The version-stamped wire payload of a (snapshotted) descriptor."""
    if isinstance(descriptor, OneShotDescriptor):
        return {
            "v": DESCRIPTOR_VERSION,
            "mode": "one-shot",
            "provider": descriptor.provider,
            "label": descriptor.label,
        }
    return {
        "v": DESCRIPTOR_VERSION,
        "mode": "continuable",
        "provider": descriptor.provider,
        "label": descriptor.label,
        "agent_options": {"provider": descriptor.agent_provider, "model": descriptor.model},
        "persona": descriptor.persona,
        "tool_filter": list(descriptor.tool_filter) if descriptor.tool_filter is not None else None,
    }


def descriptor_event(descriptor: SubagentDescriptor) -> SubagentDescriptorEvent:
    """The ``subagent/descriptor`` log event for ``descriptor``."""
    return SubagentDescriptorEvent(payload=descriptor_payload(descriptor))


def parse_descriptor_payload(payload: Any) -> SubagentDescriptor:
    """Classify one stored payload.

    Raises:
        DescriptorUnsupportedError: the payload's version is not this runtime's.
        DescriptorCorruptError: a current-version payload that is malformed.
    """
    if not isinstance(payload, Mapping):
        raise DescriptorCorruptError("descriptor payload is not a map")
    version = payload.get("v")
    if version != DESCRIPTOR_VERSION or type(version) is not int:
        if type(version) is int:
            raise DescriptorUnsupportedError(
                f"descriptor version {version} is not supported by this runtime"
            )
        raise DescriptorCorruptError(f"descriptor version must be an int, got {version!r}"[:200])
    if payload.get("mode") == "one-shot" and payload.keys() - {"v", "mode", "provider", "label"}:
        raise DescriptorCorruptError("one-shot descriptor carries unknown fields")
    if payload.get("mode") == "continuable":
        if payload.keys() - {
            "v",
            "mode",
            "provider",
            "label",
            "agent_options",
            "persona",
            "tool_filter",
        }:
            raise DescriptorCorruptError("continuable descriptor carries unknown fields")
        if not isinstance(payload.get("agent_options"), Mapping):
            raise DescriptorCorruptError("continuable descriptor needs agent_options")
        if payload.get("tool_filter") is not None and not isinstance(
            payload.get("tool_filter"), list
        ):
            raise DescriptorCorruptError("tool_filter must be an array")
    return _from_fields(payload, DescriptorCorruptError)


@dataclass(frozen=True, slots=True, kw_only=True)
class DescriptorFold:
    """Result of :func:`try_fold_subagent_descriptor`; never an exception.

    ``verdict`` is ``"ok"`` (``descriptor`` set), ``"absent"`` (no descriptor
    event), ``"corrupt"`` or ``"unsupported"``; ``index`` is the position of the
    deciding event in the folded sequence (``None`` when absent).
    """

    verdict: Literal["ok", "absent", "corrupt", "unsupported"]
    descriptor: SubagentDescriptor | None = None
    index: int | None = None
    reason: str | None = None


def try_fold_subagent_descriptor(events: Iterable[Event]) -> DescriptorFold:
    """Last-wins fold over a log that never raises (for projections)."""
    last: SubagentDescriptorEvent | None = None
    last_index: int | None = None
    try:
        for index, event in enumerate(events):
            if isinstance(event, SubagentDescriptorEvent):
                last, last_index = event, index
        if last is None:
            return DescriptorFold(verdict="absent")
        return DescriptorFold(
            verdict="ok", descriptor=parse_descriptor_payload(last.payload), index=last_index
        )
    except DescriptorUnsupportedError as exc:
        return DescriptorFold(verdict="unsupported", index=last_index, reason=str(exc))
    except Exception as exc:  # the projection fold must never raise
        return DescriptorFold(verdict="corrupt", index=last_index, reason=str(exc)[:300])


def fold_subagent_descriptor(events: Iterable[Event]) -> SubagentDescriptor | None:
    """The current descriptor of a loaded log (last wins), ``None`` if absent.

    Raises:
        DescriptorCorruptError: the newest descriptor is a malformed current version.
        DescriptorUnsupportedError: the newest descriptor has an unknown version.
    """
    last: SubagentDescriptorEvent | None = None
    for event in events:
        if isinstance(event, SubagentDescriptorEvent):
            last = event
    return None if last is None else parse_descriptor_payload(last.payload)
