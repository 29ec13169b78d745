"""Where a follow-up and its turn spend their time (a tool, not a bench group).

    python -m bench.turn_profile [threading|gevent] [--turns N] [--top K]

Follows up a resident continuable child (the ``followup_pipelined`` workload:
memory store, relaxed durability, the bench's ``_resident_child``) and prints,
per follow-up and turn:

* **bytecodes**, by function: every opcode the interpreter executed, counted
  with ``sys.settrace`` (opcode events) -- exact and the same from run to run,
  so a change that trims the path shows even on a loaded machine;
* **Python calls**: ``cProfile``'s call count (C functions included).

  Both are counted on gevent, where the turns run in the tracing thread (on
  threads, the actor's thread was started before any tracing: the code path
  is the same);
* **CPU microseconds**, best of five rounds. On gevent the producer's loop and
  the consumer's turns run one after the other in one thread (the actor runs
  once the producer waits), so they are timed apart, on the thread's CPU clock
  (``time.thread_time``), which other processes' load moves far less than the
  wall clock. On threads both overlap: only the whole is given (wall clock).

bench/README.md keeps these figures before and after each change to the path.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import gc
import pstats
import sys
import time
from collections.abc import Callable
from typing import Any

from subagents.actors import Runtime
from subagents.actors.testing import Gate
from subagents.store import MemoryStore

from bench.actors_bench import _resident_child


def _burst(send: Callable[[int], object], agent: Any, n: int) -> None:
    for i in range(n):
        send(i)
    assert agent.wait_idle(120)


def _bytecodes(send: Callable[[int], object], agent: Any, n: int) -> collections.Counter[str]:
    counts: collections.Counter[str] = collections.Counter()

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        code = frame.f_code
        key = f"{code.co_filename.rsplit('/', 2)[-2:][-1]}:{code.co_name}"

        def local(frame: Any, event: str, arg: Any) -> Any:
            if event == "opcode":
                counts[key] += 1
            return local

        return local

    sys.settrace(tracer)  # (the turns run in this thread's greenlets)
    try:
        _burst(send, agent, n)
    finally:
        sys.settrace(None)
    return counts


def _calls(send: Callable[[int], object], agent: Any, n: int) -> float:
    profile = cProfile.Profile()
    profile.enable()
    _burst(send, agent, n)
    profile.disable()
    stats = pstats.Stats(profile)
    return sum(v[1] for v in stats.stats.values()) / n  # type: ignore[attr-defined]


def _cpu(backend: str, send: Callable[[int], object], agent: Any, n: int) -> tuple[float, ...]:
    best: tuple[float, ...] = (float("inf"),)
    for _ in range(5):
        gc.collect()
        if backend == "gevent":
            t0 = time.thread_time()
            for i in range(n):
                send(i)
            t1 = time.thread_time()
            assert agent.wait_idle(120)
            t2 = time.thread_time()
            got: tuple[float, ...] = ((t2 - t0) / n * 1e6, (t1 - t0) / n * 1e6, (t2 - t1) / n * 1e6)
        else:
            t0 = time.perf_counter()
            _burst(send, agent, n)
            got = ((time.perf_counter() - t0) / n * 1e6,)
        best = min(best, got)
    return best


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.turn_profile", description=__doc__)
    parser.add_argument("backend", nargs="?", default="gevent", choices=("gevent", "threading"))
    parser.add_argument("--turns", type=int, default=30_000, help="follow-ups timed per round")
    parser.add_argument("--top", type=int, default=25, help="functions listed")
    args = parser.parse_args(argv)
    gate = Gate()
    with Runtime(MemoryStore(), backend=args.backend, durability="relaxed") as rt:
        root, agent = _resident_child(rt, gate)
        cid = agent.session_id
        followup = rt.subagents.followup

        def send(i: int) -> object:
            return followup(root, cid, i)

        _burst(send, agent, 2000)  # warm: the specialising interpreter, the caches
        traced = max(1, args.turns // 10)
        gevent = args.backend == "gevent"
        counts = _bytecodes(send, agent, traced) if gevent else None
        calls = _calls(send, agent, traced) if gevent else None
        cpu = _cpu(args.backend, send, agent, args.turns)
        gate.release()
    print(f"backend {args.backend}: per follow-up and turn")
    if len(cpu) == 3:
        print(f"  CPU us        {cpu[0]:8.2f}  (producer {cpu[1]:.2f}, consumer {cpu[2]:.2f})")
    else:
        print(f"  wall us       {cpu[0]:8.2f}  (producer and consumer overlap on threads)")
    if counts is not None and calls is not None:
        print(f"  Python calls  {calls:8.1f}  (cProfile, C functions included)")
        print(f"  bytecodes     {sum(counts.values()) / traced:8.1f}, by function:")
        for key, value in counts.most_common(args.top):
            print(f"    {value / traced:7.1f}  {key}")


if __name__ == "__main__":
    main()
