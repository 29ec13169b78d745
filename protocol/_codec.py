"""The msgpack codec: one ExtType registry, strict packing, bounded unpacking.

Packing refuses what it cannot represent, and what decoding would refuse
(:class:`EncodeError`). Decoding bytes from disk or wire first walks each frame's
headers against explicit limits (:class:`Limits`) -- so a claimed length or a
nesting depth is refused before anything is allocated for it -- then builds the
complete frame with ``msgpack.unpackb``; it raises :class:`DecodeError` -- never
another exception type -- for every malformed input. A decoder is thrown away
after an error.

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
import threading
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


# Session ids recur in event after event (every source names one): their packed
# ExtType is kept, bounded, instead of rebuilt from hex each time.
_SESSION_EXT: dict[str, msgpack.ExtType] = {}


def _default(obj: Any) -> Any:
    kind = type(obj)
    if kind is SessionId:
        ext = _SESSION_EXT.get(obj)
        if ext is None:
            if len(_SESSION_EXT) >= 4096:
                _SESSION_EXT.clear()
            ext = _SESSION_EXT[obj] = msgpack.ExtType(_ID_CODES[SessionId], bytes.fromhex(obj))
        return ext
    code = _ID_CODES.get(kind)
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
    return pack_shaped(obj, limits)


_local = threading.local()


def _packer() -> msgpack.Packer:
    # One Packer per thread: building one per call costs ~0.7 us of a ~3 us pack.
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = _local.packer = msgpack.Packer(
            default=_default, use_bin_type=True, datetime=True, strict_types=True
        )
    return packer


def pack_shaped(obj: Any, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """:func:`packb` for a value whose nesting the caller already checked.

    The event encoders check only their free-form fields (content, output,
    payload): the rest of an event's map has a fixed, shallow shape.
    """
    try:
        data: bytes = _packer().pack(obj)
    except EncodeError:
        _local.packer = None  # a failed pack may leave bytes in its buffer
        raise
    except (TypeError, ValueError, OverflowError) as exc:
        _local.packer = None
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


def check_shape(obj: Any, max_depth: int) -> None:
    """Public form of the encode-side nesting check (raises :class:`EncodeError`)."""
    _check_shape(obj, max_depth)


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
    """Raise :class:`DecodeError` when containers nest deeper than ``max_depth``.

    For already-decoded values; bytes are checked by the frame scanner instead,
    before anything is built.
    """
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


# -- the frame scanner -----------------------------------------------------------------
# Bytes are walked header by header *before* msgpack builds anything. Left alone, the
# C unpacker checks a str/bin length only once its bytes have arrived, preallocates
# (up to 10k slots) for every claimed array/map, and nests 1024 levels before any
# depth check could run: 5 KB of nested "1M items" headers made it allocate ~80 MB.
# The scanner refuses a claim the moment its header is read -- over its per-kind
# limit, deeper than max_depth, or larger than the frame may be (every claimed item
# takes at least one byte) -- and msgpack only ever sees complete frames, so what
# gets built is proportional to bytes that really arrived.

_SCALAR, _STR, _BIN, _EXT, _ARRAY, _MAP, _NEVER = range(7)


def _lead_table() -> tuple[tuple[int, int, int], ...]:
    """Per lead byte: (kind, width of the length field, inline length or size)."""
    table: list[tuple[int, int, int]] = [(_NEVER, 0, 0)] * 256
    for b in range(0x80):
        table[b] = (_SCALAR, 0, 1)  # positive fixint
    for b in range(0xE0, 0x100):
        table[b] = (_SCALAR, 0, 1)  # negative fixint
    for b in range(0x80, 0x90):
        table[b] = (_MAP, 0, b & 0x0F)
    for b in range(0x90, 0xA0):
        table[b] = (_ARRAY, 0, b & 0x0F)
    for b in range(0xA0, 0xC0):
        table[b] = (_STR, 0, b & 0x1F)
    for b in (0xC0, 0xC2, 0xC3):
        table[b] = (_SCALAR, 0, 1)  # nil, false, true
    for b, size in ((0xCA, 5), (0xCB, 9), (0xCC, 2), (0xCD, 3), (0xCE, 5), (0xCF, 9)):
        table[b] = (_SCALAR, 0, size)  # float32/64, uint8..64
    for b, size in ((0xD0, 2), (0xD1, 3), (0xD2, 5), (0xD3, 9)):
        table[b] = (_SCALAR, 0, size)  # int8..64
    for b, width in ((0xC4, 1), (0xC5, 2), (0xC6, 4)):
        table[b] = (_BIN, width, 0)
    for b, width in ((0xC7, 1), (0xC8, 2), (0xC9, 4)):
        table[b] = (_EXT, width, 0)
    for b, length in ((0xD4, 1), (0xD5, 2), (0xD6, 4), (0xD7, 8), (0xD8, 16)):
        table[b] = (_EXT, 0, length)  # fixext
    for b, width in ((0xD9, 1), (0xDA, 2), (0xDB, 4)):
        table[b] = (_STR, width, 0)
    table[0xDC], table[0xDD] = (_ARRAY, 2, 0), (_ARRAY, 4, 0)
    table[0xDE], table[0xDF] = (_MAP, 2, 0), (_MAP, 4, 0)
    return tuple(table)


_LEAD: Final = _lead_table()


def _scan(
    buf: bytes | bytearray, start: int, pos: int, stack: list[int], limits: Limits, budget: int
) -> tuple[int, bool]:
    """Walk the frame that begins at ``start`` from ``pos`` as far as ``buf`` allows.

    ``stack`` holds the items still owed by each open container (mutated in place,
    so a later call resumes). Returns ``(pos, complete)``: with ``complete`` the
    frame is ``buf[start:pos]``; otherwise ``pos`` is where to resume once more
    bytes have arrived. The frame may not extend past ``start + budget``.

    Raises:
        DecodeError: an invalid lead byte, a claim over its limit or past the
            budget (every claimed item takes at least one byte), or nesting deeper
            than ``limits.max_depth``.
    """
    end = len(buf)
    limit_end = start + budget
    lead_table = _LEAD
    while pos < end:
        lead = buf[pos]
        if lead < 0x80 or lead > 0xDF or lead == 0xC0 or lead == 0xC2 or lead == 0xC3:
            pos += 1  # fast path: fixints, nil, bools
        else:
            kind, width, value = lead_table[lead]
            head = 1 + width
            if width:
                if pos + head > end:
                    break
                value = int.from_bytes(buf[pos + 1 : pos + head], "big")
            if kind == _STR:
                if value > limits.max_str_len:
                    raise DecodeError(f"a str of {value} bytes exceeds max_str_len")
                size = head + value
            elif kind == _SCALAR:
                size = value
            elif kind in (_ARRAY, _MAP):
                if len(stack) >= limits.max_depth:
                    raise DecodeError(f"nesting deeper than {limits.max_depth}")
                if kind == _ARRAY:
                    if value > limits.max_array_len:
                        raise DecodeError(f"an array of {value} items exceeds max_array_len")
                    items = value
                else:
                    if value > limits.max_map_len:
                        raise DecodeError(f"a map of {value} entries exceeds max_map_len")
                    items = 2 * value
                if pos + head + items > limit_end:
                    raise DecodeError(
                        f"a container claims {items} items, more than the frame may hold"
                    )
                if pos + head > end:
                    break
                pos += head
                if items:
                    stack.append(items)
                    continue
                size = 0
            elif kind == _BIN:
                if value > limits.max_bin_len:
                    raise DecodeError(f"a bin of {value} bytes exceeds max_bin_len")
                size = head + value
            elif kind == _EXT:
                if value > limits.max_ext_len:
                    raise DecodeError(f"an ext of {value} bytes exceeds max_ext_len")
                size = head + 1 + value  # the type byte
            else:
                raise DecodeError(f"invalid msgpack byte 0x{lead:02x} at offset {pos - start}")
            if pos + size > limit_end:
                raise DecodeError(f"an item claims {size} bytes, more than the frame may hold")
            if pos + size > end:
                break
            pos += size
        # One element is complete: count it against its container, closing every
        # container it completes.
        while stack:
            stack[-1] -= 1
            if stack[-1]:
                break
            stack.pop()
        else:
            return pos, True
    return pos, False


def _unpack_frame(frame: bytes | bytearray, limits: Limits) -> Any:
    """Build the value of one complete, scanned frame; :class:`DecodeError` only."""
    try:
        return msgpack.unpackb(
            frame,
            raw=False,
            use_list=True,
            strict_map_key=False,
            timestamp=3,
            ext_hook=_ext_hook,
            max_str_len=limits.max_str_len,
            max_bin_len=limits.max_bin_len,
            max_array_len=limits.max_array_len,
            max_map_len=limits.max_map_len,
            max_ext_len=limits.max_ext_len,
        )
    except DecodeError:
        raise
    except Exception as exc:  # ValueError, TypeError (unhashable key), OverflowError...
        raise DecodeError(f"malformed frame: {exc!r}"[:300]) from exc


#: Frames up to this size skip the header scanner (most events and headers do).
#: Every claimed item takes at least one byte, so with each per-kind length capped
#: at the frame's size, msgpack can preallocate at most size slots per level and
#: nest at most size levels: under 2 MiB for 512 bytes, whatever the bytes say.
_SMALL_FRAME = 512


def _unpack_small(data: bytes | bytearray, limits: Limits) -> Any:
    size = len(data)
    if limits is DEFAULT_LIMITS and _DEFAULTS_COVER_SMALL:
        # Every per-kind cap of the defaults is at least a small frame's size.
        str_len = bin_len = array_len = ext_len = size
        map_len = size // 2
    else:
        str_len = min(limits.max_str_len, size)
        bin_len = min(limits.max_bin_len, size)
        array_len = min(limits.max_array_len, size)
        map_len = min(limits.max_map_len, size // 2)
        ext_len = min(limits.max_ext_len, size)
    try:
        obj = msgpack.unpackb(
            data,
            raw=False,
            use_list=True,
            strict_map_key=False,
            timestamp=3,
            ext_hook=_ext_hook,
            max_str_len=str_len,
            max_bin_len=bin_len,
            max_array_len=array_len,
            max_map_len=map_len,
            max_ext_len=ext_len,
        )
    except DecodeError:
        raise
    except msgpack.ExtraData:
        raise DecodeError("trailing data after the frame") from None
    except Exception as exc:  # incomplete input, bad format, unhashable key...
        raise DecodeError(f"malformed or truncated frame: {exc!r}"[:300]) from exc
    # Each level of nesting takes at least one byte: a frame no longer than
    # max_depth cannot nest deeper than it.
    if size > limits.max_depth and (type(obj) is dict or type(obj) is list):
        check_depth(obj, limits.max_depth)
    return obj


_DEFAULTS_COVER_SMALL: Final = (
    min(
        DEFAULT_LIMITS.max_str_len,
        DEFAULT_LIMITS.max_bin_len,
        DEFAULT_LIMITS.max_array_len,
        DEFAULT_LIMITS.max_map_len * 2,
        DEFAULT_LIMITS.max_ext_len,
    )
    >= _SMALL_FRAME
)


def unpackb(data: bytes | bytearray | memoryview, *, limits: Limits = DEFAULT_LIMITS) -> Any:
    """Decode exactly one msgpack object from ``data``.

    Raises:
        DecodeError: malformed, truncated, oversized or trailing data.
    """
    if isinstance(data, memoryview):
        data = data.tobytes()
    elif not isinstance(data, (bytes, bytearray)):
        raise DecodeError(f"expected bytes, got {type(data).__name__}")
    size = len(data)
    if size > limits.max_buffer_size:
        raise DecodeError(f"a frame of {size} bytes exceeds max_buffer_size")
    if size <= _SMALL_FRAME:
        return _unpack_small(data, limits)
    # The budget is what was given: a claim beyond it is a truncated frame.
    end, complete = _scan(data, 0, 0, [], limits, size)
    if not complete:
        raise DecodeError("truncated frame: no complete object")
    if end != size:
        raise DecodeError(f"trailing data after the frame ({size - end} bytes)")
    return _unpack_frame(data, limits)


class FrameDecoder:
    """Sans-IO reader of a stream of msgpack frames (one object per frame).

    Bytes in, objects out: call :meth:`feed` with whatever arrived, then iterate
    :meth:`frames`. Partial frames stay buffered until completed. Call
    :meth:`end_of_stream` when the source is exhausted: leftover bytes then raise.
    Any error is sticky -- the decoder refuses further use, as h11's error state.

    Memory is bounded by ``limits.max_buffer_size``: bytes not yet returned as
    frames may not exceed it, and a header whose claim could not fit in it fails
    as soon as it is read.
    """

    __slots__ = ("_buf", "_error", "_limits", "_pos", "_stack", "_start")

    def __init__(self, limits: Limits = DEFAULT_LIMITS) -> None:
        self._limits = limits
        self._buf = bytearray()
        self._start = 0  # offset in _buf of the frame being scanned
        self._pos = 0  # where the scan resumes
        self._stack: list[int] = []  # items owed by each open container
        self._error: DecodeError | None = None

    def _fail(self, exc: BaseException) -> DecodeError:
        err = (
            exc if isinstance(exc, DecodeError) else DecodeError(f"malformed frame: {exc!r}"[:300])
        )
        self._error = err
        return err

    def _check(self) -> None:
        if self._error is not None:
            raise DecodeError("decoder already failed") from self._error

    def feed(self, data: bytes | bytearray | memoryview) -> None:
        """Buffer more bytes.

        Raises:
            DecodeError: the bytes not yet returned as frames would exceed
                ``max_buffer_size`` (an incomplete frame is never allowed to grow
                past it, however slowly it arrives).
        """
        self._check()
        try:
            size = memoryview(data).nbytes
            if len(self._buf) - self._start + size > self._limits.max_buffer_size:
                raise DecodeError(
                    f"more than max_buffer_size ({self._limits.max_buffer_size}) bytes "
                    "buffered without a complete frame"
                )
            if self._start:
                del self._buf[: self._start]
                self._pos -= self._start
                self._start = 0
            self._buf += data
        except Exception as exc:
            raise self._fail(exc) from exc

    def frames(self) -> Iterator[Any]:
        """Yield every complete frame buffered so far."""
        self._check()
        limits = self._limits
        while True:
            try:
                self._pos, complete = _scan(
                    self._buf, self._start, self._pos, self._stack, limits, limits.max_buffer_size
                )
                if not complete:
                    return
                obj = _unpack_frame(self._buf[self._start : self._pos], limits)
            except Exception as exc:
                raise self._fail(exc) from exc
            self._start = self._pos
            yield obj

    def pending_bytes(self) -> int:
        """Bytes fed that :meth:`frames` has not yet returned as complete frames."""
        return len(self._buf) - self._start

    def end_of_stream(self) -> None:
        """Declare the stream over; raises if a partial frame is left."""
        self._check()
        left = self.pending_bytes()
        if left:
            raise self._fail(DecodeError(f"stream ended inside a frame ({left} bytes left)"))
