"""Bad data and derived data (R-LIST-9, R-LIST-14, R-LIST-18, R-ERR-1).

A SQLite database is written by the store, then damaged by hand with raw
``sqlite3``: garbled event rows, a descriptor of a future version, a header whose
parent does not exist, and cycles in the parent links. Listing over it returns
rows and diagnostics and terminates, raising nothing. The projection cache is
derived data: dropping it changes no listing.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from catalog_kit import (
    GARBAGE,
    HookedSqliteStore,
    at,
    continuable,
    future_descriptor,
    garble,
    hooked,
    identity_blob,
    one_shot,
    reparent,
    sid,
    turn,
    write_child,
)
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._catalog import Listing
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Block, Gate, LifecycleProbe, ScriptedBehaviour
from subagents.protocol import SessionId, new_session_id
from subagents.store import SqliteStore


class Damaged:
    """The ids of the hand-damaged database."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with SqliteStore(path) as store:
            self.root = write_child(store, None, [], origin="user").id
            r = self.root
            self.good = write_child(
                store, r, [continuable("good"), *turn(0, 0, 1)], created_at=at(1)
            )
            self.bad_descriptor = write_child(
                store, r, [continuable("garbled"), *turn(0, 0, 1)], created_at=at(2)
            )
            self.bad_tail = write_child(
                store, r, [one_shot("tail"), *turn(0, 0, 1)], created_at=at(3)
            )
            self.future = write_child(
                store, r, [future_descriptor(), *turn(0, 0, 1)], created_at=at(4)
            )
            self.orphan = write_child(store, r, [continuable("orphan")], created_at=at(5))
            self.x = write_child(store, r, [continuable("x")], created_at=at(6))
            self.y = write_child(store, r, [continuable("y")], created_at=at(7))
            self.z = write_child(store, self.y.id, [continuable("z")], created_at=at(8))
            self.selfish = write_child(store, r, [continuable("self")], created_at=at(9))
        self.missing = new_session_id()
        garble(path, self.bad_descriptor.id, 0)
        garble(path, self.bad_tail.id, 2)
        reparent(path, self.orphan, self.missing)
        reparent(path, self.x, self.y.id)
        reparent(path, self.y, self.x.id)
        reparent(path, self.selfish, self.selfish.id)


@pytest.fixture
def damaged(tmp_path: Path) -> Damaged:
    return Damaged(tmp_path / "damaged.db")


@pytest.fixture
def rt_damaged(backend: Backend, damaged: Damaged) -> Iterator[Runtime]:
    with Runtime(HookedSqliteStore(str(damaged.path)), backend=backend) as rt:
        yield rt


def rows(listing: Listing) -> list[tuple[Any, ...]]:
    return [(r.id, r.mode, r.label) for r in listing.rows]


def diagnostics(listing: Listing) -> dict[SessionId, str]:
    return {d.id: d.kind for d in listing.diagnostics}


def test_damaged_database_lists_rows_and_diagnostics(rt_damaged: Runtime, damaged: Damaged) -> None:
    """R-LIST-14, R-ERR-1: garbled rows (in the descriptor or later in the log) and a
    future-version descriptor are ``corrupt`` diagnostics; the good child is a row; the
    re-parented sessions are not children of the root any more."""
    rt, d = rt_damaged, damaged
    for listing in (
        rt.subagents.list_children(d.root),
        rt.subagents.list_descendants(d.root),
    ):
        assert rows(listing) == [(d.good.id, "continuable", "good")]
        assert diagnostics(listing) == {
            d.bad_descriptor.id: "corrupt",
            d.bad_tail.id: "corrupt",
            d.future.id: "corrupt",
        }
    # Bad data stays bad: a second listing (now partly cached) says the same.
    assert diagnostics(rt.subagents.list_children(d.root)) == {
        d.bad_descriptor.id: "corrupt",
        d.bad_tail.id: "corrupt",
        d.future.id: "corrupt",
    }


def test_missing_parent_and_parent_cycles_terminate(rt_damaged: Runtime, damaged: Damaged) -> None:
    """R-LIST-1, R-LIST-18, R-LIST-19: a header whose parent is missing is a child of that
    id; parent cycles are walked once (each session at most once, the root never below
    itself), and every listing terminates without raising."""
    rt, d = rt_damaged, damaged
    assert rows(rt.subagents.list_children(d.missing)) == [(d.orphan.id, "continuable", "orphan")]
    tree = rt.subagents.list_descendants(d.missing)
    assert [(r.id, r.parent_id, r.depth) for r in tree.rows] == [(d.orphan.id, d.missing, 1)]
    assert rows(rt.subagents.list_children(d.x.id)) == [(d.y.id, "continuable", "y")]
    assert rows(rt.subagents.list_children(d.y.id)) == [
        (d.x.id, "continuable", "x"),
        (d.z.id, "continuable", "z"),
    ]
    tree = rt.subagents.list_descendants(d.x.id)
    assert [(r.id, r.parent_id, r.depth) for r in tree.rows] == [
        (d.y.id, d.x.id, 1),
        (d.z.id, d.y.id, 2),
    ]
    tree = rt.subagents.list_descendants(d.y.id)
    assert [(r.id, r.parent_id, r.depth) for r in tree.rows] == [
        (d.x.id, d.y.id, 1),
        (d.z.id, d.y.id, 1),
    ]
    # A header naming itself as parent: a self-loop may or may not be listed as its own
    # child, but the root is never below itself.
    assert [r.id for r in rt.subagents.list_children(d.selfish.id).rows] in ([], [d.selfish.id])
    assert rt.subagents.list_descendants(d.selfish.id).rows == ()


def test_a_live_child_with_a_garbled_persisted_prefix(backend: Backend, tmp_path: Path) -> None:
    """R-LIST-15, R-ERR-1: a live child whose persisted prefix no longer decodes (its live
    tail was trimmed once committed) gets a diagnostic; the listing does not raise, and
    its siblings are listed."""
    path = tmp_path / "live.db"
    gate = Gate()
    with Runtime(str(path), backend=backend) as rt:
        rt.models.register("slow", lambda _o: ScriptedBehaviour([Block(gate)]))
        probe = LifecycleProbe(rt)
        root = rt.spawn("echo")
        fine = rt.subagents.start_continuable(
            ContinuableStartSpec(parent=root, provider="local", prompt="p", label="fine")
        ).child_id
        assert probe.wait_for(lambda evs: any(e.type == "subagent/end" for e in evs))
        broken = rt.subagents.start_continuable(
            ContinuableStartSpec(parent=root, provider="local", prompt="p", label="b", model="slow")
        ).child_id
        assert gate.wait_reached(10)
        rt.sessions.flush()
        garble(path, broken, 0)
        try:
            listing = rt.subagents.list_children(root.session_id)
        finally:
            gate.release()
            probe.close()
        assert rows(listing) == [(fine, "continuable", "fine")]
        assert diagnostics(listing) == {broken: "corrupt"}


# -- the cache is derived data ---------------------------------------------------------------


def test_dropping_the_projection_cache_changes_no_listing(
    rtp: Runtime, probe: LifecycleProbe
) -> None:
    """R-LIST-9, R-LIST-10: ``drop_projections()`` then listing rebuilds the same result
    from the logs, and writes the cache rows again (the next listing reads no log)."""
    rt = rtp
    store = hooked(rt)
    gate = Gate()
    rt.models.register("slow", lambda _o: ScriptedBehaviour([Block(gate)]))
    root = rt.spawn("echo")
    cold = [
        rt.subagents.start_continuable(
            ContinuableStartSpec(parent=root, provider="local", prompt="p", label=f"c{i}")
        ).child_id
        for i in range(3)
    ]
    assert probe.wait_for(lambda evs: sum(e.type == "subagent/end" for e in evs) == 3)
    rt.sessions.flush()
    seeded = write_child(
        store, root.session_id, [continuable("own")], seed=[continuable("anc"), *turn(0, 0, 1)]
    )
    broken = write_child(store, root.session_id, [future_descriptor()], session_id=sid(7))
    running = rt.subagents.start_continuable(
        ContinuableStartSpec(parent=root, provider="local", prompt="p", label="r", model="slow")
    ).child_id
    assert gate.wait_reached(10)
    first = rt.subagents.list_children(root.session_id)
    first_tree = rt.subagents.list_descendants(root.session_id)
    assert len(first.rows) == 5 and [d.id for d in first.diagnostics] == [broken.id]
    assert all(store.get_projection(c, "subagent") is not None for c in cold)
    store.drop_projections()
    assert all(store.get_projection(c, "subagent") is None for c in (*cold, seeded.id))
    store.reset_counts()
    assert rt.subagents.list_children(root.session_id) == first
    assert all(store.reads_of[c] == 1 for c in (*cold, seeded.id))
    assert rt.subagents.list_descendants(root.session_id) == first_tree
    # seed_len 4: the own descriptor at seq 4 is the cached row's seq.
    assert store.get_projection(seeded.id, "subagent") == (4, identity_blob("continuable", "own"))
    store.reset_counts()
    assert rt.subagents.list_children(root.session_id) == first
    assert {s for s in store.reads_of if s != running} == set()
    gate.release()


def test_garbled_header_row_is_a_diagnostic_not_a_failure(
    backend: Backend, damaged: Damaged
) -> None:
    """R-LIST-14, R-ERR-1: a session whose stored *header* does not decode does not
    hide its siblings: the listing (and the tree below the root) reports it as a
    ``corrupt`` diagnostic under the parent its indexed column names."""
    with sqlite3.connect(damaged.path) as conn:
        cur = conn.execute(
            "UPDATE sessions SET header = ? WHERE id = ?", (GARBAGE, damaged.future.id.to_bytes())
        )
        assert cur.rowcount == 1
    conn.close()
    with Runtime(str(damaged.path), backend=backend) as rt:
        children = rt.subagents.list_children(damaged.root)
        assert damaged.good.id in {r.id for r in children.rows}
        assert diagnostics(children)[damaged.future.id] == "corrupt"
        assert damaged.future.id not in {r.id for r in children.rows}
        tree = rt.subagents.list_descendants(damaged.root)
        assert diagnostics(tree)[damaged.future.id] == "corrupt"
        assert damaged.good.id in {r.id for r in tree.rows}
