"""The durable ``subagent/descriptor``: snapshot, payload, fold (R-DESC-2..6, 9..11).

Contract for unrelated extension values (R-DESC-5), as the code decides it:
:func:`snapshot_subagent_descriptor` takes only the fields it records, and refuses
with :class:`DescriptorInvalidError` any other key -- at the top level of the
record or inside ``agent_options`` (which holds exactly ``provider`` and
``model``). A caller therefore extracts those explicit fields from its
merge-extensible agent options; it never passes the options object. The payload
can then never hold an extension value, and a stored current-version payload
that does hold one is *corrupt*.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from protocol_strategies import json_trees, strict_eq
from subagents.protocol import (
    DESCRIPTOR_VERSION,
    ContinuableDescriptor,
    DescriptorCorruptError,
    DescriptorInvalidError,
    DescriptorUnsupportedError,
    Event,
    MessageEvent,
    MessageId,
    OneShotDescriptor,
    SubagentDescriptor,
    SubagentDescriptorEvent,
    SubagentError,
    decode_event,
    descriptor_event,
    descriptor_payload,
    encode_event,
    fold_subagent_descriptor,
    parse_descriptor_payload,
    snapshot_subagent_descriptor,
    try_fold_subagent_descriptor,
)

MID = MessageId("0123456789abcdef0123456789abcdef")
ONE_SHOT_KEYS = {"v", "mode", "provider", "label"}
CONTINUABLE_KEYS = {"v", "mode", "provider", "label", "agent_options", "persona", "tool_filter"}
FORBIDDEN_KEYS = {"subagent_depth", "subagentDepth", "output_schema", "outputSchema", "schema"}


def continuable_record(**overrides: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "mode": "continuable",
        "provider": "local",
        "label": "reviewer",
        "agent_options": {"provider": "scripted", "model": "echo"},
        "persona": "terse",
        "tool_filter": ["read", "grep"],
    }
    record.update(overrides)
    return record


def one_shot_record(**overrides: Any) -> dict[str, Any]:
    record: dict[str, Any] = {"mode": "one-shot", "provider": "local", "label": "summary"}
    record.update(overrides)
    return record


# -- strategies ------------------------------------------------------------------------

names = st.text(min_size=1, max_size=40).filter(str.strip)
tool_lists = st.lists(st.text(min_size=1, max_size=12), max_size=6)


@st.composite
def one_shot_inputs(draw: st.DrawFn) -> tuple[dict[str, Any], OneShotDescriptor]:
    provider = draw(names)
    record: dict[str, Any] = {"mode": "one-shot", "provider": provider}
    label = draw(st.none() | names)
    if label is not None or draw(st.booleans()):
        record["label"] = label
    if draw(st.booleans()):
        record["v"] = DESCRIPTOR_VERSION
    return record, OneShotDescriptor(provider=provider, label=label)


@st.composite
def continuable_inputs(draw: st.DrawFn) -> tuple[dict[str, Any], ContinuableDescriptor]:
    provider, label, agent_provider, model = (draw(names) for _ in range(4))
    persona = draw(st.none() | st.text(max_size=60))
    tools = draw(st.none() | tool_lists)
    record: dict[str, Any] = {"mode": "continuable", "provider": provider, "label": label}
    if draw(st.booleans()):
        record["agent_options"] = {"provider": agent_provider, "model": model}
    else:  # the flat spelling snapshot also accepts
        record["agent_provider"], record["model"] = agent_provider, model
    if persona is not None or draw(st.booleans()):
        record["persona"] = persona
    if tools is not None or draw(st.booleans()):
        record["tool_filter"] = tools
    expected = ContinuableDescriptor(
        provider=provider,
        label=label,
        agent_provider=agent_provider,
        model=model,
        persona=persona,
        tool_filter=None if tools is None else tuple(tools),
    )
    return record, expected


valid_inputs = st.one_of(one_shot_inputs(), continuable_inputs())

FIELD_NAMES = [
    "v",
    "mode",
    "provider",
    "label",
    "agent_options",
    "agent_provider",
    "model",
    "persona",
    "tool_filter",
    "subagent_depth",
    "output_schema",
]
field_values = st.one_of(
    json_trees,
    st.sampled_from(["one-shot", "continuable", 1, 2, "", " "]),
    st.frozensets(st.one_of(st.integers(), st.text(max_size=3)), max_size=3),
    st.dictionaries(st.sampled_from(["provider", "model", "x"]), json_trees, max_size=3),
    st.lists(st.one_of(st.text(max_size=5), st.integers()), max_size=3),
)
arbitrary_records = st.dictionaries(
    st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=8), st.integers()),
    field_values,
    max_size=8,
)


# -- R-DESC-2: snapshot validates and detaches -------------------------------------------


def test_snapshot_detaches_from_the_input_mapping() -> None:
    """R-DESC-2: mutating the record, its options or its tool list changes nothing."""
    record = continuable_record()
    snap = snapshot_subagent_descriptor(record)
    payload_before = descriptor_payload(snap)
    record["label"] = "changed"
    record["agent_options"]["model"] = "other"
    record["agent_options"]["extension"] = object()
    record["tool_filter"].append("rm")
    record["persona"] = "loud"
    record["mode"] = "one-shot"
    assert snap == ContinuableDescriptor(
        provider="local",
        label="reviewer",
        agent_provider="scripted",
        model="echo",
        persona="terse",
        tool_filter=("read", "grep"),
    )
    assert descriptor_payload(snap) == payload_before


def test_snapshot_is_immutable_and_payloads_are_fresh() -> None:
    """R-DESC-2: the snapshot is frozen; each payload is a new map nobody else holds."""
    snap = snapshot_subagent_descriptor(continuable_record())
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.label = "x"  # type: ignore[misc]
    assert isinstance(snap, ContinuableDescriptor)
    assert isinstance(snap.tool_filter, tuple)
    payload = descriptor_payload(snap)
    payload["agent_options"]["model"] = "other"
    payload["tool_filter"].append("rm")
    assert descriptor_payload(snap)["agent_options"]["model"] == "echo"
    assert descriptor_payload(snap)["tool_filter"] == ["read", "grep"]


def test_snapshot_of_a_descriptor_object_is_validated_too() -> None:
    """R-DESC-2: an already-built descriptor is re-validated, not trusted."""
    good = OneShotDescriptor(provider="local")
    assert snapshot_subagent_descriptor(good) == good
    with pytest.raises(DescriptorInvalidError):
        snapshot_subagent_descriptor(OneShotDescriptor(provider=""))
    with pytest.raises(DescriptorInvalidError):
        snapshot_subagent_descriptor(
            ContinuableDescriptor(provider="local", label="", agent_provider="p", model="m")
        )
    listy = ContinuableDescriptor(
        provider="local",
        label="l",
        agent_provider="p",
        model="m",
        tool_filter=["a"],  # type: ignore[arg-type]
    )
    snap = snapshot_subagent_descriptor(listy)
    assert isinstance(snap, ContinuableDescriptor)
    assert snap.tool_filter == ("a",)


def test_payload_and_event_carry_the_version() -> None:
    """R-DESC-2: the descriptor event carries a version."""
    for record in (one_shot_record(), continuable_record()):
        event = descriptor_event(snapshot_subagent_descriptor(record))
        assert event.type == "subagent/descriptor"
        assert event.payload["v"] == DESCRIPTOR_VERSION == 1


INVALID_RECORDS: dict[str, Any] = {
    "not a mapping": ["mode", "one-shot"],
    "none": None,
    "str": "one-shot",
    "empty": {},
    "no mode": {"provider": "local"},
    "unknown mode": one_shot_record(mode="forked"),
    "no provider": {"mode": "one-shot"},
    "empty provider": one_shot_record(provider=""),
    "blank provider": one_shot_record(provider="   "),
    "provider not str": one_shot_record(provider=3),
    "provider too long": one_shot_record(provider="p" * 201),
    "one-shot empty label": one_shot_record(label=""),
    "one-shot label not str": one_shot_record(label=["x"]),
    "one-shot label too long": one_shot_record(label="l" * 201),
    "one-shot with agent options": one_shot_record(agent_options={"provider": "p", "model": "m"}),
    "one-shot with persona": one_shot_record(persona="x"),
    "wrong version": one_shot_record(v=2),
    "bool version": one_shot_record(v=True),
    "float version": one_shot_record(v=1.0),
    "no agent options": {k: v for k, v in continuable_record().items() if k != "agent_options"},
    "agent options not a map": continuable_record(agent_options=["scripted", "echo"]),
    "no model": continuable_record(agent_options={"provider": "scripted"}),
    "empty model": continuable_record(agent_options={"provider": "scripted", "model": ""}),
    "model not str": continuable_record(agent_options={"provider": "scripted", "model": 1}),
    "both spellings": continuable_record(agent_provider="scripted", model="other"),
    "persona not str": continuable_record(persona=["terse"]),
    "tool_filter is a str": continuable_record(tool_filter="read"),
    "tool_filter of ints": continuable_record(tool_filter=[1, 2]),
    "tool_filter with empty name": continuable_record(tool_filter=["read", ""]),
    "tool_filter of mixed set": continuable_record(tool_filter={1, "read"}),
    "tool_filter a map": continuable_record(tool_filter={"read": True}),
    "mixed-type unknown keys": one_shot_record(z=1) | {3: "x"},
}


@pytest.mark.parametrize("record", INVALID_RECORDS.values(), ids=INVALID_RECORDS.keys())
def test_invalid_records_raise_descriptor_invalid_error(record: Any) -> None:
    """R-DESC-2: invalid input is refused with DescriptorInvalidError, nothing else."""
    with pytest.raises(DescriptorInvalidError) as info:
        snapshot_subagent_descriptor(record)
    assert info.value.code == "DESCRIPTOR_INVALID"
    assert isinstance(info.value, ValueError)


@settings(max_examples=150, deadline=None)
@given(record=arbitrary_records)
def test_snapshot_of_anything_returns_a_descriptor_or_raises_invalid(record: Any) -> None:
    """R-DESC-2: whatever the input, the only failure is DescriptorInvalidError."""
    try:
        snap = snapshot_subagent_descriptor(record)
    except DescriptorInvalidError:
        return
    assert isinstance(snap, (OneShotDescriptor, ContinuableDescriptor))
    assert parse_descriptor_payload(descriptor_payload(snap)) == snap


# -- R-DESC-3: a continuable child needs its label ---------------------------------------


@pytest.mark.parametrize("label", [None, "", "  \t", 0, b"label"], ids=repr)
def test_continuable_requires_a_non_empty_label(label: Any) -> None:
    """R-DESC-3: no (or an empty) creation label refuses a continuable descriptor."""
    with pytest.raises(DescriptorInvalidError):
        snapshot_subagent_descriptor(continuable_record(label=label))
    without = {k: v for k, v in continuable_record().items() if k != "label"}
    with pytest.raises(DescriptorInvalidError):
        snapshot_subagent_descriptor(without)


def test_one_shot_label_is_optional() -> None:
    """R-DESC-3 (contrast): a one-shot descriptor may omit its display label."""
    snap = snapshot_subagent_descriptor({"mode": "one-shot", "provider": "local"})
    assert snap == OneShotDescriptor(provider="local", label=None)
    assert descriptor_payload(snap)["label"] is None


# -- R-DESC-4: explicit resolved fields ---------------------------------------------------


def test_continuable_payload_records_explicit_resolved_fields() -> None:
    """R-DESC-4: agent_options.provider/model are explicit; persona, tool_filter when set."""
    payload = descriptor_payload(snapshot_subagent_descriptor(continuable_record()))
    assert payload == {
        "v": 1,
        "mode": "continuable",
        "provider": "local",
        "label": "reviewer",
        "agent_options": {"provider": "scripted", "model": "echo"},
        "persona": "terse",
        "tool_filter": ["read", "grep"],
    }


def test_unset_persona_and_tool_filter_are_recorded_as_unset() -> None:
    """R-DESC-4: persona and tool_filter are recorded only when set (None otherwise)."""
    record = continuable_record()
    del record["persona"], record["tool_filter"]
    snap = snapshot_subagent_descriptor(record)
    assert isinstance(snap, ContinuableDescriptor)
    assert (snap.persona, snap.tool_filter) == (None, None)
    payload = descriptor_payload(snap)
    assert (payload["persona"], payload["tool_filter"]) == (None, None)
    # An empty tool filter is set: "no tools", not "unrestricted".
    empty = snapshot_subagent_descriptor(continuable_record(tool_filter=[]))
    assert isinstance(empty, ContinuableDescriptor)
    assert empty.tool_filter == ()
    assert fold_subagent_descriptor([descriptor_event(empty)]) == empty


def test_flat_and_nested_agent_option_spellings_agree() -> None:
    """R-DESC-4: ``agent_provider``/``model`` at the top level mean the same thing."""
    record = continuable_record()
    del record["agent_options"]
    record.update(agent_provider="scripted", model="echo")
    assert snapshot_subagent_descriptor(record) == snapshot_subagent_descriptor(
        continuable_record()
    )


def test_a_set_tool_filter_is_recorded_in_a_stable_order() -> None:
    """R-DESC-4: a set has no order; the descriptor sorts it so payloads are stable."""
    snap = snapshot_subagent_descriptor(continuable_record(tool_filter={"b", "a", "c"}))
    assert isinstance(snap, ContinuableDescriptor)
    assert snap.tool_filter == ("a", "b", "c")


# -- R-DESC-5: no merge-extensible options -------------------------------------------------


@pytest.mark.parametrize(
    "record",
    [
        continuable_record(
            agent_options={"provider": "scripted", "model": "echo", "x_plugin": {"k": 1}}
        ),
        continuable_record(agent_options={"provider": "scripted", "model": "echo", "temp": 0.2}),
        continuable_record(x_plugin=True),
        one_shot_record(x_plugin=True),
        continuable_record(agent_options={"provider": "p", "model": "m", "persona": "nested"}),
    ],
    ids=["options extension", "options temperature", "top level", "one-shot top level", "nested"],
)
def test_extension_values_are_refused_by_snapshot(record: dict[str, Any]) -> None:
    """R-DESC-5: an extension value never reaches the descriptor -- snapshot refuses it.

    The caller passes the explicit fields, never its agent options object.
    """
    with pytest.raises(DescriptorInvalidError):
        snapshot_subagent_descriptor(record)


@settings(max_examples=150, deadline=None)
@given(case=valid_inputs, key=st.text(max_size=10), value=json_trees)
def test_an_extra_key_anywhere_is_refused(
    case: tuple[dict[str, Any], SubagentDescriptor], key: str, value: Any
) -> None:
    """R-DESC-5: any key beyond the recorded fields, top level or in agent_options, is refused."""
    record, _ = case
    extended = copy.deepcopy(record)
    target = extended.get("agent_options", extended) if len(key) % 2 else extended
    known = {"provider", "model"} if target is not extended else {*FIELD_NAMES[:9]}
    if key in known:
        return
    target[key] = value
    with pytest.raises(DescriptorInvalidError):
        snapshot_subagent_descriptor(extended)


def test_stored_payload_with_an_extension_value_is_corrupt() -> None:
    """R-DESC-5: version 1 is fully specified; an extension value in storage is corrupt."""
    payload = descriptor_payload(snapshot_subagent_descriptor(continuable_record()))
    payload["agent_options"]["x_plugin"] = 1
    with pytest.raises(DescriptorCorruptError):
        parse_descriptor_payload(payload)


# -- R-DESC-6: no depth, no output schema --------------------------------------------------


@pytest.mark.parametrize("key", sorted(FORBIDDEN_KEYS))
@pytest.mark.parametrize("make", [one_shot_record, continuable_record], ids=["one-shot", "cont"])
def test_depth_and_output_schema_are_refused_as_input(key: str, make: Any) -> None:
    """R-DESC-6: subagent_depth and an output schema cannot enter a descriptor."""
    with pytest.raises(DescriptorInvalidError):
        snapshot_subagent_descriptor(make(**{key: 1}))


@settings(max_examples=150, deadline=None)
@given(case=valid_inputs)
def test_payload_keys_are_exactly_the_documented_ones(
    case: tuple[dict[str, Any], SubagentDescriptor],
) -> None:
    """R-DESC-6: payloads hold no subagent_depth and no output schema, at any level."""
    record, _ = case
    payload = descriptor_payload(snapshot_subagent_descriptor(record))
    expected = CONTINUABLE_KEYS if payload["mode"] == "continuable" else ONE_SHOT_KEYS
    assert set(payload) == expected
    if "agent_options" in payload:
        assert set(payload["agent_options"]) == {"provider", "model"}
    for stored in (payload, payload.get("agent_options", {})):
        assert not FORBIDDEN_KEYS & set(stored)


def test_forbidden_keys_in_a_stored_payload_are_corrupt() -> None:
    """R-DESC-6: reading is as strict as writing."""
    for key in ("subagent_depth", "output_schema"):
        for record in (one_shot_record(), continuable_record()):
            payload = descriptor_payload(snapshot_subagent_descriptor(record))
            payload[key] = 1
            with pytest.raises(DescriptorCorruptError):
                parse_descriptor_payload(payload)


# -- R-DESC-9: snapshot -> payload -> event -> bytes -> fold gives every field back ----------


@settings(max_examples=200, deadline=None)
@given(case=valid_inputs)
def test_round_trip_through_the_log_gives_every_field_back(
    case: tuple[dict[str, Any], SubagentDescriptor],
) -> None:
    """R-DESC-9: snapshot, event, encode, decode, fold: the expected descriptor, field by field."""
    record, expected = case
    snap = snapshot_subagent_descriptor(record)
    assert strict_eq(snap, expected)
    decoded = decode_event(encode_event(descriptor_event(snap)))
    assert isinstance(decoded, SubagentDescriptorEvent)
    folded = fold_subagent_descriptor([decoded])
    assert strict_eq(folded, expected)
    result = try_fold_subagent_descriptor([decoded])
    assert result.verdict == "ok"
    assert result.index == 0
    assert strict_eq(result.descriptor, expected)


@settings(max_examples=100, deadline=None)
@given(cases=st.lists(valid_inputs, min_size=1, max_size=4), noise=st.integers(0, 3))
def test_fold_is_last_wins_and_ignores_other_events(
    cases: list[tuple[dict[str, Any], SubagentDescriptor]], noise: int
) -> None:
    """R-DESC-9: over a loaded log the newest descriptor is the identity."""
    log: list[Event] = []
    last_index = -1
    for record, _ in cases:
        log.extend(MessageEvent(message_id=MID, content=i) for i in range(noise))
        log.append(descriptor_event(snapshot_subagent_descriptor(record)))
        last_index = len(log) - 1
    log.extend(MessageEvent(message_id=MID, content="after") for _ in range(noise))
    expected = cases[-1][1]
    assert strict_eq(fold_subagent_descriptor(log), expected)
    assert strict_eq(fold_subagent_descriptor(iter(log)), expected)
    result = try_fold_subagent_descriptor(log)
    assert (result.verdict, result.index) == ("ok", last_index)


def test_fold_of_a_log_without_descriptor_is_absent() -> None:
    """R-DESC-9: no descriptor event is ``None`` / verdict ``"absent"``."""
    log = [MessageEvent(message_id=MID, content="hi")]
    assert fold_subagent_descriptor(log) is None
    assert fold_subagent_descriptor([]) is None
    result = try_fold_subagent_descriptor(log)
    assert (result.verdict, result.descriptor, result.index) == ("absent", None, None)


def test_a_corrupt_newest_descriptor_is_not_papered_over() -> None:
    """R-DESC-9/10: last wins even when the last is corrupt; no fallback to an older one."""
    good = descriptor_event(snapshot_subagent_descriptor(one_shot_record()))
    bad = SubagentDescriptorEvent(payload={"v": 1, "mode": "one-shot"})
    with pytest.raises(DescriptorCorruptError):
        fold_subagent_descriptor([good, bad])
    result = try_fold_subagent_descriptor([good, bad])
    assert (result.verdict, result.index, result.descriptor) == ("corrupt", 1, None)
    assert result.reason
    assert fold_subagent_descriptor([bad, good]) == OneShotDescriptor(
        provider="local", label="summary"
    )


# -- R-DESC-10: malformed current version is corrupt ----------------------------------------


def _payload(**overrides: Any) -> dict[str, Any]:
    payload = descriptor_payload(snapshot_subagent_descriptor(continuable_record()))
    payload.update(overrides)
    return {k: v for k, v in payload.items() if v is not _DROP}


_DROP = object()

CORRUPT_PAYLOADS: dict[str, Any] = {
    "not a map": [1, "continuable"],
    "no version": _payload(v=_DROP),
    "str version": _payload(v="1"),
    "float version": _payload(v=1.0),
    "bool version": _payload(v=True),
    "null version": _payload(v=None),
    "no mode": _payload(mode=_DROP),
    "unknown mode": _payload(mode="hibernating"),
    "no provider": _payload(provider=_DROP),
    "empty label": _payload(label=""),
    "no label": _payload(label=_DROP),
    "no agent options": _payload(agent_options=_DROP),
    "agent options not a map": _payload(agent_options="scripted/echo"),
    "no model": _payload(agent_options={"provider": "scripted"}),
    "flat spelling": _payload(agent_options=_DROP, agent_provider="scripted", model="echo"),
    "tool_filter tuple-ish str": _payload(tool_filter="read"),
    "tool_filter of ints": _payload(tool_filter=[1]),
    "persona not str": _payload(persona=3),
    "unknown field": _payload(extra=1),
    "one-shot with options": {"v": 1, "mode": "one-shot", "provider": "p", "agent_options": {}},
    "one-shot no provider": {"v": 1, "mode": "one-shot"},
    "one-shot bad label": {"v": 1, "mode": "one-shot", "provider": "p", "label": 7},
    "empty": {},
}


@pytest.mark.parametrize("payload", CORRUPT_PAYLOADS.values(), ids=CORRUPT_PAYLOADS.keys())
def test_malformed_current_version_payloads_are_corrupt(payload: Any) -> None:
    """R-DESC-10: a malformed current-version payload is classified corrupt."""
    with pytest.raises(DescriptorCorruptError) as info:
        parse_descriptor_payload(payload)
    assert info.value.code == "DESCRIPTOR_CORRUPT"
    result = try_fold_subagent_descriptor([SubagentDescriptorEvent(payload=payload)])
    assert result.verdict == "corrupt"
    assert result.index == 0


# -- R-DESC-11: unsupported versions are told apart from corrupt ------------------------------


@pytest.mark.parametrize("version", [0, 2, 3, -1, 2**40])
@pytest.mark.parametrize(
    "rest",
    [{}, {"mode": "continuable"}, {"mode": "whatever", "anything": [1, 2]}],
    ids=["bare", "continuable", "future shape"],
)
def test_unknown_versions_are_unsupported_not_corrupt(version: int, rest: dict[str, Any]) -> None:
    """R-DESC-11: another version cannot be classified: unsupported, never corrupt."""
    payload = {"v": version, **rest}
    with pytest.raises(DescriptorUnsupportedError) as info:
        parse_descriptor_payload(payload)
    assert info.value.code == "DESCRIPTOR_UNSUPPORTED"
    assert not isinstance(info.value, DescriptorCorruptError)
    with pytest.raises(DescriptorUnsupportedError):
        fold_subagent_descriptor([SubagentDescriptorEvent(payload=payload)])
    result = try_fold_subagent_descriptor([SubagentDescriptorEvent(payload=payload)])
    assert (result.verdict, result.index, result.descriptor) == ("unsupported", 0, None)


def test_the_two_verdict_errors_are_distinct_types() -> None:
    """R-DESC-11: a caller can catch one without the other."""
    assert not issubclass(DescriptorUnsupportedError, DescriptorCorruptError)
    assert not issubclass(DescriptorCorruptError, DescriptorUnsupportedError)
    for cls in (DescriptorUnsupportedError, DescriptorCorruptError):
        assert issubclass(cls, SubagentError)


payload_maps = st.one_of(
    st.dictionaries(st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=6)), field_values),
    st.builds(
        lambda d, v: {**d, "v": v}, st.dictionaries(st.text(max_size=6), json_trees), json_trees
    ),
    json_trees,
)


@settings(max_examples=150, deadline=None)
@given(payloads=st.lists(payload_maps, min_size=1, max_size=3))
def test_try_fold_never_raises_and_agrees_with_fold(payloads: list[Any]) -> None:
    """R-DESC-11: any payload gets a verdict, consistent with what the fold raises."""
    log = [SubagentDescriptorEvent(payload=p) for p in payloads]
    result = try_fold_subagent_descriptor(log)
    assert result.verdict in {"ok", "corrupt", "unsupported"}
    assert result.index == len(log) - 1
    try:
        folded = fold_subagent_descriptor(log)
    except DescriptorUnsupportedError:
        assert result.verdict == "unsupported"
        last = payloads[-1]
        assert isinstance(last, dict)
        assert type(last.get("v")) is int
        assert last["v"] != DESCRIPTOR_VERSION
    except DescriptorCorruptError:
        assert result.verdict == "corrupt"
    else:
        assert result.verdict == "ok"
        assert result.descriptor == folded


def test_try_fold_reports_a_failing_log_iterator_instead_of_raising() -> None:
    """R-DESC-11: the projection fold never raises, even when reading the log fails."""

    def log() -> Iterator[Event]:
        yield descriptor_event(snapshot_subagent_descriptor(one_shot_record()))
        raise OSError("disk gone")

    result = try_fold_subagent_descriptor(log())
    assert result.verdict == "corrupt"
    assert result.reason is not None
    assert "disk gone" in result.reason
