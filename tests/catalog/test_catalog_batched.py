"""A listing with many uncached identities inspects them a chunk at a time.

Each inspection was a log read and a header read of its own (8 at a time): two
round trips a candidate, which on PostgreSQL were most of a cold listing; the
identities it folded were cached one commit each.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from subagents.actors._catalog import (
    Catalog,
    ProjectionRegistry,
    subagent_timing_unit,
    subagent_unit,
)
from subagents.protocol import (
    ContinuableDescriptor,
    SessionHeader,
    descriptor_event,
    new_session_id,
    unpackb,
)
from subagents.store import open_store

pytestmark = pytest.mark.timeout(120)

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)
CHILDREN = 40


def test_uncached_identities_are_inspected_in_chunks_and_cached_together(db: str) -> None:
    """R-LIST-10: 40 children without a cached identity are inspected in two
    statements (their logs, their headers), not two each; each identity is served
    and cached with the seq it was folded at, so the next listing reads no log."""
    store = open_store(db)
    assert store is not None
    try:
        root = SessionHeader(
            id=new_session_id(),
            parent_session=None,
            origin="user",
            delegation_depth=0,
            created_at=T0,
        )
        store.create_session(root)
        kids = []
        for i in range(CHILDREN):
            d = ContinuableDescriptor(
                provider="local", label=f"c{i}", agent_provider="local", model="echo"
            )
            head = SessionHeader(
                id=new_session_id(),
                parent_session=root.id,
                origin="subagent",
                delegation_depth=1,
                created_at=T0 + dt.timedelta(seconds=i + 1),
                label=f"c{i}",
            )
            store.create_session(head, [descriptor_event(d)])
            kids.append(head.id)
        statements: list[str] = []
        query = store._query  # type: ignore[attr-defined]

        def counted(sql: str, params: Any) -> Any:
            statements.append(sql)
            return query(sql, params)

        store._query = counted  # type: ignore[attr-defined]
        projections = ProjectionRegistry()
        projections.register(subagent_unit)
        projections.register(subagent_timing_unit)
        catalog = Catalog(None, store, projections)
        listing = catalog.list_descendants(root.id)
        assert [(r.id, r.label, r.mode) for r in listing.rows] == [
            (k, f"c{i}", "continuable") for i, k in enumerate(kids)
        ]
        assert not listing.diagnostics
        logs = [s for s in statements if "events" in s]
        assert len(logs) == 1, logs  # it was one per child
        store._query = query  # type: ignore[attr-defined]
        cached = store.get_projections_of("subagent", kids)
        assert {k: (seq, unpackb(data)) for k, (seq, data) in cached.items()} == {
            k: (0, {"mode": "continuable", "label": f"c{i}"}) for i, k in enumerate(kids)
        }
        statements.clear()
        store._query = counted  # type: ignore[attr-defined]
        assert Catalog(None, store, projections).list_descendants(root.id) == listing
        assert not [s for s in statements if "events" in s]
    finally:
        store.close()
