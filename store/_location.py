"""Store locations as users write them: which are PostgreSQL URLs, and how one is
printed. Needs no driver (psycopg is the ``postgres`` extra's)."""

from __future__ import annotations

import re
import urllib.parse
from typing import Final, TypeGuard

from ._validate import invalid

__all__ = ["is_postgres_url", "redacted_url", "split_schema"]

_PREFIXES: Final = ("postgresql://", "postgres://")


def is_postgres_url(spec: object) -> TypeGuard[str]:
    """Whether ``spec`` is a ``postgresql://`` (or ``postgres://``) URL."""
    return isinstance(spec, str) and spec.startswith(_PREFIXES)


#: Query parameters of a libpq URL that carry a secret.
_SECRET_PARAMETERS: Final = frozenset({"password", "sslpassword"})
#: ``user:password@`` at the start of a URL's authority, however the rest reads.
_USERINFO_PASSWORD: Final = re.compile(r"(://[^/?#@:]*):[^/?#@]*@")


def _joined(parts: urllib.parse.SplitResult) -> str:
    """``parts`` as a URL again, its ``//`` kept when the authority is empty:
    ``urlunsplit`` makes ``postgresql:///agents?host=/run/postgresql`` (libpq's
    URL of a Unix socket) ``postgresql:/agents?...``, which libpq refuses."""
    url = f"{parts.scheme}://{parts.netloc}{parts.path}"
    return (
        url
        + (f"?{parts.query}" if parts.query else "")
        + (f"#{parts.fragment}" if parts.fragment else "")
    )


def redacted_url(location: str) -> str:
    """``location`` as it may be printed: a URL's password masked (``:***@``, and
    the value of a ``password`` or ``sslpassword`` query parameter); anything else
    as it is."""
    try:
        parts = urllib.parse.urlsplit(location)
        password = parts.password
    except ValueError:  # not a URL urllib can read (``[::1`` unclosed): mask what reads so
        return _USERINFO_PASSWORD.sub(r"\1:***@", location, count=1)
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
    return _joined(parts) if "://" in location else urllib.parse.urlunsplit(parts)


def split_schema(url: str) -> tuple[str, str | None]:
    """``(conninfo, schema)``: our ``schema`` query parameter taken out of a
    PostgreSQL URL, the rest as libpq reads it.

    Raises:
        SubagentError: ``INVALID_ARGUMENT``, a URL that cannot be split (an
            unclosed ``[`` of an IPv6 host), or that names ``schema`` twice.
    """
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:
        raise invalid(f"not a URL that can be read: {redacted_url(url)} ({exc})") from None
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    named = [v for k, v in query if k == "schema"]
    if len(named) > 1:  # which one was meant? (libpq takes the last, urllib the first)
        raise invalid(f"the URL names schema {len(named)} times: {redacted_url(url)}")
    schema = named[0] if named else None
    rest = urllib.parse.urlencode([(k, v) for k, v in query if k != "schema"])
    return _joined(parts._replace(query=rest)), schema
