"""``subagents tree``: every stored session tree, with its damage where it is.

One header scan (:func:`~subagents.actors._catalog.forest`) says where every
stored session hangs; each tree is then listed from the durable catalog. Damage
stays local and is named, never lost:

* a root whose header does not decode is still a tree (its children are found
  through their own headers), with a ``corrupt`` diagnostic for the root;
* a row keyed by no session id is a diagnostic naming its stored key
  (``x'0102'``) under the parent its column names;
* sessions no root reaches are *detached* trees: below a parent the database
  does not hold (``"missing-parent"``), or in a parent-link loop (``"cycle"``),
  each member named by a diagnostic.

Each session shows its state (:mod:`~subagents.actors._catalog._state`:
running, waiting, cancelled, ended, settled) and its last activity, read from its
log and the store's inbox.

In the text output a diagnostic is a line ``[kind] id: detail`` below the
session's node; a broken session that has no row is that line, below its parent,
and the rows below it hang below the line.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import itertools
import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.text import Text
from subagents.actors._catalog import (
    Catalog,
    Detached,
    Forest,
    Listing,
    ProjectionRegistry,
    SessionState,
    forest,
    session_state_unit,
    subagent_timing_unit,
    subagent_unit,
)
from subagents.protocol import ErrorCode, ReportEvent, SessionId, SubagentError
from subagents.store import SessionStore, StoredKey

from ._down import raise_if_down, raise_if_listing_down
from ._output import dumps
from ._tree_reads import TreeReads, damaged_entry, gap_of, stored_state
from ._tree_text import active_text, entry_outline, printable, state_text

__all__ = ["collect_trees", "damaged_entry", "run_tree", "stored_state", "watch_tree"]

Key = SessionId | StoredKey

#: Sessions whose logs and inboxes are read ahead together (a few statements).
_WINDOW = 500


@dataclass(slots=True)
class _Entry:
    title: str  # the text output's top line
    data: dict[str, Any]  # the --json entry


def _chain(loop: tuple[Key, ...], member: Key) -> str:
    i = loop.index(member)
    return " -> ".join((*loop[i:], *loop[:i], member))


class _Trees:
    def __init__(self, store: SessionStore, db: str) -> None:
        self.store = store
        self.db = db
        # What a session's line shows besides its identity (which its listing has).
        self.facts_units = ProjectionRegistry()
        self.facts_units.register(subagent_timing_unit)
        self.facts_units.register(session_state_unit)
        self.all_units = ProjectionRegistry()  # a tree's top: its label may come from its log
        for unit in (subagent_unit, subagent_timing_unit, session_state_unit):
            self.all_units.register(unit)
        # The logs, inboxes and leases of the trees being shown, read a window of
        # sessions at a time (a statement per session was most of the command);
        # a log the listing folds for an identity is folded there for every unit.
        self.reads = TreeReads(store)
        self.catalog = Catalog(None, store, self.all_units, folded=self.reads.folded)
        self.scanned = store.scan_headers()
        self.woods: Forest = forest(self.scanned)
        self.listings: dict[SessionId, Listing] = {}

    def list_all(self, keys: list[Key]) -> None:
        """List every tree of ``keys`` from the one header scan (see ``entry``)."""
        roots = [k for k in keys if isinstance(k, SessionId)]
        self.listings = self.catalog.list_descendants_many(roots, scanned=self.scanned)

    def prefetch(self, keys: list[Key]) -> None:
        """Read ahead for ``keys``, a window of the trees shown (:class:`TreeReads`)."""
        self.reads.window([k for k in keys if isinstance(k, SessionId)])

    def fold(
        self, sid: Key, diags: list[dict[str, Any]], *, identity: bool = False
    ) -> dict[str, Any]:
        """The session's raw projection states, folded from its log (``{}`` when it
        cannot be read, which adds its diagnostic to ``diags``: the catalog reads
        no root's log). A damaged row is a diagnostic; the others are folded."""
        if not isinstance(sid, SessionId):
            return {}
        folded = self.reads.folds.pop(sid, None)
        if folded is not None:  # the listing read and folded it
            states, gap = folded
            if gap is not None:  # rows are gone, as `show` says too
                diags.append(self.diag(sid, f"seq {gap} missing from the log"))
            return states
        try:
            records = self.reads.logs.get(sid)
            if records is None:  # not read ahead
                records = self.store.read(sid)
            elif isinstance(records, SubagentError):
                raise records
            units = self.all_units if identity else self.facts_units
            gap = gap_of(records)
            if gap is not None:  # rows are gone, as `show` says too
                diags.append(self.diag(sid, f"seq {gap} missing from the log"))
            return units.fold((r.seq, r.event) for r in records)
        except SubagentError as exc:
            raise_if_down(exc)
            if exc.code == ErrorCode.CORRUPT_RECORD:  # fold around it, as `show` does
                with contextlib.suppress(SubagentError):
                    items = list(self.store.scan(sid))
                    for bad in (i for i in items if isinstance(i, SubagentError)):
                        diags.append(self.diag(sid, str(bad)))
                    good = [(i.seq, i.event) for i in items if not isinstance(i, SubagentError)]
                    return (self.all_units if identity else self.facts_units).fold(good)
            if exc.code in (ErrorCode.CORRUPT_RECORD, ErrorCode.DATABASE_CORRUPT):
                diags.append(self.diag(sid, str(exc)))
            return {}

    def facts(
        self,
        sid: Key,
        states: dict[str, Any],
        created_at: dt.datetime | None,
        diags: list[dict[str, Any]],
    ) -> tuple[float | None, SessionState, tuple[int, int]]:
        """The session's active seconds, state (its folded log, and its inbox) and
        how many messages -- and of them reports -- wait in its durable inbox."""
        timing = states.get("subagent_timing")
        seconds = None if timing is None else float(timing["active_us"]) / 1e6
        pending, damaged = self.inbox(sid, diags)
        raw = states.get("session_state")
        held = self.reads.holds(sid) if getattr(raw, "open", False) else None
        state = stored_state(self.store, sid, raw, pending, damaged, created_at, held)
        reports = sum(isinstance(e.event, ReportEvent) for e in pending)
        return seconds, state, (len(pending) + len(damaged), reports)

    def inbox(self, sid: Key, diags: list[dict[str, Any]]) -> tuple[list[Any], list[int]]:
        """The entries of ``sid``'s durable inbox, and the places of those that do not
        decode (each a diagnostic too)."""
        if not isinstance(sid, SessionId):
            return [], []
        pending = self.reads.inboxes.get(sid)
        damaged = self.reads.damaged.get(sid, [])
        if pending is None:  # not read ahead
            try:
                pending = self.store.pending(sid, damaged=damaged)
            except SubagentError as exc:
                raise_if_down(exc)
                if exc.code == ErrorCode.CORRUPT_RECORD:
                    diags.append(self.diag(sid, str(exc)))
                return [], []
        for n in damaged:  # counted: accepted, if unreadable
            diags.append(self.diag(sid, damaged_entry(n)))
        return pending, damaged

    def row_facts(
        self, sid: SessionId, created_at: dt.datetime, diags: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """A listed session's active seconds and state, as its ``--json`` row has them."""
        seconds, state, (inbox, reports) = self.facts(sid, self.fold(sid, diags), created_at, diags)
        return {
            "active_seconds": seconds,
            **state.to_json(),
            "inbox": inbox,
            "reports_waiting": reports,
        }

    def diag(self, key: Key, detail: str, kind: str = "corrupt") -> dict[str, Any]:
        parent = self.woods.parents.get(key)
        return {
            "id": str(key),
            "kind": kind,
            "detail": detail,
            "parent_id": None if parent is None else str(parent),
        }

    def wanted(self, root: str | None) -> list[tuple[Key, Detached | None]]:
        """The trees to list: every one, or the one under ``root``."""
        woods = self.woods
        detached = {d.id: d for d in woods.detached}
        if root is None:
            return [(r, None) for r in woods.roots] + [(d.id, d) for d in woods.detached]
        sid = SessionId(root)
        if sid in woods.headers or sid in woods.broken or sid in detached:
            return [(sid, detached.get(sid))]
        raise SubagentError(f"{self.db}: no session {sid}", code=ErrorCode.SESSION_NOT_FOUND)

    def entry(self, key: Key, detached: Detached | None) -> _Entry:
        woods = self.woods
        header = woods.headers.get(key) if isinstance(key, SessionId) else None
        diags: list[dict[str, Any]] = []
        broken = woods.broken.get(key)
        if broken is not None:
            diags.append(self.diag(key, str(broken)))
        reason = None if detached is None else detached.reason
        if detached is not None and reason == "missing-parent":
            for member in detached.members:
                if isinstance(key, SessionId):
                    why = f"its parent {key} is not in the database"
                else:
                    why = f"{woods.broken[member]}; its parent column {key} is no session id"
                diags.append(self.diag(member, why))
        elif detached is not None:
            for member in detached.members[1:]:
                why = "its parent links loop back to it: " + _chain(detached.members, member)
                diags.append(self.diag(member, why))
        known = (header or broken) is not None
        states = self.fold(key, diags, identity=True) if known else {}
        identity = states.get("subagent")
        created = None if header is None else header.created_at
        seconds, state, (inbox, reports) = self.facts(key, states, created, diags)
        # A header's label, else (a detached child) the label its descriptor serves.
        label = header.label if header is not None and header.label else None
        if label is None and isinstance(identity, dict):
            label = identity.get("label")
        rows: list[dict[str, Any]] = []
        if isinstance(key, SessionId):
            listing = self.listings.get(key)
            if listing is None:  # not listed with the others (an empty Listing is falsy)
                listing = self.catalog.list_descendants(key)
            raise_if_listing_down(listing.diagnostics)
            diags += [self.diag(d.id, d.detail, d.kind) for d in listing.diagnostics]
            held = self.reads.held  # live in a process (R-LIST-7 as a reader sees it)
            rows = [
                {
                    "id": str(r.id),
                    "parent_id": str(r.parent_id),
                    "depth": r.depth,
                    "label": r.label,
                    "mode": r.mode,
                    "activity": r.activity
                    if held is None
                    else ("running" if r.id in held else "inactive"),
                    "has_children": r.has_children,
                    **self.row_facts(r.id, r.created_at, diags),
                }
                for r in listing.rows
            ]
        unique = list({(d["id"], d["detail"]): d for d in diags}.values())
        if header is not None:
            name = printable(label or "(unlabelled)")
        elif broken is not None:
            name = "(header does not decode)" if isinstance(key, SessionId) else "(bad key)"
        else:
            name = "(not in the database)"
        title = f"{name}  {key}"
        if known:
            title += f"  {state_text({**state.to_json(), 'inbox': inbox})}  {active_text(seconds)}"
        if reason is not None:
            title += "  -- detached: " + (
                "its parent is missing" if reason == "missing-parent" else "parent links loop"
            )
        data = {
            "id": str(key),
            "label": label,
            "detached": reason,
            "active_seconds": seconds,
            **(state.to_json() if known else _NO_STATE),
            "inbox": inbox if known else None,
            "reports_waiting": reports if known else None,
            "descendants": rows,
            "diagnostics": unique,
        }
        return _Entry(title, data)


def run_tree(
    store: SessionStore, db: str, root: str | None, as_json: bool, console: Console
) -> int:
    """List ``store``'s trees (or the one under ``root``); the exit status."""
    # Progress on stderr, only where a person watches (never in piped output).
    status = Console(stderr=True)
    progress = status.status("") if status.is_terminal else contextlib.nullcontext()
    with progress as spinner:
        entries, trees = _collect(store, db, root, spinner)
    damaged = any(e.data["diagnostics"] or e.data["detached"] for e in entries)
    if as_json:
        print(dumps([e.data for e in entries]))
    elif entries:
        # Plain text as it stands: rich would only measure and wrap it again.
        console.file.write(_text(entries, trees) + "\n")
    else:
        console.print("no sessions", markup=False)
    return 1 if damaged else 0


def watch_tree(
    store: SessionStore,
    db: str,
    root: str | None,
    console: Console,
    interval: float,
    count: int | None = None,
) -> int:
    """``tree --watch``: read and show the trees every ``interval`` seconds, in place
    on a terminal (rich's live display), else frame after frame, each headed by a
    ``--- HH:MM:SS ---`` line; ``count`` frames, or until interrupted. A frame
    whose read failed, or whose ROOT is not there yet, is that error's line, and
    the watch goes on. The exit status of the last frame (1 for such a frame)."""
    damaged = False

    def frame() -> str:
        nonlocal damaged
        now = dt.datetime.now(dt.UTC).strftime("%H:%M:%S")
        try:
            entries, trees = _collect(store, db, root, None)
        except SubagentError as exc:
            # A read that failed (the store busy or away) or a ROOT not there yet:
            # this frame says so, and the watch goes on, as `serve` does.
            damaged = True
            text = " ".join(str(exc).split())  # "[CODE] message", on one line
            return f"--- {now} {db} ---\n{text}"
        damaged = any(e.data["diagnostics"] or e.data["detached"] for e in entries)
        body = _text(entries, trees) if entries else "no sessions"
        return f"--- {now} {db} ---\n{body}"

    live = Live(console=console, auto_refresh=False) if console.is_terminal else None
    with live or contextlib.nullcontext():
        for shown in itertools.count(1):
            if live is not None:
                live.update(Text(frame()), refresh=True)
            else:
                console.file.write(frame() + "\n")
                console.file.flush()
            if count is not None and shown >= count:
                break
            time.sleep(interval)
    return 1 if damaged else 0


def collect_trees(store: SessionStore, db: str, root: str | None) -> list[dict[str, Any]]:
    """What ``subagents tree --json`` prints: every tree (or the one under ``root``)."""
    entries, _ = _collect(store, db, root, None)
    return [e.data for e in entries]


def _collect(
    store: SessionStore, db: str, root: str | None, spinner: Any
) -> tuple[list[_Entry], _Trees]:
    trees = _Trees(store, db)
    wanted = trees.wanted(root)
    if spinner is not None:
        spinner.update(f"reading {len(wanted)} trees")
    trees.list_all([key for key, _ in wanted])
    entries: list[_Entry] = []
    start = 0
    while start < len(wanted):
        # A window of whole trees of about _WINDOW sessions, read ahead together.
        end, keys = start, list[Key]()
        while end < len(wanted) and (end == start or len(keys) < _WINDOW):
            key = wanted[end][0]
            listing = trees.listings.get(key) if isinstance(key, SessionId) else None
            keys += [key, *(r.id for r in (listing.rows if listing else ()))]
            end += 1
        trees.prefetch(keys)
        for n in range(start, end):
            key, detached = wanted[n]
            if spinner is not None:
                spinner.update(f"listing tree {n + 1}/{len(wanted)} ({key})")
            entries.append(trees.entry(key, detached))
        start = end
    return entries, trees


def _text(entries: list[_Entry], trees: _Trees) -> str:
    return "\n".join(entry_outline(e.title, e.data).render() for e in entries)


_NO_STATE = {"state": None, "last_activity": None, "last_turn": None}
