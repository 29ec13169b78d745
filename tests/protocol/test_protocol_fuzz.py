"""Fuzzing the decoders: hostile bytes only ever raise ``DecodeError``.

Random bytes and mutated valid encodings (bit flips, truncation, insertion,
deletion, overwritten length fields), deep nesting and huge claimed lengths are fed
to ``decode_event``, ``decode_header``, ``unpackb`` and ``FrameDecoder``. Each must
return a value or raise :class:`DecodeError` -- never another exception type --
promptly (the per-test timeout catches a hang) and without allocating more than a
small multiple of its input (``tracemalloc`` checks the claimed-length attacks).
"""

from __future__ import annotations

import contextlib
import itertools
import tracemalloc
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from protocol_strategies import events, headers, json_trees
from subagents.protocol import (
    DecodeError,
    Event,
    FrameDecoder,
    Limits,
    SessionHeader,
    decode_event,
    decode_header,
    encode_event,
    encode_header,
    packb,
    unpackb,
)

pytestmark = pytest.mark.timeout(60)

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

DECODERS: dict[str, Callable[[bytes], Any]] = {
    "decode_event": decode_event,
    "decode_header": decode_header,
    "unpackb": unpackb,
}


def _only_decode_error(decode: Callable[[bytes], Any], data: bytes) -> None:
    # Anything but DecodeError propagates and fails the test with its own traceback.
    with contextlib.suppress(DecodeError):
        decode(data)


def _feed_all(decoder: FrameDecoder, data: bytes) -> list[Any]:
    decoder.feed(data)
    return list(decoder.frames())


def _stream(data: bytes, cuts: list[int], limits: Limits | None = None) -> None:
    """Feed ``data`` in pieces; only DecodeError may escape, and it must be sticky."""
    decoder = FrameDecoder(limits) if limits is not None else FrameDecoder()
    points = [0, *sorted(c % (len(data) + 1) for c in cuts), len(data)]
    try:
        for a, b in itertools.pairwise(points):
            decoder.feed(data[a:b])
            for _ in decoder.frames():
                assert decoder.pending_bytes() >= 0
        decoder.end_of_stream()
    except DecodeError:
        for op in (lambda: decoder.feed(b"\xc0"), lambda: next(decoder.frames())):
            with pytest.raises(DecodeError):
                op()


# -- random bytes ----------------------------------------------------------------------


@pytest.mark.parametrize("name", list(DECODERS))
@FUZZ
@given(data=st.binary(max_size=200))
def test_random_bytes(name: str, data: bytes) -> None:
    _only_decode_error(DECODERS[name], data)


@FUZZ
@given(data=st.binary(max_size=300), cuts=st.lists(st.integers(0, 300), max_size=8))
def test_random_bytes_streamed(data: bytes, cuts: list[int]) -> None:
    _stream(data, cuts)


# -- mutated valid encodings ------------------------------------------------------------


@st.composite
def valid_encodings(draw: st.DrawFn) -> bytes:
    value = draw(st.one_of(events, headers, json_trees))
    if isinstance(value, Event):
        return encode_event(value)
    if isinstance(value, SessionHeader):
        return encode_header(value)
    return packb(value)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(valid_encodings()))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "overwrite", "length"]))
        i = draw(st.integers(0, max(len(data) - 1, 0)))
        if op == "flip" and data:
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "truncate":
            del data[i:]
        elif op == "insert":
            data[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del data[i : i + draw(st.integers(1, 8))]
        elif op == "overwrite":
            chunk = draw(st.binary(min_size=1, max_size=4))
            data[i : i + len(chunk)] = chunk
        else:  # a length field: a str32/bin32/array32/map32/ext32 header claiming a lot
            lead = draw(st.sampled_from([0xDB, 0xC6, 0xDD, 0xDF, 0xC9, 0xDA, 0xDC, 0xDE]))
            width = 2 if lead in (0xDA, 0xDC, 0xDE) else 4
            claim = draw(st.integers(0, 2 ** (8 * width) - 1))
            data[i:i] = bytes([lead]) + claim.to_bytes(width, "big")
    return bytes(data)


@pytest.mark.parametrize("name", list(DECODERS))
@FUZZ
@given(data=mutated())
def test_mutated_encodings(name: str, data: bytes) -> None:
    _only_decode_error(DECODERS[name], data)


@FUZZ
@given(data=mutated(), cuts=st.lists(st.integers(0, 10_000), max_size=6))
def test_mutated_encodings_streamed(data: bytes, cuts: list[int]) -> None:
    _stream(data, cuts)


@settings(max_examples=100, deadline=None)
@given(
    frames=st.lists(valid_encodings(), min_size=1, max_size=4),
    cut=st.integers(0, 10_000),
    tail=st.binary(max_size=16),
)
def test_valid_stream_with_garbage_tail(frames: list[bytes], cut: int, tail: bytes) -> None:
    """Good frames before garbage come out intact; the garbage raises DecodeError only."""
    data = b"".join(frames)
    decoder = FrameDecoder()
    got: list[Any] = []
    try:
        decoder.feed(data[: cut % (len(data) + 1)])
        got.extend(decoder.frames())
        decoder.feed(data[cut % (len(data) + 1) :])
        got.extend(decoder.frames())
    except DecodeError:  # pragma: no cover - the valid part never fails
        pytest.fail("a valid stream failed")
    assert len(got) == len(frames)
    try:
        decoder.feed(tail)
        list(decoder.frames())
        decoder.end_of_stream()
    except DecodeError:
        pass


@settings(max_examples=60, deadline=None)
@given(
    data=mutated(),
    limits=st.builds(
        Limits,
        max_buffer_size=st.integers(1, 512),
        max_str_len=st.integers(0, 64),
        max_bin_len=st.integers(0, 64),
        max_array_len=st.integers(0, 16),
        max_map_len=st.integers(0, 16),
        max_ext_len=st.integers(0, 20),
        max_depth=st.integers(0, 8),
    ),
)
def test_mutated_encodings_under_tight_limits(data: bytes, limits: Limits) -> None:
    for decode in (unpackb, decode_event, decode_header):
        with contextlib.suppress(DecodeError):
            decode(data, limits=limits)
    _stream(data, [3, 7, 50], limits)


# -- deep nesting ----------------------------------------------------------------------


@pytest.mark.parametrize("depth", [65, 200, 1023, 1024, 1025, 5000, 200_000])
@pytest.mark.parametrize(
    ("opener", "leaf"),
    [(b"\x91", b"\xc0"), (b"\x81\xa1k", b"\xc0"), (b"\x92\xc0", b"\xc0")],
    ids=["arrays", "maps", "wide"],
)
def test_deep_nesting(depth: int, opener: bytes, leaf: bytes) -> None:
    data = opener * depth + leaf
    with pytest.raises(DecodeError):
        unpackb(data)
    with pytest.raises(DecodeError):
        decode_event(data)
    with pytest.raises(DecodeError):
        _feed_all(FrameDecoder(), data)


def test_nesting_up_to_the_limit_decodes() -> None:
    data = b"\x91" * 63 + b"\x90"  # 64 levels, the default max_depth
    value = unpackb(data)
    for _ in range(63):
        value = value[0]
    assert value == []
    with pytest.raises(DecodeError):
        unpackb(b"\x91" + data)


# -- huge claimed lengths --------------------------------------------------------------

CLAIMS = {
    "str32 4GiB": b"\xdb\xff\xff\xff\xff",
    "bin32 4GiB": b"\xc6\xff\xff\xff\xff",
    "ext32 4GiB": b"\xc9\xff\xff\xff\xff\x01",
    "array32 4G items": b"\xdd\xff\xff\xff\xff",
    "map32 4G entries": b"\xdf\xff\xff\xff\xff",
    "str32 at max_str_len": (8 * 1024 * 1024).to_bytes(4, "big").join([b"\xdb", b""]),
    "array32 1M items, nested": b"\xdd\x00\x0f\x42\x40" * 1024,
    "map32 100k entries, nested": b"\xdf\x00\x01\x86\xa0\xa1k" * 1024,
    "event with a 4GiB str": b"\x82\xa4type\xa7message\xa7content\xdb\xff\xff\xff\xff",
    "header with a 4GiB label": b"\x81\xa5label\xdb\xff\xff\xff\xff" + b"x" * 100,
}


def _peak_allocation(fn: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        fn()
    except DecodeError:
        pass
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("data", CLAIMS.values(), ids=CLAIMS.keys())
def test_huge_claims_fail_without_allocating(data: bytes) -> None:
    """A few bytes claiming gigabytes raise at once and allocate about nothing."""
    budget = 64 * 1024 + 64 * len(data)
    for decode in DECODERS.values():
        with pytest.raises(DecodeError):
            decode(data)
        assert _peak_allocation(lambda: decode(data)) < budget  # noqa: B023


STREAM_CLAIMS = {k: v for k, v in CLAIMS.items() if k != "str32 at max_str_len"}


@pytest.mark.parametrize("data", STREAM_CLAIMS.values(), ids=STREAM_CLAIMS.keys())
def test_huge_claims_fail_fast_in_a_stream(data: bytes) -> None:
    """Streaming: a claim that cannot fit ``max_buffer_size`` fails on its header.

    The decoder does not wait for gigabytes that would be refused anyway, nor hold
    what the C unpacker would preallocate for them.
    """
    decoder = FrameDecoder()
    peak = _peak_allocation(lambda: _feed_all(decoder, data))
    assert peak < 64 * 1024 + 64 * len(data)
    with pytest.raises(DecodeError):
        list(decoder.frames())


def test_claims_within_the_buffer_wait_for_their_bytes() -> None:
    """A plausible claim is not an error: the bytes may still be on their way."""
    decoder = FrameDecoder(Limits(max_buffer_size=1000))
    decoder.feed(b"\xda\x03\x00")  # str16 of 768 bytes
    assert list(decoder.frames()) == []
    decoder.feed(b"x" * 768)
    assert list(decoder.frames()) == ["x" * 768]
    with pytest.raises(DecodeError):  # 1000 bytes of str: 1003 with its header
        _feed_all(FrameDecoder(Limits(max_buffer_size=1000)), b"\xda\x03\xe8")
