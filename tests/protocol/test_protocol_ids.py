"""Typed ids: validation, minting, and their wire form (one ExtType per kind)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from subagents.protocol import (
    EVENT_TYPES,
    ErrorCode,
    MessageId,
    RunId,
    SessionHeader,
    SessionId,
    SubagentError,
    UnknownEvent,
    new_message_id,
    new_run_id,
    new_session_id,
    packb,
    unpackb,
)

ID_TYPES = [SessionId, MessageId, RunId]
MINTERS = {SessionId: new_session_id, MessageId: new_message_id, RunId: new_run_id}


@pytest.mark.parametrize("cls", ID_TYPES, ids=lambda c: c.__name__)
@pytest.mark.parametrize(
    "value",
    ["", "0" * 31, "0" * 33, "A" * 32, "g" * 32, " " + "0" * 31, b"0" * 32, 0, None],
    ids=repr,
)
def test_ids_refuse_anything_but_32_lowercase_hex(cls: type[Any], value: Any) -> None:
    with pytest.raises(SubagentError) as info:
        cls(value)
    assert info.value.code == ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize("cls", ID_TYPES, ids=lambda c: c.__name__)
def test_minted_ids_are_typed_valid_and_unique(cls: type[Any]) -> None:
    minted = [MINTERS[cls]() for _ in range(1000)]
    assert all(type(i) is cls for i in minted)
    assert len(set(minted)) == len(minted)
    for i in minted[:10]:
        assert cls(str(i)) == i  # passes its own validation
        assert unpackb(packb(i)) == i


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_child_mints_ids_its_parent_never_will() -> None:
    """Minting is a random 64-bit prefix plus a counter; a forked child draws a new
    prefix, so parent and child (which share the counter's state) never collide."""
    before = new_message_id()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report two ids and leave without running atexit hooks
        os.write(write_end, (new_message_id() + new_session_id()).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        got = pipe.read()
    os.waitpid(pid, 0)
    mine = new_message_id()
    theirs = {got[:32], got[32:]}
    assert len(got) == 64 and mine not in theirs and before not in theirs
    assert {t[:16] for t in theirs} != {mine[:16]}  # a new prefix, not just a new count


@given(raw=st.binary(min_size=16, max_size=16))
def test_bytes_form_round_trips(raw: bytes) -> None:
    for cls in ID_TYPES:
        value = cls.from_bytes(raw)
        assert type(value) is cls
        assert value.to_bytes() == raw
        assert value == raw.hex()


def test_reconstructing_an_id_of_the_same_type_returns_it() -> None:
    sid = new_session_id()
    assert SessionId(sid) is sid
    assert type(MessageId(str(sid))) is MessageId


def test_kinds_pack_to_distinct_ext_codes() -> None:
    """Equal hex, different kinds: the wire keeps them apart."""
    hexes = "00112233445566778899aabbccddeeff"
    blobs = {packb(cls(hexes)) for cls in ID_TYPES}
    assert len(blobs) == 3
    assert [type(unpackb(packb(cls(hexes)))) for cls in ID_TYPES] == ID_TYPES


def test_repr_names_the_kind() -> None:
    assert repr(RunId("a" * 32)) == f"RunId('{'a' * 32}')"


@pytest.mark.parametrize("cls", [*EVENT_TYPES.values(), UnknownEvent, SessionHeader])
def test_vocabulary_classes_are_frozen_slotted_keyword_only(cls: type[Any]) -> None:
    """h11's habit: events are frozen, slotted, keyword-only dataclasses."""
    assert dataclasses.is_dataclass(cls)
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    assert params.frozen
    assert "__slots__" in vars(cls)
    assert all(f.kw_only for f in dataclasses.fields(cls))


def test_event_type_names_are_the_documented_strings() -> None:
    assert sorted(EVENT_TYPES) == [
        "agent/options",
        "interrupt",
        "message",
        "message/expected",
        "report",
        "subagent/descriptor",
        "turn/end",
        "turn/start",
    ]
    assert all(cls.type == name for name, cls in EVENT_TYPES.items())
