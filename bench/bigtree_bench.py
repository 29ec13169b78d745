"""A frame of ``subagents tree`` on a big production-like store, read-only.

A store of a few hundred trees (10,000 sessions on SQLite, 5,000 on PostgreSQL):
continuable children with 2 to 8 turns, one-shot children, quiet reports, a
twentieth with a turn left open (half of them held by a live lease), a few
interrupted, a sixth with messages waiting in the durable inbox, and half the
identities not cached (a runtime that died before settling them). One frame --
what ``tree --json``, a ``--watch`` frame and a ``serve`` frame read -- is timed
on a read-only store, as the command opens it, against a fixed budget (3 s on
SQLite, 2 s on PostgreSQL, on a 2-core machine); its statements are counted.

Before the batched reads: 3.8 s and 10,386 statements (SQLite, 9,900 sessions),
3.8 s and 5,576 statements on a local PostgreSQL (4,950 sessions; 18 s with a
server a few milliseconds away). After: 1.9 s and 117; 1.9 s and 72.
"""

from __future__ import annotations

import datetime as dt
import random
import threading
import time
from typing import Any

from subagents.actors._shell._cli import _open_existing
from subagents.actors._shell._tree import collect_trees
from subagents.protocol import (
    ContinuableDescriptor,
    InterruptEvent,
    MessageEvent,
    OneShotDescriptor,
    ReportEvent,
    SessionHeader,
    TurnEnd,
    TurnStart,
    descriptor_event,
    new_message_id,
    new_session_id,
    packb,
)
from subagents.store import open_store

from bench._harness import Context, Row, compare, group, min_time
from bench.postgres_bench import _schema, _server

_T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def _turns(rnd: random.Random, clock: list[float], n: int, open_last: bool) -> list[Any]:
    out: list[Any] = []
    for t in range(n):
        mid = new_message_id()
        clock[0] += 0.5
        out.append(TurnStart(turn=t, at=_T0 + dt.timedelta(seconds=clock[0]), message_ids=(mid,)))
        if rnd.random() < 0.3:
            report = "child says: " + "x" * rnd.randint(20, 200)
            out.append(ReportEvent(message_id=new_message_id(), content=report, delivery="quiet"))
        out.append(MessageEvent(message_id=mid, content="do: " + "y" * rnd.randint(20, 300)))
        if t == n - 1 and open_last:
            break
        clock[0] += 0.5
        out.append(
            TurnEnd(
                turn=t,
                at=_T0 + dt.timedelta(seconds=clock[0]),
                stop_reason="cancelled" if rnd.random() < 0.05 else "completed",
                output={"summary": "z" * rnd.randint(50, 600), "n": t},
            )
        )
    return out


def build(url: str, trees: int, total: int, seed: int = 1) -> None:
    """Write the store described in the module docstring at ``url``."""
    rnd = random.Random(seed)
    clock = [0.0]
    jobs: list[tuple[Any, ...]] = []  # (header, events, accepted, leased, cached identity)
    n = 0
    for t in range(trees):
        n += 1
        root = SessionHeader(
            id=new_session_id(),
            parent_session=None,
            origin="user",
            delegation_depth=0,
            created_at=_T0 + dt.timedelta(seconds=n),
            label=f"tree-{t}",
        )
        jobs.append((root, _turns(rnd, clock, rnd.randint(1, 4), False), [], False, None))
        nodes = [root]
        for k in range(total // trees - 1):
            n += 1
            parent = rnd.choice(nodes[: len(nodes) // 2 + 1])
            label = f"t{t}-c{k}"
            one_shot = rnd.random() < 0.25
            d: Any = (
                OneShotDescriptor(provider="local", label=label)
                if one_shot
                else ContinuableDescriptor(
                    provider="local", label=label, agent_provider="local", model="echo"
                )
            )
            head = SessionHeader(
                id=new_session_id(),
                parent_session=parent.id,
                origin="subagent",
                delegation_depth=parent.delegation_depth + 1,
                created_at=_T0 + dt.timedelta(seconds=n),
                label=label,
            )
            open_last = rnd.random() < 0.05
            if one_shot:
                events = _turns(rnd, clock, 1, open_last)
                events.insert(1, descriptor_event(d))
            else:
                events = [descriptor_event(d), *_turns(rnd, clock, rnd.randint(2, 8), open_last)]
                if rnd.random() < 0.05:
                    at = _T0 + dt.timedelta(seconds=clock[0] + 0.1)
                    events.append(InterruptEvent(at=at, cause="asked"))
            accepted: list[Any] = []
            if not one_shot and rnd.random() < 0.15:
                accepted = [
                    MessageEvent(message_id=new_message_id(), content="later")
                    for _ in range(rnd.randint(1, 3))
                ]
            cached = None
            if rnd.random() < 0.5:
                cached = (1 if one_shot else 0, packb({"mode": d.mode, "label": label}))
            jobs.append((head, events, accepted, open_last and rnd.random() < 0.5, cached))
            nodes.append(head)
    store = open_store(url)
    assert store is not None
    now = time.time()

    def write(chunk: list[tuple[Any, ...]]) -> None:
        for head, events, accepted, leased, cached in chunk:
            store.create_session(head, events)
            if accepted:
                store.accept(head.id, accepted)
            if leased:
                store.acquire_lease(head.id, "alive", now=now, expires=now + 86400)
            if cached:
                store.put_projection(head.id, "subagent", *cached)

    # Several writers so the store's group commit coalesces the creates.
    writers = [threading.Thread(target=write, args=(jobs[i::8],)) for i in range(8)]
    for w in writers:
        w.start()
    for w in writers:
        w.join()
    store.flush()
    store.close()


def _frame(url: str, ctx: Context, repeat: int) -> tuple[float, int]:
    """The fewest seconds a frame took, and its statements."""
    store = _open_existing(url)
    statements = [0]
    query = store._query

    def counted(sql: str, params: Any) -> Any:
        statements[0] += 1
        return query(sql, params)

    store._query = counted
    try:
        trees = collect_trees(store, url, None)  # warm: the first frame is not timed
        ctx.log(f"{sum(1 + len(t['descendants']) for t in trees)} sessions listed")
        statements[0] = 0
        collect_trees(store, url, None)
        counted_statements = statements[0]
        return min_time(repeat, lambda: collect_trees(store, url, None)), counted_statements
    finally:
        store.close()


def _rows(
    store_name: str, sessions: int, seconds: float, statements: int, budget: float
) -> list[Row]:
    limit = Row(
        workload=f"fixed budget {budget:g} s",
        backend="-",
        store="-",
        value=budget,
        unit="s",
        better="lower",
    )
    frame = Row(
        workload=f"a tree frame of {sessions} sessions (read-only)",
        backend="-",
        store=store_name,
        value=seconds,
        unit="s",
        better="lower",
    )
    count = Row(
        workload=f"statements of a tree frame of {sessions} sessions",
        backend="-",
        store=store_name,
        value=float(statements),
        unit="statements",
        better="lower",
    )
    return [limit, compare(frame, limit, target=1.0), count]


@group("bigtree")
def bigtree(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    repeat = 1 if ctx.quick else 3
    trees, sessions = ctx.size(300, 10), ctx.size(10_000, 200)
    path = str(ctx.tmpdir / "big.db")
    start = time.perf_counter()
    build(path, trees, sessions)
    ctx.log(f"built {sessions} sessions on SQLite in {time.perf_counter() - start:.1f}s")
    seconds, statements = _frame(path, ctx, repeat)
    rows += _rows("sqlite", sessions, seconds, statements, 3.0)
    with _server(ctx) as server:
        if server is None:
            return rows
        url = _schema(server)
        trees, sessions = ctx.size(150, 10), ctx.size(5_000, 200)
        build(url, trees, sessions, seed=2)
        seconds, statements = _frame(url, ctx, repeat)
        rows += _rows("postgresql", sessions, seconds, statements, 2.0)
    return rows
