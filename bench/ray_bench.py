"""Continuable children placed on a Ray cluster (issue 15 point 4).

A local Ray cluster (the machine's CPUs), one host actor on a SQLite file, the
parent runtime in this process (threads, strict durability, children kept warm
so the rows measure the follow-up path, not settling):

* **follow-up -> turn to a Ray-placed child**: N follow-ups sent back to back,
  timed until the child is idle again (every turn ended on the host), against
  **N raw Ray actor method calls** submitted back to back and gathered, measured
  in turn, in the same run -- the floor of any work Ray runs remotely;
* **time to place a child**: ``start_continuable`` through the ``ray`` provider
  until its first turn ended on the host (session created here, lease taken
  and prompt replayed there), best of a few.

Without Ray installed (the ``ray`` extra) the group's rows are skipped.
"""

from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any

from bench._harness import Context, Row, compare, group

_ROOT = Path(__file__).resolve().parents[1]


def _note(turn: Any) -> Any:
    return turn.content


def setup_host(runtime: Any) -> None:
    """Register the bench's model in a host (pickled by reference: module-level)."""
    runtime.models.register("note", lambda _options: _note, replace=True)


class _Echo:
    """The raw baseline's actor: one method, no work."""

    def f(self, x: Any) -> Any:
        return x


def _raw_calls(actor: Any, n: int) -> float:
    import ray

    start = time.perf_counter()
    ray.get([actor.f.remote(i) for i in range(n)])
    return n / (time.perf_counter() - start)


def _wait_idle(rt: Any, cid: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        act = rt.continuation.activation(cid)
        if act is not None and act.agent.idle:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"placed child {cid} did not go idle")
        time.sleep(0.0005)


def _followups(rt: Any, root: Any, cid: Any, n: int) -> float:
    start = time.perf_counter()
    for i in range(n):
        rt.subagents.followup(root, cid, i)
    _wait_idle(rt, cid)
    return n / (time.perf_counter() - start)


@group("ray")
def ray_group(ctx: Context) -> list[Row]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import ray
            from subagents.actors import ContinuableStartSpec, Runtime
            from subagents.actors.ray import RayPlacement
    except ImportError as exc:
        ctx.log(f"ray: not installed ({exc}); rows skipped")
        return []
    path = os.pathsep.join(p for p in (str(_ROOT), os.environ.get("PYTHONPATH")) if p)
    ray.init(
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    try:
        db = str(ctx.tmpdir / "ray.db")
        placement = RayPlacement(db, setup=setup_host, hosts=1)
        echo = ray.remote(_Echo).options(num_cpus=0).remote()
        ray.get(echo.f.remote(0))
        n, rounds = ctx.size(2_000, 50), ctx.size(3, 1)
        with Runtime(db, keep_warm=float("inf")) as rt:
            setup_host(rt)
            registration = rt.subagents.register_provider(placement)
            root = rt.spawn("note", label="bench root")

            def place() -> tuple[float, Any]:
                start = time.perf_counter()
                spec = ContinuableStartSpec(
                    parent=root, provider="ray", prompt="first", label="placed", model="note"
                )
                cid = rt.subagents.start_continuable(spec).child_id
                _wait_idle(rt, cid)
                return time.perf_counter() - start, cid

            placed = [place() for _ in range(ctx.size(5, 2))]
            cid = placed[-1][1]
            ours, raw = 0.0, 0.0
            for _ in range(rounds):  # in turn, best of each
                raw = max(raw, _raw_calls(echo, n))
                ours = max(ours, _followups(rt, root, cid, n))
            registration.dispose()
        placement.close()
    finally:
        ray.shutdown()
    baseline = Row(
        workload=f"raw Ray actor method calls x{n}, pipelined",
        backend="-",
        store="-",
        value=raw,
        unit="calls/s",
        better="higher",
    )
    return [
        baseline,
        compare(
            Row(
                workload=f"follow-up -> turn to a Ray-placed child x{n}",
                backend="threading",
                store="sqlite FULL",
                value=ours,
                unit="turns/s",
                better="higher",
            ),
            baseline,
        ),
        Row(
            workload="place a child on a Ray host (start -> first turn ended)",
            backend="threading",
            store="sqlite FULL",
            value=min(t for t, _ in placed) * 1e3,
            unit="ms",
            better="lower",
        ),
    ]
