"""The durable ``agent/options`` of a top-level agent: event, codec, fold.

Issue 13 point 7 (durable ownership): a top-level agent's log records the options
it was spawned with, so a new process can resume it without being given its model
again. The record is a versioned raw payload, folded last-wins and classified
``ok`` / ``absent`` / ``corrupt`` / ``unsupported`` like ``subagent/descriptor``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from protocol_strategies import json_trees, strict_eq
from protocol_vectors import AGENT_OPTIONS, AGENT_OPTIONS_MINIMAL, VECTORS_DIR
from subagents.protocol import (
    AGENT_OPTIONS_VERSION,
    EVENT_TYPES,
    AgentOptionsEvent,
    DecodeError,
    EncodeError,
    ErrorCode,
    Event,
    MessageEvent,
    MessageId,
    OptionsFold,
    RecordedOptions,
    SubagentDescriptorEvent,
    SubagentError,
    agent_options_event,
    decode_event,
    encode_event,
    event_from_wire,
    fold_agent_options,
    packb,
)

MID = MessageId("0123456789abcdef0123456789abcdef")
PAYLOAD_KEYS = {"v", "model", "provider", "persona", "tool_filter"}

names = st.text(min_size=1, max_size=40).filter(str.strip)
recorded_options = st.builds(
    RecordedOptions,
    model=names,
    provider=st.none() | names,
    persona=st.none() | st.text(max_size=60),
    tool_filter=st.none() | st.lists(st.text(min_size=1, max_size=12), max_size=6).map(tuple),
)


def _payload(**overrides: Any) -> dict[str, Any]:
    payload = dict(agent_options_event(AGENT_OPTIONS).payload)
    payload.update(overrides)
    return {k: v for k, v in payload.items() if v is not _DROP}


_DROP = object()


# -- the event and its payload --------------------------------------------------------


def test_the_event_is_registered_under_its_wire_name() -> None:
    """Issue 13 point 7 (durable ownership): ``agent/options`` is a known log event."""
    assert AgentOptionsEvent.type == "agent/options"
    assert EVENT_TYPES["agent/options"] is AgentOptionsEvent
    assert AgentOptionsEvent().payload == {}


def test_payload_records_every_field_with_the_version() -> None:
    """Issue 13 point 7 (durable ownership): the documented version-1 payload, exactly."""
    assert agent_options_event(AGENT_OPTIONS).payload == {
        "v": 1,
        "model": "echo",
        "provider": "scripted",
        "persona": "A careful reviewer.",
        "tool_filter": ["read_file", "search"],
    }
    assert AGENT_OPTIONS_VERSION == 1
    minimal = agent_options_event(AGENT_OPTIONS_MINIMAL).payload
    assert minimal == {
        "v": 1,
        "model": "echo",
        "provider": None,
        "persona": None,
        "tool_filter": None,
    }


def test_payload_is_fresh_and_options_are_immutable() -> None:
    """Issue 13 point 7 (durable ownership): nothing the caller holds is shared."""
    tools = ["read", "grep"]
    options = RecordedOptions(model="m", tool_filter=tools)  # type: ignore[arg-type]
    event = agent_options_event(options)
    tools.append("rm")
    assert event.payload["tool_filter"] == ["read", "grep"]
    event.payload["tool_filter"].append("x")
    assert agent_options_event(AGENT_OPTIONS).payload["tool_filter"] == ["read_file", "search"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        AGENT_OPTIONS.model = "other"  # type: ignore[misc]


def test_an_empty_tool_filter_is_set_not_unrestricted() -> None:
    """Issue 13 point 7 (durable ownership): ``()`` means "no tools" and survives the log."""
    event = agent_options_event(RecordedOptions(model="m", tool_filter=()))
    assert event.payload["tool_filter"] == []
    result = fold_agent_options([decode_event(encode_event(event))])
    assert result.options == RecordedOptions(model="m", tool_filter=())


# -- validation -------------------------------------------------------------------------

INVALID: dict[str, Any] = {
    "not options": {"model": "echo"},
    "none": None,
    "empty model": RecordedOptions(model=""),
    "blank model": RecordedOptions(model="  "),
    "model not str": RecordedOptions(model=3),  # type: ignore[arg-type]
    "model too long": RecordedOptions(model="m" * 201),
    "empty provider": RecordedOptions(model="m", provider=""),
    "provider not str": RecordedOptions(model="m", provider=["p"]),  # type: ignore[arg-type]
    "provider too long": RecordedOptions(model="m", provider="p" * 201),
    "persona not str": RecordedOptions(model="m", persona=b"x"),  # type: ignore[arg-type]
    "persona too long": RecordedOptions(model="m", persona="x" * (64 * 1024 + 1)),
    "tool_filter a str": RecordedOptions(model="m", tool_filter="read"),  # type: ignore[arg-type]
    "tool_filter a set": RecordedOptions(model="m", tool_filter={"a"}),  # type: ignore[arg-type]
    "tool_filter a map": RecordedOptions(model="m", tool_filter={"a": 1}),  # type: ignore[arg-type]
    "tool_filter of ints": RecordedOptions(model="m", tool_filter=(1,)),  # type: ignore[arg-type]
    "tool_filter empty name": RecordedOptions(model="m", tool_filter=("a", "")),
    "tool_filter too long": RecordedOptions(model="m", tool_filter=("t",) * 1025),
}


@pytest.mark.parametrize("options", INVALID.values(), ids=INVALID.keys())
def test_invalid_options_raise_invalid_argument(options: Any) -> None:
    """Issue 13 point 7 (durable ownership): bad input is a typed SubagentError, nothing else."""
    with pytest.raises(SubagentError) as info:
        agent_options_event(options)
    assert type(info.value) is SubagentError
    assert info.value.code == ErrorCode.INVALID_ARGUMENT == "INVALID_ARGUMENT"


def test_the_bounds_themselves_are_accepted() -> None:
    """Issue 13 point 7 (durable ownership): the limits are inclusive."""
    options = RecordedOptions(
        model="m" * 200,
        provider="p" * 200,
        persona="x" * (64 * 1024),
        tool_filter=("t",) * 1024,
    )
    assert fold_agent_options([agent_options_event(options)]).options == options


# -- the codec ----------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(options=recorded_options)
def test_round_trip_through_the_codec_gives_every_field_back(options: RecordedOptions) -> None:
    """Issue 13 point 7 (durable ownership): event, encode, decode, fold: the same options."""
    event = agent_options_event(options)
    decoded = decode_event(encode_event(event))
    assert isinstance(decoded, AgentOptionsEvent)
    assert strict_eq(decoded, event)
    assert set(decoded.payload) == PAYLOAD_KEYS
    result = fold_agent_options([decoded])
    assert result.verdict == "ok"
    assert result.reason is None
    assert strict_eq(result.options, options)


def test_the_decoder_wants_a_payload_map() -> None:
    """Issue 13 point 7 (durable ownership): the codec checks the envelope, not the payload."""
    with pytest.raises(DecodeError):
        event_from_wire({"type": "agent/options"})
    with pytest.raises(DecodeError):
        event_from_wire({"type": "agent/options", "payload": ["echo"]})
    with pytest.raises(EncodeError):
        encode_event(AgentOptionsEvent(payload=["echo"]))  # type: ignore[arg-type]
    # A malformed or future payload is stored as is; the fold classifies it.
    raw = {"v": 1, "model": 7, "x": {"nested": [1]}}
    stored = decode_event(packb({"type": "agent/options", "payload": raw}))
    assert isinstance(stored, AgentOptionsEvent)
    assert stored.payload == raw
    assert fold_agent_options([stored]).verdict == "corrupt"


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("event_agent_options", OptionsFold(verdict="ok", options=AGENT_OPTIONS)),
        ("event_agent_options_minimal", OptionsFold(verdict="ok", options=AGENT_OPTIONS_MINIMAL)),
    ],
)
def test_golden_vectors_fold_to_their_options(name: str, expected: OptionsFold) -> None:
    """Issue 13 point 7 (durable ownership): the committed bytes read back as options."""
    event = decode_event((VECTORS_DIR / f"{name}.msgpack").read_bytes())
    assert strict_eq(fold_agent_options([event]), expected)


def test_golden_future_version_vector_is_unsupported() -> None:
    """Issue 13 point 7 (durable ownership): a newer record is stored and told apart."""
    data = (VECTORS_DIR / "event_agent_options_future_version.msgpack").read_bytes()
    result = fold_agent_options([decode_event(data)])
    assert (result.verdict, result.options) == ("unsupported", None)


# -- the fold -----------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(choices=st.lists(recorded_options, min_size=1, max_size=4), noise=st.integers(0, 3))
def test_fold_is_last_wins_and_ignores_other_events(
    choices: list[RecordedOptions], noise: int
) -> None:
    """Issue 13 point 7 (durable ownership): the newest ``agent/options`` decides."""
    log: list[Event] = []
    for options in choices:
        log.extend(MessageEvent(message_id=MID, content=i) for i in range(noise))
        log.append(agent_options_event(options))
    log.append(SubagentDescriptorEvent(payload={"v": 1, "mode": "one-shot", "provider": "p"}))
    result = fold_agent_options(iter(log))
    assert result.verdict == "ok"
    assert strict_eq(result.options, choices[-1])


def test_fold_without_the_event_is_absent() -> None:
    """Issue 13 point 7 (durable ownership): no ``agent/options`` is ``absent``."""
    for log in ([], [MessageEvent(message_id=MID, content="hi")]):
        assert fold_agent_options(log) == OptionsFold(verdict="absent")


def test_a_corrupt_newest_record_is_not_papered_over() -> None:
    """Issue 13 point 7 (durable ownership): no fallback to an older valid record."""
    good = agent_options_event(AGENT_OPTIONS)
    bad = AgentOptionsEvent(payload={"v": 1})
    result = fold_agent_options([good, bad])
    assert (result.verdict, result.options) == ("corrupt", None)
    assert result.reason
    assert fold_agent_options([bad, good]).options == AGENT_OPTIONS


CORRUPT: dict[str, Any] = {
    "not a map": [1, "echo"],
    "empty": {},
    "no version": _payload(v=_DROP),
    "str version": _payload(v="1"),
    "float version": _payload(v=1.0),
    "bool version": _payload(v=True),
    "null version": _payload(v=None),
    "no model": _payload(model=_DROP),
    "empty model": _payload(model=""),
    "model not str": _payload(model=1),
    "model too long": _payload(model="m" * 201),
    "empty provider": _payload(provider=""),
    "provider not str": _payload(provider=2),
    "persona not str": _payload(persona=3),
    "tool_filter a str": _payload(tool_filter="read"),
    "tool_filter a map": _payload(tool_filter={"read": True}),
    "tool_filter of ints": _payload(tool_filter=[1]),
    "tool_filter empty name": _payload(tool_filter=[""]),
    "unknown field": _payload(extra=1),
    "nested options object": _payload(agent_options={"model": "echo"}),
    "mixed-type unknown keys": _payload(z=1) | {3: "x"},
}


@pytest.mark.parametrize("payload", CORRUPT.values(), ids=CORRUPT.keys())
def test_malformed_current_version_payloads_are_corrupt(payload: Any) -> None:
    """Issue 13 point 7 (durable ownership): a malformed version-1 record is ``corrupt``."""
    result = fold_agent_options([AgentOptionsEvent(payload=payload)])
    assert (result.verdict, result.options) == ("corrupt", None)
    assert result.reason


def test_missing_optional_fields_read_as_unset() -> None:
    """Issue 13 point 7 (durable ownership): only ``v`` and ``model`` are required."""
    result = fold_agent_options([AgentOptionsEvent(payload={"v": 1, "model": "echo"})])
    assert result == OptionsFold(verdict="ok", options=RecordedOptions(model="echo"))


@pytest.mark.parametrize("version", [0, 3, 4, -1, 2**40])
@pytest.mark.parametrize(
    "rest", [{}, {"model": "echo"}, {"model": 7, "anything": [1, 2]}], ids=["bare", "v1", "future"]
)
def test_unknown_versions_are_unsupported_not_corrupt(version: int, rest: dict[str, Any]) -> None:
    """Issue 13 point 7 (durable ownership): another int version is ``unsupported``."""
    result = fold_agent_options([AgentOptionsEvent(payload={"v": version, **rest})])
    assert (result.verdict, result.options) == ("unsupported", None)
    assert result.reason and str(version) in result.reason


payload_maps = st.one_of(
    st.dictionaries(
        st.one_of(st.sampled_from(sorted(PAYLOAD_KEYS)), st.text(max_size=6), st.integers()),
        st.one_of(json_trees, st.sampled_from([1, 2, "", " ", "echo"])),
        max_size=6,
    ),
    st.builds(
        lambda d, v: {**d, "v": v}, st.dictionaries(st.text(max_size=6), json_trees), json_trees
    ),
    json_trees,
)


@settings(max_examples=200, deadline=None)
@given(payloads=st.lists(payload_maps, min_size=1, max_size=3))
def test_fold_never_raises_and_classifies_by_the_newest(payloads: list[Any]) -> None:
    """Issue 13 point 7 (durable ownership): any payload gets a consistent verdict."""
    result = fold_agent_options([AgentOptionsEvent(payload=p) for p in payloads])
    last = payloads[-1]
    version = last.get("v") if isinstance(last, dict) else None
    if type(version) is int and version not in (1, 2):
        assert result.verdict == "unsupported"
    elif result.verdict == "ok":
        assert result.options is not None
        assert result.reason is None
        # A valid record re-encodes to the same options.
        assert fold_agent_options([agent_options_event(result.options)]) == result
    else:
        assert result.verdict == "corrupt"
        assert result.options is None
        assert result.reason


def test_a_failing_log_iterator_is_reported_not_raised() -> None:
    """Issue 13 point 7 (durable ownership): the fold never raises, even when reading fails."""

    def log() -> Iterator[Event]:
        yield agent_options_event(AGENT_OPTIONS)
        raise OSError("disk gone")

    result = fold_agent_options(log())
    assert result.verdict == "corrupt"
    assert result.reason is not None
    assert "disk gone" in result.reason


@settings(max_examples=150, deadline=None)
@given(
    model=json_trees | names,
    provider=json_trees | names,
    persona=json_trees,
    tool_filter=json_trees | st.lists(names, max_size=3),
)
def test_any_input_is_accepted_whole_or_refused_as_invalid_argument(
    model: Any, provider: Any, persona: Any, tool_filter: Any
) -> None:
    """Issue 13 point 7 (durable ownership): what is accepted is what the fold gives back."""
    options = RecordedOptions(
        model=model, provider=provider, persona=persona, tool_filter=tool_filter
    )
    try:
        event = agent_options_event(options)
    except SubagentError as exc:
        assert exc.code == ErrorCode.INVALID_ARGUMENT
        return
    result = fold_agent_options([decode_event(encode_event(event))])
    assert result.verdict == "ok"
    assert result.options == dataclasses.replace(
        options, tool_filter=None if tool_filter is None else tuple(tool_filter)
    )


def test_an_output_schema_is_recorded_only_when_set() -> None:
    """A top-level agent's output schema is recorded with its options (a fresh copy)
    and read back, in a version-2 record (a runtime from before reads it as
    unsupported, not corrupt); without one the payload is the version-1 one older
    runtimes wrote (where the field is unknown: corrupt, as before), and a schema
    that is not a map with str keys is refused, and folds as corrupt."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    event = agent_options_event(RecordedOptions(model="m", output_schema=schema))
    assert event.payload["output_schema"] == schema and event.payload["v"] == 2
    schema["properties"]["n"]["type"] = "string"
    assert event.payload["output_schema"]["properties"]["n"] == {"type": "integer"}
    folded = fold_agent_options([decode_event(encode_event(event))])
    assert folded.verdict == "ok" and folded.options is not None
    assert folded.options.output_schema == {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
    }
    plain = agent_options_event(RecordedOptions(model="m")).payload
    assert "output_schema" not in plain and plain["v"] == 1
    v1 = AgentOptionsEvent(payload={**plain, "output_schema": {"type": "object"}})
    assert fold_agent_options([v1]).verdict == "corrupt"
    with pytest.raises(SubagentError) as info:
        agent_options_event(RecordedOptions(model="m", output_schema=["x"]))  # type: ignore[arg-type]
    assert info.value.code == ErrorCode.INVALID_ARGUMENT
    bad = AgentOptionsEvent(payload={"v": 2, "model": "m", "output_schema": {1: "x"}})
    assert fold_agent_options([bad]).verdict == "corrupt"
