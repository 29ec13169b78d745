"""``statistics``: follow-up throughput while a reader calls ``statistics()``.

Issue 18 point 1: statistics must be cheap enough to read under load. The row
pipelines follow-ups to a resident continuable child (memory store, as
``followup_pipelined``) while a reader calls ``agent.statistics()``,
``runtime.statistics()`` and ``subagents.statistics(child)`` 100 times a second,
on a schedule (a late read is made at once). The reader is an OS thread on both
runtimes: a greenlet in the runtime's hub would run only when the producer
yields, which a pipelined burst never does -- a thread takes the GIL from the
burst every switch interval, the harder case;
its baseline is the same workload without the reader, the two taken in turn in
the same rounds (target: at least 0.95, within 5%). The log line says how often
the reader actually ran.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from subagents.actors import Runtime
from subagents.actors.testing import Gate
from subagents.store import MemoryStore

from bench._harness import Context, Row, best_of_each, compare, group
from bench.actors_bench import BACKENDS, _pipelined, _resident_child

#: Reads a second, as the issue asks.
RATE = 100.0


class _Reader:
    """Calls the three ``statistics()`` every ``1 / RATE`` s until stopped."""

    def __init__(self, rt: Runtime, agent: Any) -> None:
        self.reads = 0
        self._rt, self._agent = rt, agent
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        rt, agent, cid = self._rt, self._agent, self._agent.session_id
        start = time.monotonic()
        while not self._stop.wait(max(0.0, start + self.reads / RATE - time.monotonic())):
            agent.statistics()
            rt.statistics()
            rt.subagents.statistics(cid)
            self.reads += 1

    def __enter__(self) -> _Reader:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


@group("statistics")
def statistics_under_load(ctx: Context) -> list[Row]:
    n = ctx.size(50_000, 500)
    rows: list[Row] = []
    for backend in BACKENDS:
        gate = Gate()
        with Runtime(MemoryStore(), backend=backend, durability="relaxed") as rt:
            root, agent = _resident_child(rt, gate)
            rates: list[float] = []

            def plain() -> float:
                return _pipelined(rt, root, agent, n, False)

            def read() -> float:
                with _Reader(rt, agent) as reader:
                    start = time.perf_counter()
                    value = _pipelined(rt, root, agent, n, False)
                    rates.append(reader.reads / (time.perf_counter() - start))
                return value

            base_value, value = best_of_each(7, plain, read)
            gate.release()
        base = Row(
            workload="followup_pipelined (no reader)",
            backend=backend,
            store="memory",
            value=base_value,
            unit="turns/s",
        )
        mine = Row(
            workload="followup_pipelined, statistics() 100/s",
            backend=backend,
            store="memory",
            value=value,
            unit="turns/s",
        )
        rows += [base, compare(mine, base, target=0.95)]
        ctx.log(
            f"statistics {backend}: {value:,.0f} vs {base_value:,.0f} turns/s,"
            f" reader at {max(rates):,.0f} reads/s"
        )
    return rows
