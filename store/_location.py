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


#: Query parameters of a libpq URL that carry a secret.
_SECRET_PARAMETERS: Final = frozenset({"password", "sslpassword"})


def redacted_url(location: str) -> str:
    """``location`` as it may be printed: a URL's password masked (``:***@``, and
    the value of a ``password`` or ``sslpassword`` query parameter); anything else
    as it is."""
    try:
        parts = urllib.parse.urlsplit(location)
        password = parts.password
    except ValueError:  # not a URL urllib can read: nothing it would call a password
        return location
    if password is not None:
        netloc = parts.netloc.replace(f":{password}@", ":***@")
        parts = parts._replace(netloc=netloc)
    if parts.query:
        items = parts.query.split("&")
        for i, item in enumerate(items):
            key, eq, _value = item.partition("=")
            if eq and urllib.parse.unquote_plus(key).lower() in _SECRET_PARAMETERS:
                items[i] = f"{key}=***"
        parts = parts._replace(query="&".join(items))
    return urllib.parse.urlunsplit(parts)
