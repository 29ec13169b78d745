"""The benchmark harness: rows, the group registry, timing, the table, JSON, chart.

A *group* is a function registered with :func:`group` that takes a
:class:`Context` and returns :class:`Row` objects. Every row that is compared
with something names its baseline, measured in the same run (absolute figures
drift between machines and runs; ratios travel). Groups live in modules named
``bench/*_bench.py``, which ``python -m bench`` imports to register them.
"""

from __future__ import annotations

import dataclasses
import gc
import importlib
import importlib.metadata
import json
import os
import pkgutil
import platform
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "GROUPS",
    "Context",
    "Row",
    "compare",
    "discover",
    "format_table",
    "group",
    "machine_info",
    "rate",
    "run_threads",
    "timer",
    "write_chart",
    "write_json",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One measured figure, optionally compared with a same-run baseline.

    ``ratio`` is ``value / baseline_value``. ``target`` bounds the ratio in the
    direction of ``better``: at least ``target`` when higher is better, at most
    when lower is better.
    """

    workload: str
    backend: str
    store: str
    value: float
    unit: str
    baseline: str | None = None
    baseline_value: float | None = None
    ratio: float | None = None
    target: float | None = None
    better: Literal["higher", "lower"] | None = "higher"
    group: str = ""

    @property
    def missed(self) -> bool:
        """Whether the row has a target and misses it."""
        if self.target is None or self.ratio is None:
            return False
        if self.better == "lower":
            return self.ratio > self.target
        return self.ratio < self.target


def compare(row: Row, baseline: Row, *, target: float | None = None) -> Row:
    """``row`` with ``baseline``'s name and value and the ratio between them."""
    ratio = row.value / baseline.value if baseline.value else None
    return dataclasses.replace(
        row,
        baseline=baseline.workload,
        baseline_value=baseline.value,
        ratio=ratio,
        target=target,
    )


def child_json(script: str, *args: str, timeout: float = 1200) -> dict[str, float]:
    """Run ``script`` in a fresh interpreter (``python -c script *args``, from the
    project's root) and return the JSON object its last line of output printed.
    A measurement of its own process: one run's garbage does not blur the next."""
    out = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=str(Path(__file__).resolve().parents[1]),
    )
    if out.returncode != 0:
        raise RuntimeError(f"measuring child failed: {out.stderr[-2000:]}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@dataclass(slots=True, kw_only=True)
class Context:
    """What a group gets: the mode and a scratch directory (removed afterwards)."""

    quick: bool
    tmpdir: Path
    log: Callable[[str], None] = field(default=lambda _msg: None)

    def size(self, full: int, quick: int) -> int:
        """``full`` normally, ``quick`` in ``--quick`` smoke mode."""
        return quick if self.quick else full


GroupFn = Callable[[Context], list[Row]]
GROUPS: dict[str, GroupFn] = {}


def group(name: str) -> Callable[[GroupFn], GroupFn]:
    """Register a benchmark group under ``name`` (decorator)."""

    def register(fn: GroupFn) -> GroupFn:
        if name in GROUPS:
            raise ValueError(f"benchmark group {name!r} registered twice")
        GROUPS[name] = fn
        return fn

    return register


def discover() -> None:
    """Import every ``bench/*_bench.py`` module so its groups register."""
    package = importlib.import_module("bench")
    for module in pkgutil.iter_modules(package.__path__):
        if module.name.endswith("_bench"):
            importlib.import_module(f"bench.{module.name}")


# -- timing ---------------------------------------------------------------------


@contextmanager
def timer() -> Iterator[Callable[[], float]]:
    """``with timer() as elapsed: ...``; ``elapsed()`` gives seconds (perf_counter)."""
    start = time.perf_counter()
    end: list[float] = []
    yield lambda: (end[0] if end else time.perf_counter()) - start
    end.append(time.perf_counter())


def settle() -> None:
    """Collect the garbage earlier work left before a timed region starts.

    Without it a measurement pays for its predecessor's debt: the collector runs
    when allocations cross a threshold, and a full collection walks every live
    object, so whatever the last workload left behind is charged to the next.
    The collector stays on while timing: its cost is part of ours.
    """
    gc.collect()


def best_of(repeat: int, fn: Callable[[], float]) -> float:
    """The highest of ``repeat`` calls of ``fn`` (each returns a rate), each started settled."""
    best = 0.0
    for _ in range(repeat):
        settle()
        best = max(best, fn())
    return best


def best_of_each(repeat: int, *fns: Callable[[], float]) -> list[float]:
    """The highest rate of each of ``fns`` over ``repeat`` rounds, taken in turn.

    A round calls every function once (each started settled), so a slow spell
    of a shared machine lands on a baseline and on the figure compared with it
    alike, instead of on whichever happened to be running.
    """
    best = [0.0] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            settle()
            best[i] = max(best[i], fn())
    return best


def min_time(repeat: int, fn: Callable[[], object]) -> float:
    """The fewest seconds ``fn`` took in ``repeat`` calls, each started settled."""
    best = float("inf")
    for _ in range(repeat):
        settle()
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def rate(n: int, fn: Callable[[], object], *, repeat: int = 1) -> float:
    """Operations per second of ``fn`` (which performs ``n``); best of ``repeat``."""
    return n / min_time(repeat, fn)


def run_threads(workers: Sequence[Callable[[], object]]) -> float:
    """Run each worker in its own thread, released together; seconds until all end.

    The clock starts when every thread is ready (a barrier) and stops when the
    last one finished. Every thread is joined; a worker's exception is re-raised.
    """
    barrier = threading.Barrier(len(workers) + 1)
    errors: list[BaseException] = []

    def wrap(worker: Callable[[], object]) -> None:
        barrier.wait()
        try:
            worker()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    return elapsed


# -- output ---------------------------------------------------------------------


def machine_info() -> dict[str, Any]:
    """The machine and library versions a result was measured with."""
    versions: dict[str, str | None] = {}
    for dist in ("pykka", "gevent", "msgpack", "subagents"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "sqlite": sqlite3.sqlite_version,
        "versions": versions,
    }


def _num(value: float) -> str:
    if value >= 100:
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def _target(row: Row) -> str:
    if row.target is None:
        return ""
    sign = "<=" if row.better == "lower" else ">="
    return f"{sign}{row.target:.2f}x"


def format_table(rows: Sequence[Row]) -> str:
    """A plain-text table (no colour): one line per row, ratios and targets."""
    header = (
        "group",
        "workload",
        "backend",
        "store",
        "value",
        "unit",
        "baseline",
        "ratio",
        "target",
        "",
    )
    lines: list[tuple[str, ...]] = [header]
    for r in rows:
        lines.append(
            (
                r.group,
                r.workload,
                r.backend,
                r.store,
                _num(r.value),
                r.unit,
                "" if r.baseline is None else f"{r.baseline} {_num(r.baseline_value or 0)}",
                "" if r.ratio is None else f"{r.ratio:.2f}x",
                _target(r),
                "MISSED" if r.missed else ("ok" if r.target is not None else ""),
            )
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    right = {4, 7}  # numbers align right
    out = []
    for n, line in enumerate(lines):
        cells = [
            cell.rjust(widths[i]) if i in right else cell.ljust(widths[i])
            for i, cell in enumerate(line)
        ]
        out.append("  ".join(cells).rstrip())
        if n == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def write_json(path: Path, rows: Sequence[Row], machine: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"machine": machine, "rows": [dataclasses.asdict(r) for r in rows]}
    path.write_text(json.dumps(data, indent=2) + "\n")


def write_chart(path: Path, rows: Sequence[Row], machine: dict[str, Any]) -> bool:
    """A bar chart of every ratio, with its target; ``False`` without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    compared = [r for r in rows if r.ratio is not None]
    if not compared:
        return False
    labels = [f"{r.group}: {r.workload} [{r.backend}/{r.store}]" for r in compared]
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(compared) + 1.5))
    colours = ["tab:red" if r.missed else "tab:blue" for r in compared]
    positions = range(len(compared))
    ax.barh(positions, [r.ratio or 0 for r in compared], color=colours)
    for y, r in zip(positions, compared):
        if r.target is not None:
            ax.plot([r.target, r.target], [y - 0.4, y + 0.4], color="black", linewidth=2)
    ax.set_yticks(list(positions), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.axvline(1.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("ratio to the same-run baseline (black tick: target)")
    ax.set_title(
        f"subagents benchmarks — Python {machine['python']}, {machine['cpu_count']} CPUs",
        fontsize=9,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
