"""Actor-layer workloads on both runtimes, each beside raw pykka measured in the same run.

* ``oneshot`` -- one-shot ``start -> result -> dispose`` cycles per second, against a
  raw pykka ``start + ask + stop`` cycle (target ratio >= 0.3).
* ``followup`` -- follow-up -> completed turn throughput, pipelined: on a top-level
  agent, and on a resident continuable child with the memory and the SQLite store;
  against raw ``tell`` (target >= 0.3, memory store; on gevent against the turn
  floor, a raw actor recording each turn's three events, because the floor itself
  stays below 0.3x of gevent's raw ``tell``). Request/response latency p50 and p99
  (follow-up, then wait for the turn) against raw ``ask`` (target p50 <= 2x).
  With SQLite every turn's events are durable before the clock stops; that row is
  compared with raw sqlite3 group commit (target >= 0.1).
* ``resume`` -- cold-resume latency (follow-up to a settled child until its turn
  ends) at 10 and 10,000 prior events; the 10,000 row's baseline is the 10 row
  (target <= 2x).
* ``drain`` -- ``drain_continuable_descendants`` of a forest of 10,000 resident
  continuable descendants on gevent (1,000 on threads), seconds (target <= 1 s on
  gevent: the row's baseline is a fixed 1 s).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from typing import Any

from subagents.actors import (
    AbortSignal,
    ContinuableStartSpec,
    Runtime,
    SubagentStartRequest,
    get_backend,
)
from subagents.actors.testing import Block, Gate, ScriptedBehaviour
from subagents.store import MemoryStore

from bench._baselines import (
    RawAsk,
    autogen_in_turn,
    raw_cycle,
    raw_sqlite_group,
    raw_tell,
    turn_floor,
)
from bench._harness import Context, Row, best_of, best_of_each, compare, group, settle

BACKENDS = ("threading", "gevent")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# -- oneshot --------------------------------------------------------------------------


@group("oneshot")
def oneshot(ctx: Context) -> list[Row]:
    n = ctx.size(2000, 50)
    rows = []
    for backend in BACKENDS:

        def ours() -> float:
            with Runtime(backend=backend) as rt:
                parent = rt.spawn("echo")
                start = time.perf_counter()
                for i in range(n):
                    run = rt.subagents.start(
                        "local",
                        SubagentStartRequest(parent=parent, prompt=i, signal=AbortSignal.never()),
                    )
                    run.result.get(10)
                    run.dispose()
                return n / (time.perf_counter() - start)

        raw_value, value = best_of_each(3, lambda: raw_cycle(backend, n), ours)
        raw = Row(
            workload="raw pykka start+ask+stop",
            backend=backend,
            store="-",
            value=raw_value,
            unit="cycles/s",
        )
        rows += [
            raw,
            compare(
                Row(
                    workload="oneshot start+result+dispose",
                    backend=backend,
                    store="none",
                    value=value,
                    unit="cycles/s",
                ),
                raw,
                target=0.3,
            ),
        ]
        ctx.log(f"oneshot {backend}: {value:,.0f}/s vs raw {raw.value:,.0f}/s")
    return rows


# -- followup -------------------------------------------------------------------------


def _resident_child(rt: Runtime, gate: Gate) -> tuple[Any, Any]:
    """A continuable child kept resident (waiting) by a grandchild blocked on ``gate``."""
    rt.models.register("blocker", lambda _o: ScriptedBehaviour([Block(gate)]), replace=True)

    def child(turn: Any) -> Any:
        if turn.index == 0:
            turn.subagents.start_continuable("local", "hold", label="holder", model="blocker")
        return None

    rt.models.register("child", lambda _o: child, replace=True)
    root = rt.spawn("echo", label="root")
    handle = rt.subagents.start_continuable(
        ContinuableStartSpec(
            parent=root, provider="local", prompt="start", label="child", model="child"
        )
    )
    assert gate.wait_reached(30)
    agent = rt.agents.get(handle.child_id)
    assert agent is not None
    assert agent.wait_idle(30)
    return root, agent


def _pipelined(rt: Runtime, root: Any, agent: Any, n: int, durable: bool) -> float:
    subagents = rt.subagents
    cid = agent.session_id
    start = time.perf_counter()
    for i in range(n):
        subagents.followup(root, cid, i)
    assert agent.wait_idle(120)
    if durable:
        rt.sessions.flush(cid)
    return n / (time.perf_counter() - start)


def _latencies(
    rt: Runtime, root: Any, agent: Any, raw: RawAsk, n: int
) -> tuple[list[float], list[float]]:
    """``n`` raw asks and ``n`` follow-up round trips, in six blocks taken in turn
    (a slow spell of the machine lands on both samples, not on ours alone)."""
    asks: list[float] = []
    ours: list[float] = []
    cid = agent.session_id
    block = max(1, n // 6)
    try:
        for first in range(0, n, block):
            count = min(block, n - first)
            settle()
            asks += raw.sample(count)
            settle()
            for i in range(first, first + count):
                # No timeout, like the raw ask it is compared with: a gevent wait
                # with a timeout arms a hub timer (~2.4 us of the p50).
                t = time.perf_counter()
                rt.subagents.followup(root, cid, i)
                agent.wait_idle()
                ours.append(time.perf_counter() - t)
    finally:
        raw.stop()
    return asks, ours


def _toplevel_row(backend: str, n: int) -> Row:
    """Pipelined follow-ups to a top-level agent with no store.

    A function of its own so that the agent's in-memory log (every turn of the
    three runs) is released before the next workload is timed.
    """
    with Runtime(backend=backend) as rt:
        top = rt.spawn(lambda t: None)

        def top_level() -> float:
            start = time.perf_counter()
            for i in range(n):
                top.followup(i)
            assert top.wait_idle(120)
            return n / (time.perf_counter() - start)

        value = best_of(3, top_level)
    return Row(
        workload="followup_toplevel (pipelined)",
        backend=backend,
        store="none",
        value=value,
        unit="turns/s",
    )


@group("followup")
def followup(ctx: Context) -> list[Row]:
    n = ctx.size(50_000, 500)
    lat_n = ctx.size(3000, 50)
    rows: list[Row] = []
    raw_sqlite = Row(
        workload="raw sqlite3 group commit x1000",
        backend="-",
        store="sqlite",
        value=raw_sqlite_group(str(ctx.tmpdir), ctx.size(200_000, 2000)),
        unit="rows/s",
    )
    rows.append(raw_sqlite)
    for backend in BACKENDS:
        tell = Row(
            workload="raw pykka tell",
            backend=backend,
            store="-",
            value=best_of(3, lambda: raw_tell(backend, n)),
            unit="msg/s",
        )
        rows.append(tell)
        floor = Row(
            workload="turn floor (raw actor recording turns)",
            backend=backend,
            store="-",
            value=best_of(3, lambda: turn_floor(backend, n)),
            unit="turns/s",
        )
        rows.append(compare(floor, tell))
        rows.append(compare(_toplevel_row(backend, n), tell))
        for store in ("memory", "sqlite"):
            spec: Any = MemoryStore() if store == "memory" else str(ctx.tmpdir / f"f-{backend}.db")
            gate = Gate()
            # Write-behind acceptance, as this row has always measured: strict
            # acceptance (a commit per accepted message) is the durability group's.
            with Runtime(spec, backend=backend, durability="relaxed") as rt:
                root, agent = _resident_child(rt, gate)
                autogen: Row | None = None
                if store == "memory":
                    # autogen-core in turn with our rounds: the ratio's two sides
                    # share the machine's slow spells.
                    autogen, value = autogen_in_turn(
                        ctx.size(5000, 100),
                        lambda: _pipelined(rt, root, agent, n, False),
                        with_=backend,
                    )
                else:
                    value = best_of(3, lambda: _pipelined(rt, root, agent, n, True))
                row = Row(
                    workload="followup_pipelined",
                    backend=backend,
                    store=store,
                    value=value,
                    unit="turns/s",
                )
                if store == "memory":
                    # The target is 0.3x raw tell. Where the same run's turn
                    # floor (a raw actor doing only what a turn must) is itself below
                    # 0.3x tell, no design that records turns can meet it, and the
                    # target is read against the floor instead (bench/README.md,
                    # "Targets revised"): always on gevent (tell ~0.6 us), and on
                    # threads in runs where the thread hand-off is in its fast mode
                    # (raw tell 460-500k/s against the usual 170-220k/s).
                    if autogen is not None:
                        vs_autogen = dataclasses.replace(
                            row, workload="followup_pipelined vs autogen"
                        )
                        rows += [autogen, compare(vs_autogen, autogen, target=10.0)]
                    if floor.value < 0.3 * tell.value:
                        rows.append(compare(row, tell))
                        vs_floor = dataclasses.replace(row, workload="followup_pipelined vs floor")
                        rows.append(compare(vs_floor, floor, target=0.3))
                    else:
                        rows.append(compare(row, tell, target=0.3))
                else:
                    # each turn appends 3 events: compare events/s with rows/s
                    ev = Row(
                        workload="followup_pipelined durable events",
                        backend=backend,
                        store=store,
                        value=value * 3,
                        unit="events/s",
                    )
                    rows += [row, compare(ev, raw_sqlite, target=0.1)]
                if store == "memory":
                    asks, ours = _latencies(rt, root, agent, RawAsk(backend), lat_n)
                    for q, name in ((0.5, "p50"), (0.99, "p99")):
                        base = Row(
                            workload=f"raw pykka ask {name}",
                            backend=backend,
                            store="-",
                            value=_pct(asks, q) * 1e6,
                            unit="us",
                            better="lower",
                        )
                        mine = Row(
                            workload=f"followup_latency {name}",
                            backend=backend,
                            store=store,
                            value=_pct(ours, q) * 1e6,
                            unit="us",
                            better="lower",
                        )
                        rows += [base, compare(mine, base, target=2.0 if q == 0.5 else None)]
                gate.release()
        ctx.log(f"followup {backend} done")
    return rows


# -- resume ---------------------------------------------------------------------------


@group("resume")
def resume(ctx: Context) -> list[Row]:
    sizes = (10, ctx.size(10_000, 200))
    reps = ctx.size(20, 3)
    rows: list[Row] = []
    for backend in BACKENDS:
        by_size: dict[int, Row] = {}
        with Runtime(MemoryStore(), backend=backend) as rt:
            root = rt.spawn("echo", label="root")
            for size in sizes:
                handle = rt.subagents.start_continuable(
                    ContinuableStartSpec(
                        parent=root, provider="local", prompt="p", label=f"c{size}"
                    )
                )
                cid = handle.child_id
                turns = max(1, size // 3)
                for i in range(turns - 1):  # each turn appends 3 events
                    rt.subagents.followup(root, cid, i)
                _wait_settled(rt, cid)
                lat = []
                for i in range(reps):
                    t = time.perf_counter()
                    rt.subagents.followup(root, cid, f"resume {i}")
                    agent = rt.agents.get(cid)
                    if agent is not None:
                        agent.wait_idle(30)
                    lat.append(time.perf_counter() - t)
                    _wait_settled(rt, cid)
                by_size[size] = _latency(f"cold resume, {size} prior events", backend, lat)
        rows += _growth(by_size, sizes)
        rows += _resume_top_level(backend, sizes, reps)
    return rows


def _latency(workload: str, backend: str, lat: list[float]) -> Row:
    """The median of ``lat`` (seconds) as a row, in microseconds."""
    value = statistics.median(lat) * 1e6
    return Row(
        workload=workload, backend=backend, store="memory", value=value, unit="us", better="lower"
    )


def _growth(by_size: dict[int, Row], sizes: tuple[int, int]) -> list[Row]:
    """The small log's row, and the big one's against it (at most 2x)."""
    small, big = by_size[sizes[0]], by_size[sizes[1]]
    return [small, compare(big, small, target=2.0)]


def _resume_top_level(backend: str, sizes: tuple[int, int], reps: int) -> list[Row]:
    """A top-level agent disposed and resumed (as a server disposing idle agents
    does): a resume and one turn, at each log size. Its disposal's checkpoint
    keeps the resume from refolding the whole log."""
    by_size: dict[int, Row] = {}
    with Runtime(MemoryStore(), backend=backend) as rt:
        for size in sizes:
            agent = rt.spawn("echo", label=f"top{size}")
            sid = agent.session_id
            for i in range(max(1, size // 3)):  # each turn appends 3 events
                agent.followup(i)
            agent.wait_idle(60)
            agent.dispose()
            lat = []
            for i in range(reps):
                t = time.perf_counter()
                agent = rt.agents.resume(sid)
                agent.followup(f"resume {i}")
                agent.wait_idle(30)
                lat.append(time.perf_counter() - t)
                agent.dispose()
            workload = f"top-level resume after dispose, {size} prior events"
            by_size[size] = _latency(workload, backend, lat)
    return _growth(by_size, sizes)


def _wait_settled(rt: Runtime, cid: Any, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    backend = rt.backend
    while rt.continuation.activation(cid) is not None or rt.agents.get(cid) is not None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{cid} did not settle")
        backend.sleep(0.001)


# -- drain ----------------------------------------------------------------------------


@group("drain")
def drain(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    for backend in BACKENDS:
        total = ctx.size(10_000 if backend == "gevent" else 1_000, 60)
        fanout = 100 if total >= 10_000 else 10
        gate = Gate()
        with Runtime(MemoryStore(), backend=backend) as rt:
            rt.models.register("leaf", lambda _o: ScriptedBehaviour([Block(gate)]))

            def mid(turn: Any) -> Any:
                if turn.index == 0:
                    for j in range(turn.content):
                        turn.subagents.start_continuable(
                            "local", "hold", label=f"leaf{j}", model="leaf"
                        )
                return None

            rt.models.register("mid", lambda _o: mid)
            root = rt.spawn("echo", label="root")
            mids = max(1, total // (fanout + 1))
            for i in range(mids):
                rt.subagents.start_continuable(
                    ContinuableStartSpec(
                        parent=root, provider="local", prompt=fanout, label=f"mid{i}", model="mid"
                    )
                )
            expected = mids * (fanout + 1)
            deadline = time.monotonic() + 300
            while len(rt.continuation.activations()) < expected or gate.arrivals < mids * fanout:
                if time.monotonic() > deadline:
                    raise TimeoutError("forest did not build")
                get_backend(backend).sleep(0.01)
            # Building the forest (and, before it, the threaded forest's teardown)
            # leaves the collector's counters anywhere: without this, whether one
            # full collection of the million-object heap (0.22 s) fell inside the
            # drain depended on a few thousand allocations either way.
            settle()
            start = time.perf_counter()
            rt.subagents.drain_continuable_descendants([root], timeout=300)
            elapsed = time.perf_counter() - start
            assert rt.continuation.activations() == []
        one_second = Row(
            workload="fixed budget", backend=backend, store="-", value=1.0, unit="s", better="lower"
        )
        row = Row(
            workload=f"drain of {expected} descendants",
            backend=backend,
            store="memory",
            value=elapsed,
            unit="s",
            better="lower",
        )
        rows.append(compare(row, one_second, target=1.0 if backend == "gevent" else None))
        ctx.log(f"drain {backend}: {expected} in {elapsed:.3f}s")
    return rows
