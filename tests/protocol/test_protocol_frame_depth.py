"""How deep a decoded frame may nest (``Limits.max_depth``) whatever container
headers build it.

A small frame is decoded in one C call and its depth checked after; the check walks
the value only when the frame holds more bytes that could be container headers
than ``max_depth`` allows (``protocol._codec``). These frames nest with every
header kind msgpack has, and hide header-like bytes inside strings and binaries,
so a bound that missed a kind, or counted too few bytes, would let a frame through.
"""

from __future__ import annotations

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from subagents.protocol import DEFAULT_LIMITS, DecodeError, Limits, packb, unpackb

# One level of nesting, by header kind: the bytes before the one element (a map's
# key included: the int 0).
LEVELS = {
    "fixarray": b"\x91",
    "array16": b"\xdc" + struct.pack(">H", 1),
    "array32": b"\xdd" + struct.pack(">I", 1),
    "fixmap": b"\x81\x00",
    "map16": b"\xde" + struct.pack(">H", 1) + b"\x00",
    "map32": b"\xdf" + struct.pack(">I", 1) + b"\x00",
}


def _frame(kinds: list[str]) -> bytes:
    """``len(kinds)`` nested containers, outermost first, around ``nil``."""
    return b"".join(LEVELS[k] for k in kinds) + b"\xc0"


@pytest.mark.parametrize("kind", sorted(LEVELS))
@pytest.mark.parametrize("max_depth", [10, DEFAULT_LIMITS.max_depth])
def test_each_header_kind_nests_up_to_max_depth_and_no_deeper(kind: str, max_depth: int) -> None:
    """R-CODEC: a frame nested exactly max_depth deep decodes; one level more is a
    DecodeError, for every container header."""
    limits = DEFAULT_LIMITS if max_depth == DEFAULT_LIMITS.max_depth else Limits(max_depth=10)
    unpackb(_frame([kind] * max_depth), limits=limits)
    with pytest.raises(DecodeError):
        unpackb(_frame([kind] * (max_depth + 1)), limits=limits)


@given(
    kinds=st.lists(
        st.sampled_from(sorted(LEVELS)),
        min_size=DEFAULT_LIMITS.max_depth - 2,
        max_size=DEFAULT_LIMITS.max_depth + 2,
    )
)
def test_mixed_headers_are_refused_exactly_past_max_depth(kinds: list[str]) -> None:
    """Any mix of header kinds: refused if and only if deeper than max_depth."""
    frame = _frame(kinds)
    if len(kinds) > DEFAULT_LIMITS.max_depth:
        with pytest.raises(DecodeError):
            unpackb(frame)
    else:
        unpackb(frame)


@given(
    depth=st.integers(1, DEFAULT_LIMITS.max_depth + 3),
    filler=st.binary(min_size=0, max_size=200).map(lambda b: b + bytes(range(0x80, 0xA0))),
)
def test_header_like_bytes_in_payloads_change_nothing(depth: int, filler: bytes) -> None:
    """Bytes that look like container headers inside a binary or a string (which
    make the frame take the walk) neither refuse a shallow frame nor let a deep
    one through."""
    value: object = [filler, filler.decode("latin-1")]
    for _ in range(depth - 1):
        value = [value]
    frame = packb(value, limits=Limits(max_depth=10_000))
    if depth > DEFAULT_LIMITS.max_depth:
        with pytest.raises(DecodeError):
            unpackb(frame)
    else:
        assert unpackb(frame) == value
