"""The msgpack codec: one ExtType registry, strict packing, bounded unpacking.

Packing refuses what it cannot represent (:class:`EncodeError`). Decoding bytes
from disk or wire always goes through ``msgpack.Unpacker`` with explicit limits
(:class:`Limits`) and raises :class:`DecodeError` -- never another exception type --
for every malformed input. An unpacker is thrown away after an error.

ExtType registry (the only place codes are assigned):

====  ===============  ===========================================
code  Python type      payload
====  ===============  ===========================================
 -1   ``datetime``     msgpack's standard Timestamp (aware, UTC)
  1   ``SessionId``    16 raw bytes
  2   ``MessageId``    16 raw bytes
  3   ``RunId``        16 raw bytes
====  ===============  ===========================================
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

import msgpack

from ._errors import DecodeError, EncodeError
from ._ids import MessageId, RunId, SessionId, _Id

__all__ = [
    "DEFAULT_LIMITS",
    "EXT_CODES",
    "FrameDecoder",
    "Limits",
    "check_depth",
    "packb",
    "unpackb",
]

EXT_CODES: Final[dict[int, type[_Id]]] = {1: SessionId, 2: MessageId, 3: RunId}
_ID_CODES: Final[dict[type[_Id], int]] = {cls: code for code, cls in EXT_CODES.items()}


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Bounds applied to untrusted bytes.

    ``max_buffer_size`` bounds the bytes buffered for one incomplete frame (and so
    memory); the per-kind lengths bound what a single header may claim; ``max_depth``
    bounds container nesting.
    """

    max_buffer_size: int = 16 * 1024 * 1024
    max_str_len: int = 8 * 1024 * 1024
    max_bin_len: int = 8 * 1024 * 1024
    max_array_len: int = 1_000_000
    max_map_len: int = 100_000
    max_ext_len: int = 1024
    max_depth: int = 64


DEFAULT_LIMITS: Final = Limits()


def _default(obj: Any) -> Any:
    code = _ID_CODES.get(type(obj))
    if code is not None:
        return msgpack.ExtType(code, bytes.fromhex(obj))
    if isinstance(obj, tuple):
        return list(obj)
    if isinstance(obj, _dt.datetime):
        # Aware datetimes are packed natively (datetime=True); only naive ones land here.
        raise EncodeError("cannot pack a naive datetime; use an aware (UTC) datetime")
    if isinstance(obj, str):  # another str subclass: pack as its plain value
        return str(obj)
    raise EncodeError(f"cannot pack a value of type {type(obj).__name__}")


def _check_shape(obj: Any, max_depth: int) -> None:
    """Refuse nesting deeper than ``max_depth`` and containers used as map keys.

    Tuples count as arrays (they pack as arrays). A container key would decode as
    an unhashable list. Exact types suffice: packing refuses other subclasses.
    """
    kind = type(obj)
    if kind is not dict and kind is not list and kind is not tuple:
        return
    stack: list[tuple[Any, int]] = [(obj, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        value, depth = pop()
        if depth > max_depth:
            raise EncodeError(f"nesting deeper than max_depth ({max_depth})")
        if type(value) is dict:
            for k, v in value.items():
                kind = type(k)
                if kind is dict or kind is list or kind is tuple:
                    raise EncodeError(f"a map key must not be a container, got {kind.__name__}")
                kind = type(v)
                if kind is dict or kind is list or kind is tuple:
                    push((v, depth + 1))
        else:
            for v in value:
                kind = type(v)
                if kind is dict or kind is list or kind is tuple:
                    push((v, depth + 1))


def packb(obj: Any, *, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """Pack ``obj`` to bytes, or raise :class:`EncodeError`.

    Packing refuses what it cannot represent (sets, arbitrary objects, naive
    datetimes, ints beyond 64 bits, subclasses of the builtin types other than the
    ids) and also what :func:`unpackb` with the same ``limits`` would refuse, so a
    record that is written can always be read back.
    """
    _check_shape(obj, limits.max_depth)
    try:
        data: bytes = msgpack.packb(
            obj, default=_default, use_bin_type=True, datetime=True, strict_types=True
        )
    except EncodeError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        raise EncodeError(f"cannot pack value: {exc}") from exc
    size = len(data)
    if size > limits.max_buffer_size:
        raise EncodeError(f"a frame of {size} bytes exceeds max_buffer_size")
    # No str, bin, array or map in a frame can be longer than the frame itself, so
    # only a frame past the smallest of those bounds (or a max_ext_len below the
    # 16 bytes of an id) needs the exact check: read it back with the same limits.
    if size > _size_safe(limits):
        try:
            unpackb(data, limits=limits)
        except DecodeError as exc:
            raise EncodeError(f"the decoder would refuse this value: {exc.args[0]}") from None
    return data


def _size_safe(limits: Limits) -> int:
    if limits.max_ext_len < 16:
        return 0
    return min(limits.max_str_len, limits.max_bin_len, limits.max_array_len, limits.max_map_len)


def _ext_hook(code: int, data: bytes) -> Any:
    cls = EXT_CODES.get(code)
    if cls is None:
        raise DecodeError(f"unknown ExtType code {code}")
    if len(data) != 16:
        raise DecodeError(f"ExtType {code} ({cls.__name__}) must carry 16 bytes, got {len(data)}")
    return cls.from_bytes(data)


def check_depth(obj: Any, max_depth: int) -> None:
    """Raise :class:`DecodeError` when containers nest deeper than ``max_depth``."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict):
            if depth > max_depth:
                raise DecodeError(f"nesting deeper than {max_depth}")
            for v in value.values():
                if isinstance(v, (dict, list)):
                    stack.append((v, depth + 1))
        elif isinstance(value, list):
            if depth > max_depth:
                raise DecodeError(f"nesting deeper than {max_depth}")
            for v in value:
                if isinstance(v, (dict, list)):
                    stack.append((v, depth + 1))


def _new_unpacker(limits: Limits) -> msgpack.Unpacker:
    return msgpack.Unpacker(
        raw=False,
        use_list=True,
        strict_map_key=False,
        timestamp=3,
        ext_hook=_ext_hook,
        max_buffer_size=limits.max_buffer_size,
        max_str_len=limits.max_str_len,
        max_bin_len=limits.max_bin_len,
        max_array_len=limits.max_array_len,
        max_map_len=limits.max_map_len,
        max_ext_len=limits.max_ext_len,
    )


def unpackb(data: bytes, *, limits: Limits = DEFAULT_LIMITS) -> Any:
    """Decode exactly one msgpack object from ``data``.

    Raises:
        DecodeError: malformed, truncated, oversized or trailing data.
    """
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    decoder = FrameDecoder(limits)
    decoder.feed(data)
    frames = decoder.frames()
    try:
        obj = next(frames)
    except StopIteration:
        raise DecodeError("truncated frame: no complete object") from None
    if decoder.pending_bytes():
        raise DecodeError("trailing data after the frame")
    return obj


class FrameDecoder:
    """Sans-IO reader of a stream of msgpack frames (one object per frame).

    Bytes in, objects out: call :meth:`feed` with whatever arrived, then iterate
    :meth:`frames`. Partial frames stay buffered until completed. Call
    :meth:`end_of_stream` when the source is exhausted: leftover bytes then raise.
    Any error is sticky -- the decoder refuses further use, as h11's error state.
    """

    __slots__ = ("_consumed", "_error", "_fed", "_limits", "_unpacker")

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self._limits = limits
        self._unpacker = _new_unpacker(limits)
        self._fed = 0
        # Stream offset of the end of the last frame handed out. Unpacker.tell() is
        # not enough: the C unpacker consumes the header and finished items of an
        # incomplete frame into its own stack, so tell() runs ahead of the frame
        # boundary and its own buffer never sees the whole frame.
        self._consumed = 0
        self._error: DecodeError | None = None

    def _fail(self, exc: BaseException) -> DecodeError:
        err = (
            exc if isinstance(exc, DecodeError) else DecodeError(f"malformed frame: {exc!r}"[:300])
        )
        self._error = err
        return err

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer more bytes.

        Raises:
            DecodeError: the bytes not yet returned as frames would exceed
                ``max_buffer_size`` (an incomplete frame is never allowed to grow
                past it, however slowly it arrives).
        """
        if self._error is not None:
            raise DecodeError("decoder already failed") from self._error
        try:
            size = memoryview(data).nbytes
            if self._fed + size - self._consumed > self._limits.max_buffer_size:
                raise DecodeError(
                    f"more than max_buffer_size ({self._limits.max_buffer_size}) bytes "
                    "buffered without a complete frame"
                )
            self._unpacker.feed(data)
        except Exception as exc:
            raise self._fail(exc) from exc
        self._fed += size

    def frames(self) -> Iterator[Any]:
        """Yield every complete frame buffered so far."""
        if self._error is not None:
            raise DecodeError("decoder already failed") from self._error
        unpacker = self._unpacker
        max_depth = self._limits.max_depth
        while True:
            try:
                obj = unpacker.unpack()
            except msgpack.OutOfData:
                return
            except Exception as exc:
                raise self._fail(exc) from exc
            # After a complete object, tell() is exactly the frame boundary.
            self._consumed = unpacker.tell()
            if isinstance(obj, (dict, list)):
                try:
                    check_depth(obj, max_depth)
                except DecodeError as exc:
                    raise self._fail(exc) from exc
            yield obj

    def pending_bytes(self) -> int:
        """Bytes fed that :meth:`frames` has not yet returned as complete frames."""
        return self._fed - self._consumed

    def end_of_stream(self) -> None:
        """Declare the stream over; raises if a partial frame is left."""
        if self._error is not None:
            raise DecodeError("decoder already failed") from self._error
        left = self.pending_bytes()
        if left:
            raise self._fail(DecodeError(f"stream ended inside a frame ({left} bytes left)"))
