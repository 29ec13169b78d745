"""Command line of the benchmark suite: ``python -m bench [GROUP ...]``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench._harness import (
    GROUPS,
    Context,
    Row,
    discover,
    format_table,
    machine_info,
    write_chart,
    write_json,
)

DEFAULT_CHART = Path(__file__).resolve().parent / "out" / "bench.png"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description=(
            "Run the subagents benchmarks and print each figure beside a baseline "
            "measured in the same run. Exits 1 when a row misses its target "
            "(never in --quick mode)."
        ),
    )
    parser.add_argument("groups", nargs="*", metavar="GROUP", help="groups to run (default: all)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke mode: every workload tiny; checks that it runs, asserts nothing about speed",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the rows as JSON")
    parser.add_argument(
        "--chart",
        type=Path,
        metavar="PATH",
        default=DEFAULT_CHART,
        help="bar chart of ratios vs targets (needs matplotlib; default: %(default)s)",
    )
    parser.add_argument("--no-chart", action="store_true", help="do not draw the chart")
    parser.add_argument("--list", action="store_true", help="list the groups and exit")
    parser.add_argument(
        "--in-process",
        action="store_true",
        help="run every group in this interpreter (default: a fresh one per group)",
    )
    parser.add_argument("--rows-to", type=Path, help=argparse.SUPPRESS)  # a child's rows
    return parser


def _run_isolated(name: str, quick: bool) -> list[Row]:
    """Run one group in a fresh interpreter and read its rows back.

    One group's heap must not tax the next: a group that leaves 100,000 objects
    behind makes every later full garbage collection slower, and with them the
    next group's ratios (fan-out once measured 5x slower after the catalog).
    """
    with tempfile.TemporaryDirectory(prefix="subagents-bench-rows-") as tmp:
        out = Path(tmp) / "rows.json"
        argv = [sys.executable, "-m", "bench", name, "--in-process", "--rows-to", str(out)]
        if quick:
            argv.append("--quick")
        done = subprocess.run(argv, check=False)
        if done.returncode not in (0, 1) or not out.exists():
            raise SystemExit(f"group {name!r} failed (exit {done.returncode})")
        data = json.loads(out.read_text())
    return [Row(**row) for row in data["rows"]]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    discover()
    if args.list:
        print("\n".join(sorted(GROUPS)))
        return 0
    unknown = [g for g in args.groups if g not in GROUPS]
    if unknown:
        print(f"unknown group(s): {', '.join(unknown)}; known: {', '.join(sorted(GROUPS))}")
        return 2
    names = args.groups or sorted(GROUPS)
    machine = machine_info()
    if args.rows_to is None:
        print(
            f"python {machine['python']} on {machine['platform']}, {machine['cpu_count']} CPUs, "
            + ", ".join(f"{k} {v}" for k, v in machine["versions"].items() if v)
            + (" [--quick: sizes are tiny, figures mean nothing]" if args.quick else "")
        )
    rows: list[Row] = []
    if len(names) > 1 and not args.in_process:
        for name in names:  # each child prints its own progress
            rows += _run_isolated(name, args.quick)
        return _report(args, rows, machine)
    for name in names:
        start = time.perf_counter()
        with tempfile.TemporaryDirectory(prefix=f"subagents-bench-{name}-") as tmp:
            ctx = Context(
                quick=args.quick, tmpdir=Path(tmp), log=lambda m: print(f"  {m}", flush=True)
            )
            print(f"[{name}] running...", flush=True)
            produced = GROUPS[name](ctx)
        rows += [r if r.group else dataclasses.replace(r, group=name) for r in produced]
        print(f"[{name}] {len(produced)} rows in {time.perf_counter() - start:.1f}s", flush=True)
    if args.rows_to:
        write_json(args.rows_to, rows, machine)
        return 0
    return _report(args, rows, machine)


def _report(args: argparse.Namespace, rows: list[Row], machine: dict[str, Any]) -> int:
    print()
    print(format_table(rows))
    if args.json:
        write_json(args.json, rows, machine)
        print(f"\nwrote {args.json}")
    if not args.no_chart and write_chart(args.chart, rows, machine):
        print(f"wrote {args.chart}")
    missed = [r for r in rows if r.missed]
    if missed and not args.quick:
        print(f"\n{len(missed)} row(s) missed their target")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
