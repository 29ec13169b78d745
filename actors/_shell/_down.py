"""A store that failed as a whole, told apart from a damaged record.

``tree`` and ``show`` print what decodes and name each damaged record (exit 1).
A store that stops answering mid-read -- a PostgreSQL server that went down, a
pool with no connection to give, a store closed under the reader -- damages no
record: every read after it fails alike. Listed as per-session diagnostics, it
printed a tree of ``[unavailable]`` lines and wrong states (a session whose
inbox could not be read showed none) and exited 1 as for damage, after a retry
per session. These helpers re-raise it instead: the command prints one line and
exits 2, as when the store cannot be opened.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any, Final

from subagents.protocol import ErrorCode, SubagentError

__all__ = ["raise_if_down", "raise_if_listing_down"]

#: Codes of a store that failed as a whole (no record of it is to blame).
_DOWN: Final = frozenset(
    {ErrorCode.PERSISTENCE_UNAVAILABLE, ErrorCode.TIMEOUT, ErrorCode.STORE_CLOSED}
)
#: A diagnostic's detail is its error's text: ``[CODE] message``.
_CODED: Final = re.compile(r"\[([A-Z_]+)\] (.*)", re.DOTALL)


def raise_if_down(exc: SubagentError) -> None:
    """Raise ``exc`` when it says the store failed as a whole; else return."""
    if exc.code in _DOWN:
        raise exc


def raise_if_listing_down(diagnostics: Iterable[Any]) -> None:
    """Raise the failure of the store behind a listing's ``unavailable``
    diagnostic (the catalog keeps one per session whose log it could not read);
    a diagnostic of anything else is the listing's to show."""
    for diag in diagnostics:
        found = _CODED.match(diag.detail) if diag.kind == "unavailable" else None
        if found is not None and found.group(1) in _DOWN:
            raise SubagentError(found.group(2), code=found.group(1))
