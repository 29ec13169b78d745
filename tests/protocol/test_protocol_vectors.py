"""Golden vectors: the committed bytes in ``tests/vectors/`` are the format.

Encoding each constructed value must give the committed bytes exactly, and
decoding the committed bytes must give the constructed value back (types
included). These tests only read the files; regenerating them is a deliberate,
human step (``python tests/protocol/make_vectors.py``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from protocol_strategies import strict_eq
from protocol_vectors import MANIFEST, VECTORS, VECTORS_DIR, Vector, decode, encode
from subagents.protocol import (
    EVENT_TYPES,
    MessageId,
    RunId,
    SessionHeader,
    SessionId,
    UnknownEvent,
    snapshot_subagent_descriptor,
)


def _manifest() -> dict[str, dict[str, Any]]:
    data: dict[str, dict[str, Any]] = json.loads(MANIFEST.read_text())
    return data


NAMES = sorted(VECTORS)


def test_manifest_lists_exactly_the_constructed_vectors() -> None:
    manifest = _manifest()
    assert sorted(manifest) == NAMES
    on_disk = sorted(p.stem for p in VECTORS_DIR.glob("*.msgpack"))
    assert on_disk == NAMES, "a .msgpack file without a construction (or the reverse)"


@pytest.mark.parametrize("name", NAMES)
def test_manifest_entry_matches_its_file(name: str) -> None:
    entry = _manifest()[name]
    assert entry["file"] == f"{name}.msgpack"
    assert entry["kind"] == VECTORS[name].kind
    assert bytes.fromhex(entry["hex"]) == (VECTORS_DIR / entry["file"]).read_bytes()


@pytest.mark.parametrize("name", NAMES)
def test_encoding_matches_committed_bytes(name: str) -> None:
    committed = (VECTORS_DIR / f"{name}.msgpack").read_bytes()
    produced = encode(VECTORS[name])
    assert produced == committed, (
        f"the encoding of {name!r} changed:\n  committed {committed.hex()}\n"
        f"  produced  {produced.hex()}\n"
        "If this format change is intended, run `python tests/protocol/make_vectors.py`."
    )


@pytest.mark.parametrize("name", NAMES)
def test_committed_bytes_decode_to_the_construction(name: str) -> None:
    vector: Vector = VECTORS[name]
    decoded = decode(vector.kind, (VECTORS_DIR / f"{name}.msgpack").read_bytes())
    expected = vector.value
    if vector.kind == "descriptor":
        expected = snapshot_subagent_descriptor(expected)
    assert strict_eq(decoded, expected), f"{decoded!r} != {expected!r}"


def test_vectors_cover_every_event_kind_id_and_the_header() -> None:
    """Adding an event class, an id type or a mode without a golden vector fails."""
    covered = {type(v.value) for v in VECTORS.values()}
    for cls in [*EVENT_TYPES.values(), UnknownEvent, SessionHeader, SessionId, MessageId, RunId]:
        assert cls in covered, f"no golden vector for {cls.__name__}"
    modes = {v.value.mode for v in VECTORS.values() if v.kind == "descriptor"}
    assert modes == {"one-shot", "continuable"}


def test_id_vectors_are_fixext16_with_the_registered_code() -> None:
    """The ExtType registry, spelled out in bytes: fixext16 (0xd8), code, 16 raw bytes."""
    for name, code in (("id_session", 1), ("id_message", 2), ("id_run", 3)):
        data = (VECTORS_DIR / f"{name}.msgpack").read_bytes()
        assert data[:2] == bytes([0xD8, code])
        assert data[2:] == bytes.fromhex(VECTORS[name].value)


def test_timestamp_vectors_use_the_three_standard_forms() -> None:
    """msgpack Timestamp (ext -1): fixext4 (32-bit), fixext8 (64-bit), ext8 len 12 (96-bit)."""
    assert (VECTORS_DIR / "timestamp_32.msgpack").read_bytes()[:2] == b"\xd6\xff"
    assert (VECTORS_DIR / "timestamp_64.msgpack").read_bytes()[:2] == b"\xd7\xff"
    assert (VECTORS_DIR / "timestamp_96.msgpack").read_bytes()[:3] == b"\xc7\x0c\xff"
