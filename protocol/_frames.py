"""Sans-IO decoding of a stream of msgpack frames."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ._codec import unpack_frame
from ._errors import DecodeError
from ._limits import DEFAULT_LIMITS, Limits
from ._scan import scan

__all__ = ["FrameDecoder"]


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
                self._pos, complete = scan(
                    self._buf, self._start, self._pos, self._stack, limits, limits.max_buffer_size
                )
                if not complete:
                    return
                obj = unpack_frame(self._buf[self._start : self._pos], limits)
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
