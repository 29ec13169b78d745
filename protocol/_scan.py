"""The frame scanner: msgpack headers walked against limits before anything is built."""

from __future__ import annotations

from typing import Final

from ._errors import DecodeError
from ._limits import Limits

__all__ = ["scan"]

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


def scan(
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
