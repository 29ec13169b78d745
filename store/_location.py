"""Store locations as users write them: which are PostgreSQL URLs, and how one is
printed. Needs no driver (psycopg is the ``postgres`` extra's)."""

from __future__ import annotations

import urllib.parse
from typing import Final, TypeGuard

__all__ = ["is_postgres_url", "redacted_url"]

_PREFIXES: Final = ("postgresql://", "postgres://")


def is_postgres_url(spec: object) -> TypeGuard[str]:
    """Whether ``spec`` is a ``postgresql://`` (or ``postgres://``) URL."""
    return isinstance(spec, str) and spec.startswith(_PREFIXES)


def redacted_url(location: str) -> str:
    """``location`` as it may be printed: a URL's password masked (``:***@``);
    anything else as it is."""
    try:
        parts = urllib.parse.urlsplit(location)
        password = parts.password
    except ValueError:  # not a URL urllib can read: nothing it would call a password
        return location
    if password is None:
        return location
    netloc = parts.netloc.replace(f":{password}@", ":***@")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
