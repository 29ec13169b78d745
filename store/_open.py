"""``open_store``: turn the ``Runtime(store=...)`` argument into a store."""

from __future__ import annotations

import os

from ._base import SessionStore
from ._sqlite import SqliteStore
from ._validate import invalid

__all__ = ["open_store"]


def open_store(spec: SessionStore | str | os.PathLike[str] | None) -> SessionStore | None:
    """Resolve a store specification.

    Args:
        spec: ``None`` (no persistence: returns ``None``), a path (``str`` or
            ``os.PathLike``: opens a :class:`SqliteStore` there), or a
            :class:`SessionStore` (returned as is; the caller keeps ownership).

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` for anything else; the errors of
            :class:`SqliteStore` for a path it cannot open.
    """
    if spec is None or isinstance(spec, SessionStore):
        return spec
    if isinstance(spec, (str, os.PathLike)):
        return SqliteStore(spec)
    raise invalid(f"store must be None, a path or a SessionStore, got {type(spec).__name__}")
