"""The ``subagents`` command line: ``demo``, ``tree``, ``show``.

Every command has ``--help``. Errors a user can cause (a missing, empty, corrupt
or foreign database; an unknown session) print one line and exit non-zero, never
a traceback. Output has no colour when it does not go to a terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from subagents.actors._catalog import (
    Catalog,
    ProjectionRegistry,
    subagent_timing_unit,
    subagent_unit,
)
from subagents.protocol import (
    CorruptRecordError,
    SessionId,
    SubagentError,
    event_to_wire,
    header_to_wire,
)

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="subagents", description="Durable agent trees on pykka actors."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = sub.add_parser(
        "demo",
        help="build (or, the second time, resume) a demo agent tree",
        description=(
            "Build an agent tree on the embedded SQLite store: continuable and one-shot children, "
            "follow-ups, quiet and waking reports, an interrupt and a drain. "
            "Run it again to resume the persisted tree."
        ),
    )
    demo.add_argument(
        "--db",
        default="./subagents-demo.db",
        help="database file, or a postgresql:// URL (default: %(default)s)",
    )
    demo.add_argument(
        "--backend",
        choices=("threading", "gevent"),
        default="threading",
        help="actor runtime (default: %(default)s)",
    )
    tree = sub.add_parser(
        "tree",
        help="print the durable catalog of a database as a tree",
        description="Print every session tree (or the one under ROOT): label, mode, activity, "
        "diagnostics and active time, from the durable catalog.",
    )
    tree.add_argument("db", help="a subagents database file, or a postgresql:// URL (?schema=...)")
    tree.add_argument("root", nargs="?", help="only the tree under this session id")
    tree.add_argument("--json", action="store_true", help="machine-readable output")
    show = sub.add_parser(
        "show",
        help="print one session's events, decoded",
        description="Print a session's header and events.",
    )
    show.add_argument("db", help="a subagents database file, or a postgresql:// URL (?schema=...)")
    show.add_argument("session", help="the session id (32 hex digits)")
    show.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _open_existing(path: str) -> Any:
    """Open a database that must already exist; SubagentError otherwise."""
    from subagents.store import SqliteStore

    if path.startswith(("postgresql://", "postgres://")):
        from subagents.store import PostgresStore

        return PostgresStore(path, create=False)

    if not os.path.exists(path):
        raise SubagentError(f"{path}: no such file", code="NOT_A_DATABASE")
    if os.path.isdir(path):
        raise SubagentError(f"{path}: is a directory", code="NOT_A_DATABASE")
    if os.path.getsize(path) == 0:
        raise SubagentError(f"{path}: empty file, not a subagents database", code="NOT_A_DATABASE")
    return SqliteStore(path)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return value.hex()
    if hasattr(value, "isoformat"):
        return value.isoformat()
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value if not isinstance(value, str) else str(value)
    return repr(value)


def _show(args: argparse.Namespace, console: Console) -> int:
    sid = SessionId(args.session)
    with _open_existing(args.db) as store:
        header = store.header(sid)
        if header is None:
            raise SubagentError(f"{args.db}: no session {sid}", code="SESSION_NOT_FOUND")
        rows: list[dict[str, Any]] = []
        for item in store.scan(sid):
            if isinstance(item, CorruptRecordError):
                rows.append({"seq": item.seq, "corrupt": str(item)})
            else:
                rows.append({"seq": item.seq, **_jsonable(event_to_wire(item.event))})
    if args.json:
        print(json.dumps({"header": _jsonable(header_to_wire(header)), "events": rows}, indent=2))
        return 0
    console.print(f"session {sid}  label={header.label!r}  origin={header.origin}")
    console.print(f"  depth={header.delegation_depth}", markup=False)
    console.print(f"  parent={header.parent_session}  created={header.created_at.isoformat()}")
    for row in rows:
        seq = row.pop("seq")
        kind = row.pop("type", "corrupt")
        fields = "  ".join(f"{k}={v!r}" for k, v in row.items() if v is not None)
        console.print(f"{seq:>6}  {kind:<20} {fields}", markup=False, highlight=False)
    return 0


def _tree(args: argparse.Namespace, console: Console) -> int:
    from rich.tree import Tree

    projections = ProjectionRegistry()
    projections.register(subagent_unit)
    projections.register(subagent_timing_unit)
    with _open_existing(args.db) as store:
        catalog = Catalog(None, store, projections)
        if args.root is not None:
            root_header = store.header(SessionId(args.root))
            if root_header is None:
                raise SubagentError(f"{args.db}: no session {args.root}", code="SESSION_NOT_FOUND")
            roots = [root_header]
        else:
            roots = [h for h in store.all_headers() if h.parent_session is None]

        def active_seconds(sid: SessionId) -> float | None:
            try:
                states = projections.fold((r.seq, r.event) for r in store.read(sid))
            except SubagentError:
                return None
            value = projections.values(states)["subagent_timing"]
            return float(value["active_seconds"])

        out: list[dict[str, Any]] = []
        # Progress on stderr, only where a person watches (never in piped output).
        status = Console(stderr=True)
        progress = status.status("") if status.is_terminal else contextlib.nullcontext()
        with progress as spinner:
            listings = []
            for n, header in enumerate(roots, 1):
                if spinner is not None:
                    spinner.update(f"listing tree {n}/{len(roots)} ({header.label or header.id})")
                listings.append(catalog.list_descendants(header.id))
        for header, listing in zip(roots, listings):
            out.append(
                {
                    "id": str(header.id),
                    "label": header.label,
                    "active_seconds": active_seconds(header.id),
                    "descendants": [
                        {
                            "id": str(r.id),
                            "parent_id": str(r.parent_id),
                            "depth": r.depth,
                            "label": r.label,
                            "mode": r.mode,
                            "activity": r.activity,
                            "has_children": r.has_children,
                            "active_seconds": active_seconds(r.id),
                        }
                        for r in listing.rows
                    ],
                    "diagnostics": [
                        {"id": str(d.id), "kind": d.kind, "detail": d.detail}
                        for d in listing.diagnostics
                    ],
                }
            )
    if args.json:
        print(json.dumps(out, indent=2))
        return 0
    for root in out:
        top = Tree(
            f"{root['label'] or '(unlabelled)'}  {root['id']}  {_ms(root['active_seconds'])}"
        )
        nodes = {root["id"]: top}
        for row in root["descendants"]:
            parent = nodes.get(row["parent_id"], top)
            text = (
                f"{row['label'] or '(unlabelled)'}  {row['mode']}  {row['activity']}"
                f"  {_ms(row['active_seconds'])}  {row['id']}"
            )
            nodes[row["id"]] = parent.add(text, highlight=False)
        for diag in root["diagnostics"]:
            top.add(f"[{diag['kind']}] {diag['id']}: {diag['detail']}", highlight=False)
        console.print(top, markup=False, highlight=False)
    if not out:
        console.print("no sessions", markup=False)
    return 0


def _ms(seconds: float | None) -> str:
    return "active ?" if seconds is None else f"active {seconds * 1000:.1f} ms"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``subagents`` command."""
    args = _parser().parse_args(argv)
    # soft_wrap: lines stay whole when piped (grep-able), tables still fit the width.
    console = Console(soft_wrap=True)
    if not console.is_terminal:
        console = Console(soft_wrap=True, width=200)  # piped: never crop tree lines
    err = Console(stderr=True, soft_wrap=True)
    try:
        if args.command == "demo":
            from ._demo import run_demo

            return run_demo(args.db, args.backend, console)
        if args.command == "show":
            return _show(args, console)
        if args.command == "tree":
            return _tree(args, console)
    except SubagentError as exc:
        err.print(f"subagents {args.command}: {exc}", markup=False, highlight=False)
        return 2
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except BrokenPipeError:  # `subagents tree DB | head`: the reader left, so do we
        with contextlib.suppress(OSError):
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - keep interpreter exit quiet
        return 0
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
