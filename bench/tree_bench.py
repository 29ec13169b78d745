"""Listings that follow the tree, not the store (issue 17 point 1), on SQLite.

* ``list_descendants`` of a root with 10 descendants in a 100,000-session store
  against the same in a 1,000-session store (the rest: other roots with one child
  each). Target: within 2x -- the walk reads the subtree through the parent index,
  level by level, so the store's size barely shows.
* ``subagents tree`` of 3,000 roots (each with one child), the whole command as a
  user runs it (a fresh interpreter, output to a file, the package's bytecode
  cached as an install leaves it), against a fixed budget of 1 s; and the same
  listing in-process (no interpreter start-up).
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from subagents.actors._shell._tree import run_tree
from subagents.protocol import (
    ContinuableDescriptor,
    SessionHeader,
    descriptor_event,
    new_session_id,
)
from subagents.store import SqliteStore

from bench._harness import Context, Row, compare, group, min_time
from bench.catalog_bench import _catalog, _create_all

_T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _header(parent: SessionHeader | None, n: int, label: str | None = None) -> SessionHeader:
    return SessionHeader(
        id=new_session_id(),
        parent_session=None if parent is None else parent.id,
        origin="user" if parent is None else "subagent",
        delegation_depth=0 if parent is None else parent.delegation_depth + 1,
        created_at=_T0 + dt.timedelta(microseconds=n),
        label=label,
    )


def _child(parent: SessionHeader, n: int) -> tuple[SessionHeader, list]:
    d = ContinuableDescriptor(provider="local", label=f"c{n}", agent_provider="local", model="echo")
    return _header(parent, n, d.label), [descriptor_event(d)]


def _roots_with_a_child(count: int, start: int = 0) -> list[tuple[SessionHeader, list]]:
    """``count`` roots, each with one continuable child (2 x ``count`` sessions)."""
    out: list[tuple[SessionHeader, list]] = []
    for i in range(count):
        root = _header(None, start + 2 * i)
        out.append((root, []))
        out.append(_child(root, start + 2 * i + 1))
    return out


def _store_with_small_tree(path: Path, size: int) -> object:
    """A store of ``size`` sessions: one root with 10 descendants (a child with 3
    children, each with 2), the rest roots with one child each."""
    with SqliteStore(path, synchronous="NORMAL") as store:
        root = _header(None, 0)
        store.create_session(root)
        tree: list[tuple[SessionHeader, list]] = []
        top, _ = kid = _child(root, 1)
        tree.append(kid)
        for i in range(3):
            mid, _ = mid_kid = _child(top, 2 + 3 * i)
            tree.append(mid_kid)
            tree += [_child(mid, 3 + 3 * i + j) for j in range(2)]
        for h, ev in tree:
            store.create_session(h, ev)
        filler = (size - 11) // 2
        _create_all(store, _roots_with_a_child(filler, start=100))
        return root.id


@group("tree")
def tree(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    small_size, big_size = ctx.size(1_000, 100), ctx.size(100_000, 2_000)
    timed: dict[int, float] = {}
    for size in (small_size, big_size):
        path = ctx.tmpdir / f"tree-{size}.db"
        start = time.perf_counter()
        root = _store_with_small_tree(path, size)
        ctx.log(f"built {size} sessions in {time.perf_counter() - start:.1f}s")
        with SqliteStore(path) as store:
            cat = _catalog(store)
            listing = cat.list_descendants(root)
            assert len(listing.rows) == 10, (len(listing.rows), listing.diagnostics[:3])
            timed[size] = min_time(5, lambda cat=cat: cat.list_descendants(root))
    small = Row(
        workload=f"list_descendants of 10 in a {small_size}-session store",
        backend="threading",
        store="sqlite",
        value=timed[small_size] * 1e3,
        unit="ms",
        better="lower",
    )
    rows.append(small)
    rows.append(
        compare(
            Row(
                workload=f"list_descendants of 10 in a {big_size}-session store",
                backend="threading",
                store="sqlite",
                value=timed[big_size] * 1e3,
                unit="ms",
                better="lower",
            ),
            small,
            target=2.0,
        )
    )
    roots = ctx.size(3_000, 100)
    path = ctx.tmpdir / f"roots-{roots}.db"
    with SqliteStore(path, synchronous="NORMAL") as store:
        _create_all(store, _roots_with_a_child(roots))
    with SqliteStore(path) as store, open(os.devnull, "w") as sink:
        console = Console(file=sink, soft_wrap=True, width=200)
        in_process = min_time(3, lambda: run_tree(store, str(path), None, False, console))
    command = [sys.executable, "-m", "subagents", "tree", str(path)]
    out = ctx.tmpdir / "tree.txt"
    # The command as an installed package runs it: with its modules' bytecode
    # cached (a wheel's install compiles it). An environment that sets
    # PYTHONDONTWRITEBYTECODE would otherwise time the compiler on every run
    # (~0.13 s of this row on a slow machine); the cache goes to the bench's
    # own directory, not next to the sources.
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(ctx.tmpdir / "pycache")}
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    def run_command() -> None:
        with open(out, "w") as f:
            subprocess.run(command, stdout=f, check=True, env=env)

    run_command()  # fills the bytecode cache; not timed
    whole = min_time(3, run_command)
    assert out.read_text().count("\n") >= 2 * roots
    budget = Row(
        workload="fixed budget 1 s", backend="-", store="-", value=1.0, unit="s", better="lower"
    )
    rows.append(
        Row(
            workload=f"tree of {roots} roots + {roots} children, in-process",
            backend="threading",
            store="sqlite",
            value=in_process,
            unit="s",
            better="lower",
        )
    )
    rows.append(
        compare(
            Row(
                workload=f"`subagents tree` of {roots} roots + {roots} children",
                backend="-",
                store="sqlite",
                value=whole,
                unit="s",
                better="lower",
            ),
            budget,
            target=1.0,
        )
    )
    return rows
