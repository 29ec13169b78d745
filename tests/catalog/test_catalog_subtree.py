"""``list_descendants`` reads the tree, not the store (issue 17 point 1).

R-LIST-8, R-LIST-9: the root's tree is read level by level through the store's
parent index (one chunked read per level), so a small tree in a big store costs
a small tree; a tree deeper than ``MAX_LEVELS`` is read with one scan instead.
``list_descendants_many`` (what ``subagents tree`` uses) lists every root from
one scan, each listing equal to ``list_descendants`` of its root.
"""

from __future__ import annotations

import random
from typing import Any

import pytest
from catalog_kit import at, continuable, hooked, one_shot, write_child
from subagents.actors import Runtime
from subagents.actors._catalog import Catalog
from subagents.actors._catalog._catalog import MAX_LEVELS
from subagents.protocol import SessionHeader, SessionId

pytestmark = pytest.mark.timeout(60)


def _tree(store: Any, root: SessionId, shape: list[int], start: int = 0) -> list[SessionHeader]:
    """Children per level: ``shape[0]`` under the root, ``shape[1]`` under each of
    those, and so on. Returns every descendant written."""
    level, made, n = [root], [], start
    for width in shape:
        nxt = []
        for parent in level:
            for _ in range(width):
                n += 1
                desc = continuable(f"c{n}") if n % 2 else one_shot(f"o{n}")
                nxt.append(write_child(store, parent, [desc], created_at=at(n)))
        made += nxt
        level = [h.id for h in nxt]
    return made


def test_a_small_tree_in_a_big_store_reads_only_the_tree(rtp: Runtime) -> None:
    """R-LIST-8: with 200 other trees in the store, listing a 10-node tree reads its
    three levels through the parent index (one read each, the level's parents
    only), never the whole store; plus the empty level below where the store
    cannot say which nodes have children (an SQL store's level read says it)."""
    store = hooked(rtp)
    root = rtp.spawn("echo")
    for i in range(200):
        other = write_child(store, None, [], created_at=at(1000 + i), origin="user")
        _tree(store, other.id, [1], start=10_000 + 2 * i)
    mine = _tree(store, root.session_id, [1, 3, 2])
    assert len(mine) == 10
    store.reset_counts()
    listing = rtp.subagents.list_descendants(root.session_id)
    assert [r.id for r in listing.rows] != [] and len(listing.rows) == 10
    assert store.calls["scan_headers"] == 0 and store.calls["all_headers"] == 0
    levels = [set(args) for method, args in store.read_log if method == "scan_children"]
    by_depth: dict[int, set[SessionId]] = {}
    for row in listing.rows:
        by_depth.setdefault(row.depth, set()).add(row.id)
    leaves = [] if hasattr(store, "scan_children_with") else [by_depth[3]]
    assert levels == [{root.session_id}, by_depth[1], by_depth[2], *leaves]


def test_a_tree_deeper_than_the_level_cap_is_read_with_one_scan(rtp: Runtime) -> None:
    """R-LIST-9: a chain of ``MAX_LEVELS + 6`` levels is listed whole and in order,
    after ``MAX_LEVELS`` level reads and one scan of the store. (Another tree in
    the store: a store of one tree is read with one scan at once, the test below.)"""
    store = hooked(rtp)
    root = rtp.spawn("echo")
    write_child(store, None, [], origin="user")
    depth = MAX_LEVELS + 6
    chain = _tree(store, root.session_id, [1] * depth)
    store.reset_counts()
    listing = rtp.subagents.list_descendants(root.session_id)
    assert [(r.id, r.depth) for r in listing.rows] == [(h.id, i + 1) for i, h in enumerate(chain)]
    assert store.calls["scan_children"] == MAX_LEVELS
    assert store.calls["scan_headers"] == 1


def test_the_only_tree_of_a_store_is_read_with_one_scan(rtp: Runtime) -> None:
    """R-LIST-8: when the root is the store's only top-level session, its tree is
    every session stored (but damaged ones), and it is listed from one scan of the
    store, never level by level (an SQL store says so, ``sole_root``); the same rows
    as level by level, once another tree is stored beside it."""
    store = hooked(rtp)
    root = rtp.spawn("echo")
    _tree(store, root.session_id, [3, 2, 2])
    store.reset_counts()
    alone = rtp.subagents.list_descendants(root.session_id)
    if hasattr(store, "sole_root"):
        assert store.calls["scan_headers"] == 1 and store.calls["scan_children"] == 0
    write_child(store, None, [], origin="user", created_at=at(500))
    store.reset_counts()
    beside = rtp.subagents.list_descendants(root.session_id)
    assert store.calls["scan_headers"] == 0 and store.calls["scan_children"] >= 3
    assert len(alone.rows) == 21 and beside == alone


@pytest.mark.parametrize("seed", range(8))
def test_many_equals_one_by_one(rtp: Runtime, seed: int) -> None:
    """``list_descendants_many`` of every root equals ``list_descendants`` of each,
    over random forests with live agents among the persisted sessions (repeated
    over seeds)."""
    rnd = random.Random(seed)
    store = hooked(rtp)
    roots = [rtp.spawn("echo").session_id for _ in range(2)]
    n = 0
    for _ in range(3):
        roots.append(write_child(store, None, [], created_at=at(n), origin="user").id)
    for _ in range(rnd.randrange(5, 40)):
        n += 1
        parent = rnd.choice(roots)
        shape = [rnd.randrange(0, 3) for _ in range(rnd.randrange(1, 4))]
        _tree(store, parent, shape, start=100 * n)
    # The runtime's own catalog (what its listings use).
    catalog: Catalog = rtp.subagents._catalog(None)
    many = catalog.list_descendants_many(roots)
    assert list(many) == roots
    for root in roots:
        assert many[root] == catalog.list_descendants(root)
