"""Waking a grandchild through a settled parent: the chain stays up until it is woken.

A message for a continuable child whose parent is itself a *settled* subagent
(the tree's top is live; the levels between are not) is run by waking the chain
down from the live ancestor. A parent woken only for its child has nothing of
its own to do and settles at once; it used to settle before the child below it
was reserved ("the parent is leaving residency"), so the message waited for
ever. Now each level is woken *held* (kept from settling by an admission of its
own) until the last is woken, which then keeps it resident as its owner.
``db`` runs each test on SQLite and on PostgreSQL, ``backend`` on both runtimes;
``a`` holds the tree, ``b`` is another process on the same store.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from durability_kit import Noted, two_runtimes, until
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import SessionId
from subagents.store import MemoryStore


@pytest.fixture
def pair(backend: Backend, db: str) -> Iterator[list[Runtime]]:
    yield from two_runtimes(backend, db, 3.0)


def _register(rt: Runtime, noted: Noted, name: str) -> None:
    """``note`` notes its turns; ``tree`` does too, and its ``spawn`` turn starts a
    continuable child (model ``note``) whose prompt is ``g``."""
    noted.register(rt, name)

    def factory(_options: Any) -> Any:
        def on_turn(turn: Any) -> None:
            noted.add((name, turn.content, turn.redelivered))
            if turn.content == "spawn":
                turn.subagents.start_continuable("local", "g", label="g", model="note")

        return on_turn

    rt.models.register("tree", factory, replace=True)


def _settled(rt: Runtime, *ids: SessionId) -> bool:
    return all(rt.agents.get(sid) is None for sid in ids)


@pytest.fixture
def tree(pair: list[Runtime]) -> tuple[Runtime, Runtime, Noted, SessionId, SessionId, SessionId]:
    """``root`` live in ``a``; its child ``p`` and grandchild ``g`` settled."""
    a, b = pair
    noted = Noted()
    _register(a, noted, "a")
    _register(b, noted, "b")
    root = a.spawn("note", label="root")
    p, _mid = a.subagents.start_continuable(
        ContinuableStartSpec(parent=root, provider="local", prompt="spawn", label="p", model="tree")
    )
    assert noted.runs("g", ["a"])
    (g,) = [r.id for r in a.subagents.list_children(p).rows]
    assert until(a, lambda: _settled(a, p, g))
    return a, b, noted, root.session_id, p, g


def test_a_follow_up_by_id_reaches_a_grandchild_below_a_settled_parent(
    tree: tuple[Runtime, Runtime, Noted, SessionId, SessionId, SessionId],
) -> None:
    """Race, 20 rounds, from the tree's own runtime and from another one in turn:
    each follow-up to the settled grandchild by its settled parent's id runs once,
    in ``a`` (where the tree lives); then the chain settles again, child first."""
    a, b, noted, _root, p, g = tree
    for i in range(20):
        (a, b)[i % 2].subagents.followup(p, g, f"m{i}")
        assert noted.runs(f"m{i}", ["a"]), i
        assert until(a, lambda: _settled(a, p, g)), i
    assert [c for _, c, _ in noted.items()].count("m7") == 1


def test_a_start_by_id_below_a_settled_subagent_parent_runs(
    tree: tuple[Runtime, Runtime, Noted, SessionId, SessionId, SessionId],
) -> None:
    """``b`` starts children of the settled ``p`` by its id, 10 rounds: each prompt
    runs once, in ``a``, below ``p`` (its lineage woken held, then settling)."""
    a, b, noted, _root, p, g = tree
    started = []
    for i in range(10):
        child, _mid = b.subagents.start_continuable(
            ContinuableStartSpec(
                parent=p, provider="local", prompt=f"s{i}", label="s", model="note"
            )
        )
        started.append(child)
        assert noted.runs(f"s{i}", ["a"]), i
        assert until(a, lambda c=child: _settled(a, p, c)), i
    rows = a.subagents.list_children(p).rows
    assert sorted(r.id for r in rows) == sorted([g, *started])


def test_concurrent_wakes_of_siblings_below_a_settled_parent_leave_no_hold(
    pair: list[Runtime],
) -> None:
    """Race, 10 rounds: two settled siblings below the settled ``p`` are followed up
    by id at once (two tasks of ``a``'s backend), so two chains wake ``p`` together
    -- one publishes it held, the other holds it resident, or waits behind its
    release. Each message runs once, and then ``p`` settles after its children:
    no hold is left behind (a leaked one would keep ``p`` resident for ever)."""
    a, _b = pair
    noted = Noted()
    _register(a, noted, "a")
    root = a.spawn("note", label="root")
    p, _mid = a.subagents.start_continuable(
        ContinuableStartSpec(parent=root, provider="local", prompt="spawn", label="p", model="tree")
    )
    assert noted.runs("g", ["a"])
    a.subagents.followup(root, p, "spawn")  # a second child of p
    assert noted.wait_for(lambda items: [c for _, c, _ in items].count("g") == 2)
    kids = [r.id for r in a.subagents.list_children(p).rows]
    assert len(kids) == 2
    assert until(a, lambda: _settled(a, p, *kids))
    for i in range(10):
        tasks = [
            a.backend.spawn(a.subagents.followup, p, kid, f"r{i}-{k}") for k, kid in enumerate(kids)
        ]
        for task in tasks:
            assert task.join(10)
            assert task.exception is None
        for k in range(2):
            assert noted.runs(f"r{i}-{k}", ["a"]), (i, k)
        assert until(a, lambda: _settled(a, p, *kids)), i


@pytest.mark.parametrize("where", ["memory", "relaxed"])
def test_by_id_below_a_subagent_parent_where_nothing_is_committed_wakes_its_lineage(
    backend: Backend, tmp_path: Any, where: str
) -> None:
    """On a memory store, or under relaxed durability, nothing is committed for
    another process to run, so a follow-up or start naming a *subagent* parent by
    id gets that parent live here: the top-level agent resumed, the levels below it
    woken held. It used to resume the parent as if top-level, and raise
    ``UNAUTHORIZED`` ("is a subagent"). Race, 10 rounds, the tree settling between
    each: the root disposed (memory) or a new runtime on the same file (relaxed).
    R-CONT-1, R-CONT-3."""
    store: Any = MemoryStore() if where == "memory" else str(tmp_path / "relaxed.db")
    durability = "strict" if where == "memory" else "relaxed"
    noted = Noted()
    rt = Runtime(store, backend=backend, durability=durability)
    try:
        _register(rt, noted, "here")
        root = rt.spawn("note", label="root")
        root_id = root.session_id
        p, _mid = rt.subagents.start_continuable(
            ContinuableStartSpec(
                parent=root, provider="local", prompt="spawn", label="p", model="tree"
            )
        )
        assert noted.runs("g", ["here"])
        (g,) = [r.id for r in rt.subagents.list_children(p).rows]
        for i in range(10):
            assert until(rt, lambda rt=rt: _settled(rt, p, g)), i
            if where == "memory":
                rt.agents.get(root_id).dispose()  # type: ignore[union-attr]
            else:
                rt.close()
                rt = Runtime(store, backend=backend, durability=durability)
                _register(rt, noted, "here")
            assert rt.agents.get(root_id) is None
            rt.subagents.followup(p, g, f"m{i}")
            assert noted.runs(f"m{i}", ["here"]), i
            child, _mid = rt.subagents.start_continuable(
                ContinuableStartSpec(
                    parent=p, provider="local", prompt=f"s{i}", label="s", model="note"
                )
            )
            assert noted.runs(f"s{i}", ["here"]), i
            assert child in [r.id for r in rt.subagents.list_children(p).rows]
        assert [c for _, c, _ in noted.items()].count("m7") == 1
    finally:
        rt.close()
