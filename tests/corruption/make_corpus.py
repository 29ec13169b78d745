"""A corpus of damaged databases (issue 19 points 4 and 5): "corruption stays local".

Every case starts from a healthy database freshly written by the real store (no
binary is checked in), then damages it by hand, with raw SQL or raw bytes. The
healthy database holds two trees::

    root (user)                      side (user)
    ├── alpha   continuable          ├── side-1  continuable
    │   └── alpha-1  one-shot        └── side-2  continuable
    ├── beta    continuable
    └── gamma   one-shot

Each session's log is a descriptor (children) and one turn (``turn/start`` at
seq 1 for a child, 0 for a root; then a message; then ``turn/end``).

A :class:`Case` carries the ids and what every surface must say about it: the
error code of a file no command can read (``error``), the diagnostics ``subagents
tree`` must name (``tree_damaged``), the detached trees it prints, the sessions it
must still list (``healthy``), which seqs ``subagents show`` reports (``show``),
and what ``list_children`` / ``list_descendants`` return (``listings``).

Importable (``CASES``, :func:`build`, :func:`build_pg`) and a script::

    python tests/corruption/make_corpus.py DIR [CASE ...]

writes the SQLite cases (all, or those named) into DIR and prints each file with
the ids it damaged.
"""

from __future__ import annotations

import math
import sqlite3
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "catalog"))

from catalog_kit import (
    GARBAGE,
    Execute,
    at,
    continuable,
    garble,
    one_shot,
    reparent,
    sqlite_execute,
    turn,
    write_child,
)
from subagents.protocol import (
    ErrorCode,
    MessageEvent,
    SessionHeader,
    new_message_id,
    new_session_id,
)
from subagents.store import SessionStore, SqliteStore

__all__ = ["CASES", "FILE_CASES", "PG_CASES", "Case", "Expect", "Ids", "build", "build_pg"]

#: What a stored key of two bytes is called (``StoredKey``): the bad-key case's id.
BAD_KEY = b"\x01\x02"
BAD_KEY_NAME = "x'0102'"
NON_FINITE = {"nan": math.nan, "inf": math.inf, "ninf": -math.inf, "fine": 1.5}


@dataclass
class Ids:
    """The healthy database's sessions (headers, by name)."""

    root: SessionHeader
    alpha: SessionHeader
    alpha1: SessionHeader
    beta: SessionHeader
    gamma: SessionHeader
    side: SessionHeader
    side1: SessionHeader
    side2: SessionHeader

    def all(self) -> list[str]:
        return [str(h.id) for h in vars(self).values()]


@dataclass
class Expect:
    """An expected catalog listing: ``list_children(parent)`` if ``children``, else
    ``list_descendants(parent)``; row ids in order, diagnostic ids (any order)."""

    parent: str
    rows: list[str]
    diagnostics: set[str]
    children: bool = True


@dataclass
class Case:
    """A damaged database and what every surface must say about it."""

    name: str
    where: str  # the file (or postgresql:// URL)
    ids: Ids
    error: str | None = None  # every command fails with this code (rc 2)
    tree_damaged: set[str] = field(default_factory=set)  # ids tree's diagnostics name
    detached: dict[str, str] = field(default_factory=dict)  # tree entry id -> reason
    healthy: set[str] = field(default_factory=set)  # still listed by tree (row or entry)
    show: tuple[str, list[int]] | None = None  # a session; the seqs show reports
    show_error: str | None = None  # show of that session fails with this code
    listings: list[Expect] = field(default_factory=list)
    runtime_error: str | None = None  # Runtime(where) refuses with this code
    listing_error: str | None = None  # the runtime opens; a listing raises this code
    extra: dict[str, Any] = field(default_factory=dict)


# -- the healthy database ----------------------------------------------------------


def write_healthy(store: SessionStore, *, non_finite: bool = False) -> Ids:
    """The two healthy trees, written through ``store``."""
    root = write_child(store, None, turn(0, 0, 1), origin="user", label="root", created_at=at(0))
    if non_finite:
        store.append(root.id, [MessageEvent(message_id=new_message_id(), content=NON_FINITE)])
    alpha = write_child(store, root.id, [continuable("alpha"), *turn(0, 1, 2)], created_at=at(1))
    alpha1 = write_child(store, alpha.id, [one_shot("alpha-1"), *turn(0, 2, 3)], created_at=at(2))
    beta = write_child(store, root.id, [continuable("beta"), *turn(0, 1, 3)], created_at=at(3))
    gamma = write_child(store, root.id, [one_shot("gamma"), *turn(0, 1, 4)], created_at=at(4))
    side = write_child(store, None, turn(0, 5, 6), origin="user", label="side", created_at=at(5))
    side1 = write_child(store, side.id, [continuable("side-1"), *turn(0, 6, 7)], created_at=at(6))
    side2 = write_child(store, side.id, [continuable("side-2"), *turn(0, 6, 8)], created_at=at(7))
    return Ids(root, alpha, alpha1, beta, gamma, side, side1, side2)


def _healthy_except(ids: Ids, *names: str) -> set[str]:
    gone = {str(getattr(ids, n).id) for n in names}
    return {i for i in ids.all() if i not in gone}


# -- row damage (SQLite and PostgreSQL) ----------------------------------------------

RowDamage = Callable[[Execute, Ids, Case], None]


def _healthy(_x: Execute, ids: Ids, case: Case) -> None:
    case.healthy = set(ids.all())
    case.show = (str(ids.root.id), [])
    case.listings = [
        Expect(str(ids.root.id), [str(ids.alpha.id), str(ids.beta.id), str(ids.gamma.id)], set())
    ]


def _bad_key(x: Execute, ids: Ids, case: Case) -> None:
    """A child's ``sessions.id`` that is not 16 bytes (issue 19 point 4.1)."""
    assert x("UPDATE sessions SET id = ? WHERE id = ?", (BAD_KEY, ids.beta.id.to_bytes())) == 1
    case.tree_damaged = {BAD_KEY_NAME}
    case.healthy = _healthy_except(ids, "beta")
    case.show = (str(ids.root.id), [])
    r = str(ids.root.id)
    kids = [str(ids.alpha.id), str(ids.gamma.id)]
    case.listings = [
        Expect(r, kids, {BAD_KEY_NAME}),
        Expect(
            r, [str(ids.alpha.id), str(ids.alpha1.id), str(ids.gamma.id)], {BAD_KEY_NAME}, False
        ),
    ]


def _corrupt_root_header(x: Execute, ids: Ids, case: Case) -> None:
    """One root's header does not decode (issue 19 point 4.2)."""
    assert x("UPDATE sessions SET header = ? WHERE id = ?", (GARBAGE, ids.root.id.to_bytes())) == 1
    r = str(ids.root.id)
    case.tree_damaged = {r}
    case.healthy = set(ids.all())  # the root is still the entry of its tree
    case.show = (r, [-1])
    kids = [str(ids.alpha.id), str(ids.beta.id), str(ids.gamma.id)]
    everyone = [str(ids.alpha.id), str(ids.alpha1.id), str(ids.beta.id), str(ids.gamma.id)]
    case.listings = [Expect(r, kids, set()), Expect(r, everyone, set(), False)]


def _cycle(x: Execute, ids: Ids, case: Case) -> None:
    """Two children whose parent links name each other (issue 19 point 4.3)."""
    reparent(x, ids.side1, ids.side2.id)
    reparent(x, ids.side2, ids.side1.id)
    s1, s2 = str(ids.side1.id), str(ids.side2.id)
    case.tree_damaged = {s1, s2}
    case.detached = {s1: "cycle"}
    case.healthy = set(ids.all())
    case.show = (s1, [])
    case.listings = [
        Expect(str(ids.side.id), [], set()),  # no longer the side's children
        Expect(s1, [s2], set()),
        Expect(s1, [s2], {s1}, False),  # the loop through the listed root is named
    ]


def _self_parent(x: Execute, ids: Ids, case: Case) -> None:
    """A session that names itself as its parent."""
    reparent(x, ids.side2, ids.side2.id)
    s2 = str(ids.side2.id)
    case.tree_damaged = {s2}
    case.detached = {s2: "cycle"}
    case.healthy = set(ids.all())
    case.show = (s2, [])
    case.listings = [
        Expect(str(ids.side.id), [str(ids.side1.id)], set()),
        Expect(s2, [], {s2}, False),
    ]


def _missing_parent(x: Execute, ids: Ids, case: Case) -> None:
    """A header whose parent is not stored: it and its subtree are detached."""
    missing = new_session_id()
    reparent(x, ids.alpha, missing)
    a = str(ids.alpha.id)
    case.tree_damaged = {a}
    case.detached = {str(missing): "missing-parent"}
    case.healthy = set(ids.all())
    case.show = (a, [])
    case.listings = [
        Expect(str(ids.root.id), [str(ids.beta.id), str(ids.gamma.id)], set()),
        Expect(str(missing), [a], set()),
        Expect(str(missing), [a, str(ids.alpha1.id)], set(), False),
    ]
    case.extra["missing"] = str(missing)


def _garbled_root_event(x: Execute, ids: Ids, case: Case) -> None:
    """A root's log holds an event that does not decode (its message, seq 1)."""
    garble(x, ids.root.id, 1)
    r = str(ids.root.id)
    case.tree_damaged = {r}
    case.healthy = set(ids.all())
    case.show = (r, [1])
    kids = [str(ids.alpha.id), str(ids.beta.id), str(ids.gamma.id)]
    case.listings = [Expect(r, kids, set())]


def _garbled_descriptor(x: Execute, ids: Ids, case: Case) -> None:
    """A child's descriptor (seq 0) does not decode: a diagnostic, its child still listed."""
    garble(x, ids.alpha.id, 0)
    a = str(ids.alpha.id)
    case.tree_damaged = {a}
    case.healthy = _healthy_except(ids, "alpha")
    case.show = (a, [0])
    r = str(ids.root.id)
    case.listings = [
        Expect(r, [str(ids.beta.id), str(ids.gamma.id)], {a}),
        Expect(r, [str(ids.alpha1.id), str(ids.beta.id), str(ids.gamma.id)], {a}, False),
    ]


def _deleted_descriptor(x: Execute, ids: Ids, case: Case) -> None:
    """A child's descriptor row (seq 0) is gone: no identity, a gap in its log."""
    count = x("DELETE FROM events WHERE session = ? AND seq = 0", (ids.gamma.id.to_bytes(),))
    assert count == 1
    g = str(ids.gamma.id)
    case.tree_damaged = {g}
    case.healthy = _healthy_except(ids, "gamma")
    case.show = (g, [0])
    r = str(ids.root.id)
    case.listings = [Expect(r, [str(ids.alpha.id), str(ids.beta.id)], {g})]


def _non_finite(_x: Execute, ids: Ids, case: Case) -> None:
    """A root's log holds NaN and infinities (issue 19 point 4.5): JSON stays strict."""
    case.healthy = set(ids.all())
    case.show = (str(ids.root.id), [])


def _column_mismatch(x: Execute, ids: Ids, case: Case) -> None:
    """A parent column that disagrees with its header (which is authoritative)."""
    count = x(
        "UPDATE sessions SET parent = ? WHERE id = ?",
        (ids.root.id.to_bytes(), ids.side1.id.to_bytes()),
    )
    assert count == 1
    s1 = str(ids.side1.id)
    case.healthy = set(ids.all())  # the tree reads the headers: nothing is lost
    case.show = (s1, [])
    kids = [str(ids.alpha.id), str(ids.beta.id), str(ids.gamma.id)]
    case.listings = [Expect(str(ids.root.id), kids, {s1})]


#: Damage done to rows, the same on SQLite and PostgreSQL.
ROW_CASES: dict[str, RowDamage] = {
    "healthy": _healthy,
    "bad_key": _bad_key,
    "corrupt_root_header": _corrupt_root_header,
    "cycle": _cycle,
    "self_parent": _self_parent,
    "missing_parent": _missing_parent,
    "garbled_root_event": _garbled_root_event,
    "garbled_descriptor": _garbled_descriptor,
    "deleted_descriptor": _deleted_descriptor,
    "non_finite": _non_finite,
    "column_mismatch": _column_mismatch,
}


# -- file damage (SQLite only) --------------------------------------------------------

FileDamage = Callable[[Path, Ids, Case], None]


def _root_page_offset(path: Path, table: str) -> int:
    """Where ``table``'s root B-tree page starts (never page 1, the schema's)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        (page,) = conn.execute("SELECT rootpage FROM sqlite_schema WHERE name = ?", (table,))
        (size,) = conn.execute("PRAGMA page_size").fetchone()
    finally:
        conn.close()
    assert int(page[0]) > 1
    return (int(page[0]) - 1) * int(size)


def _truncated(path: Path, ids: Ids, case: Case) -> None:
    """The file cut short (``head -c``): SQLite finds it malformed."""
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])
    case.error = case.runtime_error = ErrorCode.DATABASE_CORRUPT


def _overwrite(path: Path, table: str) -> None:
    offset = _root_page_offset(path, table)
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * 3000)


def _page_corrupt(path: Path, ids: Ids, case: Case) -> None:
    """3000 bytes of 0xff over the sessions table's root page (its header included)."""
    _overwrite(path, "sessions")
    # Opening reads the schema only: the damage is met by the first read of a session.
    case.error = case.listing_error = ErrorCode.DATABASE_CORRUPT


def _events_page_corrupt(path: Path, ids: Ids, case: Case) -> None:
    """3000 bytes of 0xff over the events table's root page: every header still reads,
    no log does. Each session is a diagnostic naming DATABASE_CORRUPT; nothing raises."""
    _overwrite(path, "events")
    case.tree_damaged = set(ids.all())
    case.healthy = {str(ids.root.id), str(ids.side.id)}  # the tree entries remain
    case.show = (str(ids.root.id), [0])
    r = str(ids.root.id)
    kids = {str(ids.alpha.id), str(ids.beta.id), str(ids.gamma.id)}
    case.listings = [Expect(r, [], kids)]
    case.extra["code_in_detail"] = ErrorCode.DATABASE_CORRUPT


def _foreign_text(path: Path, ids: Ids, case: Case) -> None:
    path.write_text("these are my notes, not a database\n" * 50)
    case.error = case.runtime_error = ErrorCode.NOT_A_DATABASE


def _empty(path: Path, ids: Ids, case: Case) -> None:
    path.write_bytes(b"")
    case.error = ErrorCode.NOT_A_DATABASE  # to the CLI; a store takes it as a new database


def _other_application(path: Path, ids: Ids, case: Case) -> None:
    path.unlink()
    conn = sqlite3.connect(path)
    try:
        with conn:
            conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
            conn.execute("INSERT INTO notes (body) VALUES ('hello')")
    finally:
        conn.close()
    case.error = case.runtime_error = ErrorCode.NOT_A_DATABASE


FILE_CASES: dict[str, FileDamage] = {
    "truncated": _truncated,
    "page_corrupt": _page_corrupt,
    "events_page_corrupt": _events_page_corrupt,
    "foreign_text": _foreign_text,
    "empty": _empty,
    "other_application": _other_application,
}

CASES: tuple[str, ...] = (*ROW_CASES, *FILE_CASES)
#: The row cases run on PostgreSQL too (the same per-row diagnostics).
PG_CASES: tuple[str, ...] = tuple(ROW_CASES)


def build(name: str, directory: Path) -> Case:
    """Write the case ``name`` as ``directory / f"{name}.db"``."""
    path = directory / f"{name}.db"
    with SqliteStore(path) as store:
        ids = write_healthy(store, non_finite=name == "non_finite")
    case = Case(name, str(path), ids)
    if name in ROW_CASES:
        ROW_CASES[name](sqlite_execute(path), ids, case)
    else:
        FILE_CASES[name](path, ids, case)
    return case


def build_pg(name: str, url: str) -> Case:
    """Write the row case ``name`` into the (new) schema of the ``postgresql://`` ``url``."""
    from subagents.store import PostgresStore

    with PostgresStore(url) as store:
        ids = write_healthy(store, non_finite=name == "non_finite")
    case = Case(name, url, ids)
    ROW_CASES[name](pg_execute(url), ids, case)
    return case


def pg_execute(url: str) -> Execute:
    """An :data:`Execute` on the store tables of a ``postgresql://...?schema=`` URL."""
    import psycopg
    from subagents.store._location import split_schema

    conninfo, schema = split_schema(url)

    def execute(sql: str, params: tuple[Any, ...]) -> int:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            return conn.execute(sql.replace("?", "%s"), params).rowcount  # type: ignore[arg-type]

    return execute


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    directory = Path(argv[0])
    directory.mkdir(parents=True, exist_ok=True)
    for name in argv[1:] or CASES:
        if name not in CASES:
            print(f"unknown case {name!r}; the cases: {', '.join(CASES)}", file=sys.stderr)
            return 2
        case = build(name, directory)
        damaged = ", ".join(sorted(case.tree_damaged)) or case.error or "-"
        print(f"{case.where}  damaged: {damaged}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
