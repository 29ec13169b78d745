"""Baselines measured in the same run, fan-out, and reports.

* ``baselines`` -- the paths every ratio is read against (BASELINES.md):
  ``collections.deque``, ``queue.Queue`` thread hand-off, gevent ``Queue`` between
  greenlets, raw pykka ``tell`` on threads and on our gevent runtime, thespian
  ``simpleSystemBase``, autogen-core ``SingleThreadedAgentRuntime`` (sequential
  ``send_message``), raw sqlite3 group commit. A missing optional package (the
  ``bench`` extra) skips its row with a note.
* ``fanout`` -- one parent, 100 continuable children, 100 follow-ups each:
  accepted follow-ups -> completed turns per second, both runtimes; compared
  with autogen-core's sequential send rate (target >= 10x).
* ``reports`` -- a resident continuable child reporting to its parent: quiet
  reports/s and waking reports (each one parent turn)/s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors.testing import Block, Gate, ScriptedBehaviour
from subagents.store import MemoryStore

from bench._baselines import (
    autogen_in_turn,
    autogen_rate,
    deque_rate,
    gevent_queue_rate,
    queue_rate,
    raw_sqlite_group,
    raw_tell,
    thespian_rate,
)
from bench._harness import Context, Row, compare, group

BACKENDS = ("threading", "gevent")


@group("baselines")
def baselines(ctx: Context) -> list[Row]:
    n = ctx.size(200_000, 2000)
    measured: list[tuple[str, str, str, Callable[[], float | None], str]] = [
        ("deque append+popleft", "-", "-", lambda: deque_rate(n * 5), "msg/s"),
        ("queue.Queue thread hand-off", "threading", "-", lambda: queue_rate(n), "msg/s"),
        ("gevent Queue greenlet hand-off", "gevent", "-", lambda: gevent_queue_rate(n), "msg/s"),
        ("raw pykka tell", "threading", "-", lambda: raw_tell("threading", n), "msg/s"),
        ("raw pykka tell", "gevent", "-", lambda: raw_tell("gevent", n), "msg/s"),
        (
            "raw sqlite3 group commit x1000",
            "-",
            "sqlite",
            lambda: raw_sqlite_group(str(ctx.tmpdir), n),
            "rows/s",
        ),
        ("thespian simpleSystemBase tell", "-", "-", lambda: thespian_rate(n), "msg/s"),
        (
            "autogen-core send_message (sequential)",
            "asyncio",
            "-",
            lambda: autogen_rate(ctx.size(5000, 100), 3),  # best of three, its own interpreter
            "msg/s",
        ),
    ]
    rows = []
    for workload, backend, store, measure, unit in measured:
        value = measure()
        if value is None:  # an optional package of the `bench` extra is missing
            ctx.log(f"{workload}: not installed, row skipped (pip install -e '.[bench]')")
            continue
        rows.append(Row(workload=workload, backend=backend, store=store, value=value, unit=unit))
    return rows


# -- fan-out ----------------------------------------------------------------------------


@group("fanout")
def fanout(ctx: Context) -> list[Row]:
    children = ctx.size(100, 5)
    per_child = ctx.size(100, 5)
    rows: list[Row] = []
    for backend in BACKENDS:
        gate = Gate()
        with Runtime(MemoryStore(), backend=backend) as rt:
            rt.models.register("blocker", lambda _o: ScriptedBehaviour([Block(gate)]))

            def child(turn: Any) -> Any:
                if turn.index == 0:  # keep the child resident: it waits on a blocked grandchild
                    turn.subagents.start_continuable(
                        "local", "hold", label="holder", model="blocker"
                    )
                return None

            rt.models.register("child", lambda _o: child)
            root = rt.spawn("echo", label="root")
            ids = [
                rt.subagents.start_continuable(
                    ContinuableStartSpec(
                        parent=root, provider="local", prompt="s", label=f"c{i}", model="child"
                    )
                ).child_id
                for i in range(children)
            ]
            while gate.arrivals < children:
                rt.backend.sleep(0.005)
            agents = [rt.agents.get(cid) for cid in ids]
            assert all(a is not None and a.wait_idle(60) for a in agents)

            def round_() -> float:
                start = time.perf_counter()
                for k in range(per_child):
                    for cid in ids:
                        rt.subagents.followup(root, cid, k)
                assert all(a is not None and a.wait_idle(300) for a in agents)
                return children * per_child / (time.perf_counter() - start)

            # Best of three rounds, like the pipelined workload (one round is
            # 10,000 turns, ~0.1 s, short enough for one full collection or a
            # scheduler hiccup to move it by a tenth), taken in turn with
            # autogen-core's so the machine's slow spells land on both.
            base, value = autogen_in_turn(ctx.size(5000, 100), round_, with_=backend)
            gate.release()
        row = Row(
            workload=f"fanout 1 parent x {children} children x {per_child}",
            backend=backend,
            store="memory",
            value=value,
            unit="turns/s",
        )
        if base is not None:
            rows += [base, compare(row, base, target=10.0)]
        else:
            rows.append(row)
    return rows


# -- reports ------------------------------------------------------------------------------


@group("reports")
def reports(ctx: Context) -> list[Row]:
    n = ctx.size(20_000, 200)
    rows: list[Row] = []
    for backend in BACKENDS:
        for delivery in ("quiet", "waking"):
            gate = Gate()
            box: dict[str, Any] = {}
            with Runtime(MemoryStore(), backend=backend) as rt:
                rt.models.register("blocker", lambda _o: ScriptedBehaviour([Block(gate)]))

                def child(turn: Any) -> Any:
                    turn.subagents.start_continuable(
                        "local", "hold", label="holder", model="blocker"
                    )
                    box["child"] = turn.agent
                    return None

                rt.models.register("child", lambda _o: child)
                root = rt.spawn(lambda t: None, label="root")
                rt.subagents.start_continuable(
                    ContinuableStartSpec(
                        parent=root, provider="local", prompt="s", label="reporter", model="child"
                    )
                )
                while gate.arrivals < 1:
                    rt.backend.sleep(0.005)
                reporter = box["child"]
                assert reporter.wait_idle(60)
                start = time.perf_counter()
                for i in range(n):
                    rt.subagents.report_from(reporter, i, delivery=delivery)
                if delivery == "quiet":
                    root.followup("collect")  # the quiet reports are context of this turn
                assert root.wait_idle(300)
                value = n / (time.perf_counter() - start)
                gate.release()
            rows.append(
                Row(
                    workload=f"reports child->parent ({delivery})",
                    backend=backend,
                    store="memory",
                    value=value,
                    unit="reports/s",
                )
            )
    return rows
