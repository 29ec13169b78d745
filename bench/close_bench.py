"""Closing a runtime that holds many idle resident children (a server restarting).

* ``close`` -- ``Runtime.close()`` with 10,000 idle continuable children resident
  on gevent (2,000 on threads), on the SQLite store: each child checkpoints and
  gives its lease back. Beside it, raw pykka stopping as many idle actors
  (``stop(block=False)`` each, then every future waited for), measured in the
  same subprocess. No target: the row says what a restart costs per resident
  child, and shows a change in it.

Each measurement runs in a fresh subprocess (one run's garbage would blur the
next); the children are started under relaxed durability (the build is not
what is measured) and everything is flushed before the clock starts.
"""

from __future__ import annotations

from bench._harness import Context, Row, child_json, compare, group

_CHILD = r"""
import gc, json, sys, time
import pykka
backend, n, db = sys.argv[1], int(sys.argv[2]), sys.argv[3]
from subagents.actors import ContinuableStartSpec, GeventActor, Runtime
base = pykka.ThreadingActor if backend == "threading" else GeventActor
class Idle(base):
    def on_receive(self, message):
        return message
refs = [Idle.start() for _ in range(n)]
refs[-1].ask("ping")
gc.collect()
start = time.perf_counter()
for future in [r.stop(block=False) for r in refs]:
    future.get()
raw = time.perf_counter() - start
del refs
rt = Runtime(db, backend=backend, keep_warm=float("inf"), durability="relaxed")
root = rt.spawn("echo", label="root")
for i in range(n):
    rt.subagents.start_continuable(
        ContinuableStartSpec(parent=root, provider="local", prompt="p", label=f"c{i}")
    )
assert rt.wait_idle(600)
rt.sessions.flush(timeout=None)
assert len(rt.continuation.activations()) == n
gc.collect()
start = time.perf_counter()
rt.close()
ours = time.perf_counter() - start
print(json.dumps({"raw": raw, "ours": ours}), flush=True)
"""


def _per(workload: str, backend: str, store: str, seconds: float, each: str = "child") -> Row:
    return Row(
        workload=workload,
        backend=backend,
        store=store,
        value=seconds * 1e6,
        unit=f"us/{each}",
        better="lower",
    )


@group("close")
def close(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    for backend, n in (("gevent", ctx.size(10_000, 200)), ("threading", ctx.size(2_000, 100))):
        took = child_json(_CHILD, backend, str(n), str(ctx.tmpdir / f"close-{backend}-{n}.db"))
        raw = _per(f"raw pykka stop of {n} idle actors", backend, "-", took["raw"] / n, "actor")
        ours = _per(
            f"Runtime.close with {n} idle resident children", backend, "sqlite", took["ours"] / n
        )
        rows += [raw, compare(ours, raw)]
        ctx.log(f"close {backend}: {n:,} children in {took['ours']:.2f}s (raw {took['raw']:.2f}s)")
    return rows
