"""The text form of ``subagents tree``'s entries (their ``--json`` data as lines)."""

from __future__ import annotations

import datetime as dt
import unicodedata
from typing import Any, Final

from ._outline import Outline

__all__ = ["active_text", "entry_outline", "printable", "state_text", "utc_seconds"]

#: Bidirectional embeddings, overrides and isolates: they reorder what follows.
_BIDI: Final = frozenset("\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")


def printable(text: str) -> str:
    """``text`` safe on one terminal line: control characters (a newline, an escape
    sequence's ESC), line and paragraph separators and bidirectional controls as
    Python escapes (``\\n``, ``\\x1b``); anything else as it is."""
    if text.isprintable():
        return text
    return "".join(
        ch.encode("unicode_escape").decode("ascii")
        if unicodedata.category(ch) in ("Cc", "Zl", "Zp") or ch in _BIDI
        else ch
        for ch in text
    )


def entry_outline(title: str, data: dict[str, Any]) -> Outline:
    """One tree entry of ``subagents tree`` as text: its title, each descendant's
    line below its parent, each diagnostic below the session it names."""
    top = Outline(title)
    nodes: dict[str, Outline] = {data["id"]: top}
    pending: dict[str, list[dict[str, Any]]] = {}
    for diag in data["diagnostics"]:
        pending.setdefault(diag["id"], []).append(diag)

    def line(diag: dict[str, Any]) -> str:
        return f"[{diag['kind']}] {diag['id']}: {diag['detail']}"

    def node(key: str | None, seen: frozenset[str] = frozenset()) -> Outline:
        """The node of ``key``; a broken session without a row is its diagnostic line."""
        if key is None:
            return top
        found = nodes.get(key)
        if found is not None:
            return found
        own = pending.get(key)
        if not own or key in seen:
            return top
        parent = node(own[0]["parent_id"], seen | {key})
        found = nodes[key] = parent.add(line(own.pop(0)))
        return found

    for row in data["descendants"]:
        text = (
            f"{printable(row['label'] or '(unlabelled)')}  {row['mode']}  {state_text(row)}"
            f"  {active_text(row['active_seconds'])}  {row['id']}"
        )
        nodes[row["id"]] = node(row["parent_id"]).add(text)
    # A session's diagnostics hang below its node (the first one is the node of a
    # session that has no row).
    for key, diags in pending.items():
        if diags:
            target = node(key)
            while diags:
                target.add(line(diags.pop(0)))
    return top


def state_text(data: dict[str, Any]) -> str:
    """``settled, last active 2026-01-01 10:00:00Z`` (seconds, UTC)."""
    at = data["last_activity"]
    waiting = data.get("inbox") or 0
    inbox = f", {waiting} in the inbox" if waiting else ""
    if at is None:
        return f"{data['state']}{inbox}"
    return f"{data['state']}, last active {utc_seconds(at)}{inbox}"


def utc_seconds(at: str) -> str:
    """ISO 8601 text of an aware time as ``2026-01-01 10:00:00Z`` (UTC, seconds
    cut, not rounded)."""
    # Stored times are UTC, so their text is cut, not parsed (6,000 lines of a
    # tree: 30 ms of `subagents tree`); any other offset is converted, as is a
    # year before 1000 (strftime writes it unpadded).
    if len(at) >= 25 and at.endswith("+00:00") and at[10] == "T" and at[0] != "0":
        return f"{at[:10]} {at[11:19]}Z"
    return dt.datetime.fromisoformat(at).astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def active_text(seconds: float | None) -> str:
    """``active 12.5 ms`` (``active ?`` when unknown)."""
    return "active ?" if seconds is None else f"active {seconds * 1000:.1f} ms"
