"""Bounds applied to untrusted bytes (one :class:`Limits` per decoder)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["DEFAULT_LIMITS", "Limits"]


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
