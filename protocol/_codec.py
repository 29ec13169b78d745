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
from typing import Any, Final

import msgpack

from ._errors import DecodeError, EncodeError
from ._ids import MessageId, RunId, SessionId, _Id
from ._limits import DEFAULT_LIMITS, Limits
from ._scan import scan
from ._time import storable_datetime

__all__ = [
    "EXT_CODES",
    "check_depth",
    "pack_shaped",
    "packb",
    "unpack_frame",
    "unpackb",
]

EXT_CODES: Final[dict[int, type[_Id]]] = {1: SessionId, 2: MessageId, 3: RunId}
_ID_CODES: Final[dict[type[_Id], int]] = {cls: code for code, cls in EXT_CODES.items()}


# Session ids recur in event after event (every source names one): their packed
# ExtType is kept, bounded, instead of rebuilt from hex each time.
_SESSION_EXT: dict[str, msgpack.ExtType] = {}
# ExtType's own __new__ re-checks the code and the payload's type in Python;
# ours are a registered code and bytes, so the tuple is made directly.
_tuple_new = tuple.__new__
_ExtType = msgpack.ExtType


def _default(obj: Any) -> Any:
    kind = type(obj)
    if kind is SessionId:
        ext = _SESSION_EXT.get(obj)
        if ext is None:
            if len(_SESSION_EXT) >= 4096:
                _SESSION_EXT.clear()
            ext = _SESSION_EXT[obj] = _tuple_new(
                _ExtType, (_ID_CODES[SessionId], bytes.fromhex(obj))
            )
        return ext
    code = _ID_CODES.get(kind)
    if code is not None:
        return _tuple_new(_ExtType, (code, bytes.fromhex(obj)))
    if isinstance(obj, tuple):
        return list(obj)
    if isinstance(obj, _dt.datetime):
        # Aware datetimes are packed natively (datetime=True); only naive ones land here.
        raise EncodeError("cannot pack a naive datetime; use an aware (UTC) datetime")
    if isinstance(obj, str):  # another str subclass: pack as its plain value
        return str(obj)
    if kind is int:  # msgpack hands over only the ints it has no format for
        raise EncodeError(
            f"cannot pack an int of {obj.bit_length()} bits: msgpack holds ints from"
            " -2**63 to 2**64 - 1 (send a larger one as a str)"
        )
    raise EncodeError(f"cannot pack a value of type {type(obj).__name__}")


#: Types that hold nothing to walk (what most values are made of): the shape check
#: asks the others whether they are a tuple subclass.
LEAVES: Final = frozenset({str, int, float, bool, type(None), bytes, SessionId, MessageId, RunId})


def _check_shape(obj: Any, max_depth: int) -> None:
    """Refuse nesting deeper than ``max_depth``, containers used as map keys, and
    datetimes the log could not read back (:func:`._time.storable_datetime`).

    Tuples count as arrays (they pack as arrays), and so do tuple subclasses
    (a namedtuple): packing makes them lists. A container key would decode as an
    unhashable list. Other subclasses of the builtin containers need no walk:
    packing refuses them.
    """
    kind = type(obj)
    if kind is not dict and kind is not list and kind is not tuple:
        if kind is _dt.datetime and not storable_datetime(obj):
            raise _unreadable(obj)
        if kind in LEAVES or not isinstance(obj, tuple):
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
                if kind is _dt.datetime and not storable_datetime(k):
                    raise _unreadable(k)
                if kind not in LEAVES and isinstance(k, tuple):
                    raise EncodeError(f"a map key must not be a container, got {kind.__name__}")
                kind = type(v)
                if kind is dict or kind is list or kind is tuple:
                    push((v, depth + 1))
                elif kind is _dt.datetime and not storable_datetime(v):
                    raise _unreadable(v)
                elif kind not in LEAVES and isinstance(v, tuple):
                    push((v, depth + 1))
        else:
            for v in value:
                kind = type(v)
                if kind is dict or kind is list or kind is tuple:
                    push((v, depth + 1))
                elif kind is _dt.datetime and not storable_datetime(v):
                    raise _unreadable(v)
                elif kind not in LEAVES and isinstance(v, tuple):
                    push((v, depth + 1))


def _unreadable(value: _dt.datetime) -> EncodeError:
    what = "a naive datetime" if value.tzinfo is None else "a datetime outside the UTC range"
    return EncodeError(f"cannot pack {what}; use an aware (UTC) datetime")


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


#: A thread's packer starts with a buffer this size (msgpack's own default is
#: 256 KiB: with an agent per thread, or a greenlet-local per actor under
#: monkey-patching, that was 256 KiB an agent) ...
_FIRST_BUFFER: Final = 4096
#: ... and is dropped after packing a frame larger than this: its buffer never
#: shrinks, and one large output would stay allocated for the thread's life.
_KEPT_BUFFER: Final = 65536


def _packer() -> msgpack.Packer:
    # One Packer per thread: building one per call costs ~0.7 us of a ~3 us pack.
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = _local.packer = msgpack.Packer(
            default=_default,
            use_bin_type=True,
            datetime=True,
            strict_types=True,
            buf_size=_FIRST_BUFFER,
        )
    return packer


def pack_shaped(obj: Any, limits: Limits = DEFAULT_LIMITS) -> bytes:
    """:func:`packb` for a value whose nesting the caller already checked.

    The event encoders check only their free-form fields (content, output,
    payload): the rest of an event's map has a fixed, shallow shape.
    """
    packer = getattr(_local, "packer", None)
    if packer is None:
        packer = _packer()
    try:
        data: bytes = packer.pack(obj)
    except EncodeError:
        _local.packer = None  # a failed pack may leave bytes in its buffer
        raise
    except Exception as exc:  # TypeError, OverflowError ... or a hostile object's own
        _local.packer = None
        raise EncodeError(f"cannot pack value: {type(exc).__name__}: {exc}"[:500]) from exc
    size = len(data)
    if size > _KEPT_BUFFER:
        _local.packer = None
    # No str, bin, array or map in a frame can be longer than the frame itself, so
    # only a frame past the smallest of those bounds (or a max_ext_len below the
    # 16 bytes of an id) needs the exact check: read it back with the same limits.
    # (The default limits' bound is below their max_buffer_size: one test a frame.)
    if limits is DEFAULT_LIMITS and size <= _DEFAULT_SAFE:
        return data
    if size > limits.max_buffer_size:
        raise EncodeError(f"a frame of {size} bytes exceeds max_buffer_size")
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


_DEFAULT_SAFE: Final = min(_size_safe(DEFAULT_LIMITS), DEFAULT_LIMITS.max_buffer_size)


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


def unpack_frame(frame: bytes | bytearray, limits: Limits) -> Any:
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
    # Each level of nesting takes a container header byte of its own, and ids (the
    # only ext values) nest nothing: a frame with at most max_depth bytes that
    # could be such a header cannot nest deeper. Counting them is one C pass
    # (0.3 us for a 144-byte header), walking the decoded value 4.8 us.
    if (
        size > limits.max_depth
        and (type(obj) is dict or type(obj) is list)
        and len(data.translate(None, _NOT_CONTAINER_TAG)) > limits.max_depth
    ):
        check_depth(obj, limits.max_depth)
    return obj


# Every byte value but msgpack's container headers: fixmap, fixarray, array 16/32
# and map 16/32.
_NOT_CONTAINER_TAG: Final = bytes(
    b for b in range(256) if not (0x80 <= b <= 0x9F or 0xDC <= b <= 0xDF)
)


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
    end, complete = scan(data, 0, 0, [], limits, size)
    if not complete:
        raise DecodeError("truncated frame: no complete object")
    if end != size:
        raise DecodeError(f"trailing data after the frame ({size - end} bytes)")
    return unpack_frame(data, limits)
