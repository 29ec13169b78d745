"""``FrameDecoder`` tested the way h11 tests its readers.

The same stream is read as one buffer, one byte at a time, and in arbitrary chunks
(hypothesis); a stream that stops inside a frame leaves ``pending_bytes()`` and makes
``end_of_stream()`` raise; several frames arrive in one ``feed``; and a failure is
sticky, like h11's ERROR state.
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterable, Sequence
from typing import Any

import msgpack
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from protocol_strategies import json_trees, strict_eq
from subagents.protocol import (
    DecodeError,
    FrameDecoder,
    Limits,
    MessageId,
    SessionId,
    packb,
    unpackb,
)

UTC = dt.UTC
VALUES: list[Any] = [
    {"type": "message", "id": MessageId("0123456789abcdef0123456789abcdef"), "n": [1, 2, 3]},
    "a string",
    [],
    None,
    {"at": dt.datetime(2024, 1, 2, 3, 4, 5, 6, tzinfo=UTC), "blob": b"\x00" * 300},
    SessionId("00112233445566778899aabbccddeeff"),
    -(2**63),
    2**64 - 1,
    [[[["deep"]]]],
    {"k" * 40: "v" * 70_000},  # str32 header on the value
]
STREAM = b"".join(packb(v) for v in VALUES)


def _read(
    chunks: Iterable[bytes | bytearray | memoryview], limits: Limits | None = None
) -> tuple[list[Any], FrameDecoder]:
    decoder = FrameDecoder(limits) if limits is not None else FrameDecoder()
    out: list[Any] = []
    for chunk in chunks:
        decoder.feed(chunk)
        out.extend(decoder.frames())
    return out, decoder


def _assert_values(got: Sequence[Any], expected: Sequence[Any]) -> None:
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert strict_eq(g, e), (g, e)


def test_whole_buffer() -> None:
    got, decoder = _read([STREAM])
    _assert_values(got, VALUES)
    assert decoder.pending_bytes() == 0
    decoder.end_of_stream()


def test_one_byte_at_a_time() -> None:
    decoder = FrameDecoder()
    got: list[Any] = []
    boundaries = set()
    offset = 0
    for v in VALUES:
        offset += len(packb(v))
        boundaries.add(offset)
    for i in range(len(STREAM)):
        decoder.feed(STREAM[i : i + 1])
        got.extend(decoder.frames())
        # Between frames nothing is pending; inside a frame every fed byte is.
        consumed = max((b for b in boundaries if b <= i + 1), default=0)
        assert decoder.pending_bytes() == i + 1 - consumed
    _assert_values(got, VALUES)
    decoder.end_of_stream()


def test_several_frames_in_one_feed_then_nothing() -> None:
    decoder = FrameDecoder()
    decoder.feed(packb(1) + packb(2) + packb(3))
    assert list(decoder.frames()) == [1, 2, 3]
    assert list(decoder.frames()) == []
    decoder.feed(b"")
    assert list(decoder.frames()) == []
    decoder.end_of_stream()


def test_feed_accepts_bytearray_and_memoryview() -> None:
    data = packb({"a": [1, 2]})
    got, decoder = _read([bytearray(data[:3]), memoryview(data[3:])])
    assert got == [{"a": [1, 2]}]
    assert decoder.pending_bytes() == 0


@settings(max_examples=150, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=30))
def test_arbitrary_chunkings(cuts: list[int]) -> None:
    points = [0, *sorted(cuts), len(STREAM)]
    chunks = [STREAM[a:b] for a, b in itertools.pairwise(points)]
    got, decoder = _read(chunks)
    _assert_values(got, VALUES)
    assert decoder.pending_bytes() == 0
    decoder.end_of_stream()


@settings(max_examples=100, deadline=None)
@given(
    values=st.lists(json_trees, min_size=1, max_size=6),
    data=st.data(),
)
def test_arbitrary_values_and_chunkings(values: list[Any], data: st.DataObject) -> None:
    stream = b"".join(packb(v) for v in values)
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=20))
    points = [0, *sorted(cuts), len(stream)]
    got, decoder = _read(stream[a:b] for a, b in itertools.pairwise(points))
    _assert_values(got, values)
    decoder.end_of_stream()


# -- trailing data ------------------------------------------------------------------

PARTIALS = {
    # A container whose header and first items arrived but not the rest: the decoder
    # has consumed the items internally, yet the frame is still incomplete.
    "array items": packb([1, 2, 3, 4])[:3],
    "map entries": packb({"a": 1, "b": 2})[:4],
    "nested": packb({"a": [1, [2, 3]], "b": None})[:7],
    "str body": packb("x" * 40)[:10],
    "str32 header": packb("y" * 70_000)[:5],
    "ext header": packb(SessionId("00112233445566778899aabbccddeeff"))[:2],
    "timestamp": packb(dt.datetime(2024, 1, 1, 0, 0, 1, 5, tzinfo=UTC))[:4],
    "one byte": b"\x92",
}


@pytest.mark.parametrize("partial", PARTIALS.values(), ids=PARTIALS.keys())
def test_trailing_partial_frame_is_pending_and_end_of_stream_raises(partial: bytes) -> None:
    got, decoder = _read([packb("first"), packb({"second": 2}) + partial])
    assert got == ["first", {"second": 2}]
    assert decoder.pending_bytes() == len(partial)
    with pytest.raises(DecodeError):
        decoder.end_of_stream()
    # ... and the failure is sticky.
    with pytest.raises(DecodeError):
        decoder.feed(b"\xc0")
    with pytest.raises(DecodeError):
        list(decoder.frames())


@pytest.mark.parametrize("partial", PARTIALS.values(), ids=PARTIALS.keys())
def test_partial_frame_completes_when_the_rest_arrives(partial: bytes) -> None:
    """The same prefixes, completed: the stream is fine once the rest is fed."""
    full = next(
        packb(v)
        for v in (
            [1, 2, 3, 4],
            {"a": 1, "b": 2},
            {"a": [1, [2, 3]], "b": None},
            "x" * 40,
            "y" * 70_000,
            SessionId("00112233445566778899aabbccddeeff"),
            dt.datetime(2024, 1, 1, 0, 0, 1, 5, tzinfo=UTC),
            [None, None],
        )
        if packb(v).startswith(partial)
    )
    decoder = FrameDecoder()
    decoder.feed(partial)
    assert list(decoder.frames()) == []
    assert decoder.pending_bytes() == len(partial)
    decoder.feed(full[len(partial) :])
    assert len(list(decoder.frames())) == 1
    assert decoder.pending_bytes() == 0
    decoder.end_of_stream()


# -- errors are sticky --------------------------------------------------------------


def test_error_after_good_frames_is_sticky() -> None:
    decoder = FrameDecoder()
    decoder.feed(packb(1) + packb(2) + b"\xc1" + packb(3))  # 0xc1 is never valid
    frames = decoder.frames()
    assert next(frames) == 1
    assert next(frames) == 2
    with pytest.raises(DecodeError):
        next(frames)
    for op in (
        lambda: decoder.feed(packb(4)),
        lambda: list(decoder.frames()),
        decoder.end_of_stream,
    ):
        with pytest.raises(DecodeError):
            op()


def test_limit_error_is_sticky() -> None:
    decoder = FrameDecoder(Limits(max_str_len=4))
    decoder.feed(packb("12345"))
    with pytest.raises(DecodeError):
        list(decoder.frames())
    with pytest.raises(DecodeError):
        decoder.feed(packb("ok"))
    with pytest.raises(DecodeError):
        list(decoder.frames())


def test_depth_error_is_sticky() -> None:
    decoder = FrameDecoder(Limits(max_depth=2))
    decoder.feed(packb([[[]]]) + packb(1))
    with pytest.raises(DecodeError):
        list(decoder.frames())
    with pytest.raises(DecodeError):
        list(decoder.frames())


# -- max_buffer_size bounds one incomplete frame --------------------------------------


def test_complete_frames_may_exceed_the_buffer_in_total() -> None:
    """The bound is per frame: a long stream of small frames, drained as it goes, is fine."""
    limits = Limits(max_buffer_size=64)
    frame = packb({"n": 12345, "s": "x" * 20})
    got, decoder = _read([frame] * 500, limits)
    assert len(got) == 500
    decoder.end_of_stream()


def test_a_single_feed_beyond_the_buffer_fails() -> None:
    decoder = FrameDecoder(Limits(max_buffer_size=64))
    with pytest.raises(DecodeError):
        decoder.feed(b"\xc0" * 65)
    with pytest.raises(DecodeError):
        decoder.feed(b"\xc0")


def test_buffer_boundary_is_inclusive() -> None:
    frame = packb("x" * 60)
    assert len(frame) == 62
    got, _ = _read([frame], Limits(max_buffer_size=62))
    assert got == ["x" * 60]
    with pytest.raises(DecodeError):
        _read([packb("x" * 61)], Limits(max_buffer_size=62))


@pytest.mark.parametrize("chunk", [1, 3, 8, 64])
def test_an_incomplete_frame_streamed_in_chunks_is_bounded(chunk: int) -> None:
    """A frame larger than ``max_buffer_size`` fails even when it trickles in.

    The C unpacker consumes the items of an unfinished array as they arrive, so its
    own buffer never fills; the decoder must still count the whole incomplete frame.
    """
    limits = Limits(max_buffer_size=64)
    frame = packb(list(range(100)))
    assert len(frame) > 64
    decoder = FrameDecoder(limits)
    failed_at = None
    for i in range(0, len(frame), chunk):
        try:
            decoder.feed(frame[i : i + chunk])
            list(decoder.frames())
        except DecodeError:
            failed_at = i + chunk
            break
    assert failed_at is not None, "the whole over-sized frame was accepted"
    assert failed_at <= 64 + chunk
    with pytest.raises(DecodeError):
        decoder.feed(b"\xc0")


# -- every msgpack format family frames exactly as msgpack reads it ---------------------


def _family_samples() -> dict[str, bytes]:
    samples: dict[str, Any] = {
        "str fix/8/16/32": ["a" * 31, "b" * 32, "c" * 255, "d" * 256, "e" * 65535, "f" * 65536],
        "bin 8/16/32": [b"x" * 255, b"y" * 256, b"z" * 65535, b"w" * 65536],
        "array fix/16/32": [[0] * 15, [1] * 16, [None] * 65535, [True] * 65536],
        "map fix/16/32": [
            {i: i for i in range(15)},
            dict.fromkeys(range(16)),
            dict.fromkeys(range(65536), 0),
        ],
        "ints": [
            *(0, 127, 128, 255, 256, 65535, 65536, 2**32, 2**64 - 1),
            *(-1, -32, -33, -128, -129, -(2**15) - 1, -(2**31) - 1, -(2**63)),
        ],
        "floats": [0.0, -0.0, 1.5, float("inf"), -1e300],
    }
    out = {name: msgpack.packb(values) for name, values in samples.items()}
    out["float32"] = msgpack.packb([1.5, -2.25], use_single_float=True)
    out["ext fixext 1/2/4/8/16, ext 8/16/32 (raw)"] = (
        b"\x98"
        + b"".join(bytes([0xD4 + i, 5]) + b"\x00" * (1 << i) for i in range(5))
        + b"\xc7\x03\x05abc"
        + b"\xc8\x01\x00\x05"
        + b"\x00" * 256
        + b"\xc9\x00\x00\x00\x03\x05xyz"  # ext32 need not be minimal
    )
    return out


FAMILIES = _family_samples()


def _reference(data: bytes) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=msgpack.ExtType)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_frame_boundaries_match_msgpack_for_every_format_family(name: str) -> None:
    data = FAMILIES[name]
    expected = _reference(data)
    if "ext" in name:
        # Unregistered ext codes are refused -- after a correct frame boundary.
        with pytest.raises(DecodeError, match="ExtType"):
            unpackb(data)
        return
    assert unpackb(data) == expected
    stream = data + packb("next")
    got, decoder = _read([stream[i : i + 997] for i in range(0, len(stream), 997)])
    assert got == [expected, "next"]
    assert decoder.pending_bytes() == 0


@settings(max_examples=60, deadline=None)
@given(values=st.lists(json_trees, min_size=1, max_size=4), single=st.booleans())
def test_frame_boundaries_match_msgpack_for_foreign_writers(
    values: list[Any], single: bool
) -> None:
    """Bytes from plain msgpack (float32 too) frame and decode the same way."""
    try:
        frames = [msgpack.packb(v, use_single_float=single) for v in values]
    except OverflowError:  # a double beyond float32's range
        assume(False)
    stream = b"".join(frames)
    expected = [_reference(frame) for frame in frames]
    got, decoder = _read([stream[: len(stream) // 2], stream[len(stream) // 2 :]])
    assert got == expected
    decoder.end_of_stream()
