"""Memory of resident idle continuable children.

* ``memory`` -- RSS delta per resident idle Activation over 10,000 children, on
  both runtimes (targets: <= 16 KiB on gevent, <= 48 KiB on threads), beside
  raw pykka actors measured the same way (an idle actor each).
* ``idle100k`` -- 100,000 idle continuable children resident at once on gevent
  (target: total RSS <= 2 GiB).

Children are kept resident with ``Runtime(keep_warm=inf)`` (an idle child would
otherwise settle and leave memory). Each measurement runs in a fresh
subprocess so one run's garbage does not blur the next, on the SQLite store (the
sessions live on disk, as in production).
"""

from __future__ import annotations

from bench._harness import Context, Row, child_json, compare, group

_CHILD = r"""
import gc, json, os, sys, time
import psutil
backend, n, db, kind = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
proc = psutil.Process()
if kind == "raw":
    import pykka
    from subagents.actors import GeventActor
    base = pykka.ThreadingActor if backend == "threading" else GeventActor
    class Idle(base):
        def on_receive(self, message):
            return message
    warm = [Idle.start() for _ in range(50)]
    gc.collect(); before = proc.memory_info().rss
    refs = [Idle.start() for _ in range(n)]
    refs[-1].ask("ping")
    gc.collect(); after = proc.memory_info().rss
    for r in refs + warm:
        r.stop()
    print(json.dumps({"per": (after - before) / n, "rss": after}))
    sys.exit(0)
from subagents.actors import ContinuableStartSpec, Runtime
# Relaxed: the starts are accepted write-behind. The resident footprint (leases
# included) is the same under strict durability; the build is 100,000 fsyncs faster.
with Runtime(db, backend=backend, keep_warm=float("inf"), durability="relaxed") as rt:
    root = rt.spawn("echo", label="root")
    spec = lambda i: ContinuableStartSpec(parent=root, provider="local", prompt="p", label=f"c{i}")
    for i in range(50):
        rt.subagents.start_continuable(spec(i))
    rt.wait_idle(60); rt.sessions.flush(); gc.collect()
    before = proc.memory_info().rss
    start = time.perf_counter()
    for i in range(n):
        rt.subagents.start_continuable(spec(i))
    assert rt.wait_idle(6000)
    peak = proc.memory_info().rss  # the write-behind queue of the creates included
    rt.sessions.flush(timeout=None); gc.collect()
    after = proc.memory_info().rss
    resident = len(rt.continuation.activations())
    assert resident == n + 50, resident
    took = time.perf_counter() - start
    result = {"per": (after - before) / n, "rss": after, "peak": peak, "seconds": took}
    print(json.dumps(result), flush=True)
    if n >= 100_000:
        # Measured. Closing settles and records every child (minutes for a million):
        # not what this measures, so the process ends here.
        os._exit(0)
"""


def _measure(
    ctx: Context, backend: str, n: int, kind: str, timeout: float = 1200
) -> dict[str, float]:
    db = str(ctx.tmpdir / f"mem-{backend}-{kind}-{n}.db")
    return child_json(_CHILD, backend, str(n), db, kind, timeout=timeout)


@group("memory")
def memory(ctx: Context) -> list[Row]:
    n = ctx.size(10_000, 200)
    rows: list[Row] = []
    for backend, target in (("gevent", 16.0), ("threading", 48.0)):
        raw = _measure(ctx, backend, n, "raw")
        ours = _measure(ctx, backend, n, "activation")
        base = Row(
            workload="raw pykka idle actor",
            backend=backend,
            store="-",
            value=raw["per"] / 1024,
            unit="KiB",
            better="lower",
        )
        budget = Row(
            workload=f"budget {target:.0f} KiB",
            backend=backend,
            store="-",
            value=target,
            unit="KiB",
            better="lower",
        )
        mine = Row(
            workload=f"idle resident Activation (RSS over {n})",
            backend=backend,
            store="sqlite",
            value=ours["per"] / 1024,
            unit="KiB",
            better="lower",
        )
        rows += [base, compare(mine, budget, target=1.0)]
        per, raw_per = ours["per"] / 1024, raw["per"] / 1024
        ctx.log(f"{backend}: {per:.1f} KiB per Activation (raw actor {raw_per:.1f} KiB)")
    return rows


def idle_children(ctx: Context, n: int, budget_gib: int, timeout: float = 1200) -> Row:
    """``n`` idle continuable children resident at once on gevent: their total RSS
    against a budget of ``budget_gib`` GiB."""
    ours = _measure(ctx, "gevent", n, "activation", timeout)
    budget = Row(
        workload=f"budget {budget_gib} GiB",
        backend="gevent",
        store="-",
        value=budget_gib * 1024.0,
        unit="MiB",
        better="lower",
    )
    row = Row(
        workload=f"{n} idle continuable children, total RSS",
        backend="gevent",
        store="sqlite",
        value=ours["rss"] / 2**20,
        unit="MiB",
        better="lower",
    )
    ctx.log(
        f"{n:,} children built in {ours['seconds']:.0f}s, {ours['per'] / 1024:.1f} KiB each,"
        f" {ours['peak'] / 2**30:.1f} GiB before the writes were flushed"
    )
    return compare(row, budget, target=1.0)


@group("idle100k")
def idle100k(ctx: Context) -> list[Row]:
    return [idle_children(ctx, ctx.size(100_000, 500), 2)]
