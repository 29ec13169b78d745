"""A million: the scale rows of the lean turn path (issue 20 point 3).

* ``million`` -- ``list_children`` of one parent's children in a
  1,000,000-session SQLite store, warm (target: under 10 ms: the read follows
  the family, not the store), beside the same listing in a 10,000-session store
  measured in the same run; and 1,000,000 idle continuable children resident at
  once on gevent (target: total RSS <= 16 GiB), full mode only -- the quick mode
  builds 2,000 sessions and 500 children.
"""

from __future__ import annotations

import time

from subagents.store import SqliteStore

from bench._harness import Context, Row, compare, group, min_time
from bench.catalog_bench import _build, _catalog
from bench.memory_bench import idle_children


def _children_ms(ctx: Context, size: int) -> tuple[float, int]:
    """Warm ``list_children`` of the root (10 children) in a ``size``-session store:
    milliseconds, and the family's size."""
    path = ctx.tmpdir / f"million-{size}.db"
    with SqliteStore(path, synchronous="OFF") as store:
        start = time.perf_counter()
        root, _ = _build(store, size, fanout=10)
        ctx.log(f"built {size:,} sessions in {time.perf_counter() - start:.0f}s")
        cat = _catalog(store)
        family = len(cat.list_children(root).rows)
        return min_time(5, lambda: cat.list_children(root)) * 1e3, family


@group("million")
def million(ctx: Context) -> list[Row]:
    big, small = ctx.size(1_000_000, 2_000), ctx.size(10_000, 200)
    small_ms, _ = _children_ms(ctx, small)
    big_ms, family = _children_ms(ctx, big)
    budget = Row(
        workload="budget 10 ms",
        backend="-",
        store="-",
        value=10.0,
        unit="ms",
        better="lower",
    )
    base = Row(
        workload=f"list_children of {family} in a {small:,}-session store warm",
        backend="threading",
        store="sqlite",
        value=small_ms,
        unit="ms",
        better="lower",
    )
    listing = Row(
        workload=f"list_children of {family} in a {big:,}-session store warm",
        backend="threading",
        store="sqlite",
        value=big_ms,
        unit="ms",
        better="lower",
    )
    rows = [base, compare(listing, budget, target=1.0)]
    return [*rows, idle_children(ctx, ctx.size(1_000_000, 500), 16, timeout=7200)]
