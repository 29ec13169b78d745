"""``open_store``: turn the ``Runtime(store=...)`` argument into a store."""

from __future__ import annotations

import os

from subagents.protocol import ErrorCode, SubagentError

from ._base import SessionStore
from ._location import is_postgres_url
from ._sqlite import SqliteStore
from ._validate import invalid

__all__ = ["open_store"]


def open_store(spec: SessionStore | str | os.PathLike[str] | None) -> SessionStore | None:
    """Resolve a store specification.

    Args:
        spec: ``None`` (no persistence: returns ``None``), a
            ``postgresql://`` URL (opens a :class:`~._postgres.PostgresStore`;
            needs the ``postgres`` extra), a path (``str`` or ``os.PathLike``:
            opens a :class:`SqliteStore` there), or a :class:`SessionStore`
            (returned as is; the caller keeps ownership).

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` for anything else; the errors of
            the store for a location it cannot open; ``PERSISTENCE_UNAVAILABLE``
            for a PostgreSQL URL without psycopg installed.
    """
    if spec is None or isinstance(spec, SessionStore):
        return spec
    if is_postgres_url(spec):
        try:
            from ._postgres import PostgresStore
        except ImportError as exc:
            raise SubagentError(
                f"a PostgreSQL store needs psycopg: pip install 'subagents[postgres]' ({exc})",
                code=ErrorCode.PERSISTENCE_UNAVAILABLE,
            ) from exc
        return PostgresStore(spec)
    if isinstance(spec, (str, os.PathLike)):
        return SqliteStore(spec)
    raise invalid(f"store must be None, a path or a SessionStore, got {type(spec).__name__}")
