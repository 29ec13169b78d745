"""Group ``takeover``: how long a killed worker of another host strands its work.

A worker process on a shared PostgreSQL store holds a session whose turn is
running, its holder naming another host (no pid check judges it, as for a
worker in another container or on another machine), and is killed with
SIGKILL. A runtime here (the default ``lease_ttl``, 30 s; 3 s in quick mode)
is asked nothing: the figure is the seconds from the kill until the message
starts again here, as a redelivery. Measured twice, in turn:

* the holder's listening connection judged (``store/_pg_listen.py``): its work is
  taken up a grace after the server stops showing that connection;
* the baseline, a holder whose channel is of the plain form (as an earlier
  version's, or one behind a pooler that hides its name): only its lease's
  expiry frees the work.

By design the first takes the grace (a sixth of the ttl) plus up to a sweep
period (a third): 5-15 s; the second the rest of the lease (two thirds of the
ttl to all of it) plus up to a period: 20-40 s. The target, the worst of each
against the other, is the design's bound: at most 0.75x.

The server is the ``postgres`` group's (``SUBAGENTS_BENCH_POSTGRES_URL``, else a
throwaway cluster); without one the rows are skipped with a note.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from bench._harness import Context, Row, compare, group
from bench.postgres_bench import _schema, _server

# The worker: holds a session whose turn never ends, prints its id, waits to be killed.
_WORKER = textwrap.dedent(
    """
    import os, sys, threading
    from subagents.store import _holders, _postgres
    _holders._HOST = "another-host~0.0"
    if sys.argv[2] == "plain":
        _postgres.HEARD = "subagents_"  # an earlier version's form: never judged
    from subagents.actors import Runtime
    running = threading.Event()
    def block(_o):
        def on_turn(turn):
            running.set()
            turn.signal.wait(3600)
        return on_turn
    with Runtime(sys.argv[1], lease_ttl=float(sys.argv[3])) as rt:
        rt.models.register("block", block)
        agent = rt.spawn("block")
        agent.followup("first")
        assert running.wait(60)
        print(agent.session_id, flush=True)
        sys.stdin.read()
    """
)


def _stranded(url: str, form: str, ttl: float) -> float:
    """Seconds from the worker's SIGKILL until its message runs here."""
    from subagents.actors import Runtime

    root = str(Path(__file__).resolve().parents[1])
    proc = subprocess.Popen(
        [sys.executable, "-c", _WORKER, url, form, str(ttl)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=root,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        sid = proc.stdout.readline().strip()
        if not sid:
            raise RuntimeError(
                f"takeover worker failed: {proc.stderr.read() if proc.stderr else ''}"
            )
        ran = threading.Event()
        with Runtime(url, lease_ttl=ttl) as rt:
            rt.models.register("block", lambda _o: lambda turn: ran.set())
            rt.backend.sleep(1.5)  # its first sweep is made (the runtime's opening)
            killed = time.monotonic()
            os.kill(proc.pid, 9)
            proc.wait()
            deadline = killed + 3 * ttl + 30
            while not ran.is_set():
                if time.monotonic() > deadline:
                    raise RuntimeError("the killed worker's message never ran again")
                rt.backend.sleep(0.01)
            return time.monotonic() - killed
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


@group("takeover")
def takeover(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    with _server(ctx) as url:
        if url is None:
            return rows
        ttl = 3.0 if ctx.quick else 30.0
        heard, plain = [], []
        for _round in range(1 if ctx.quick else 2):
            heard.append(_stranded(_schema(url), "heard", ttl))
            plain.append(_stranded(_schema(url), "plain", ttl))
        ctx.log(f"takeover: heard {heard} s, by expiry {plain} s (lease_ttl {ttl:g} s)")
        base = Row(
            workload=f"killed worker of another host: its work runs again, at expiry (ttl {ttl:g})",
            backend="threading",
            store="postgresql",
            value=max(plain),
            unit="s",
            better="lower",
        )
        mine = Row(
            workload="killed worker of another host: its work runs again, connection gone",
            backend="threading",
            store="postgresql",
            value=max(heard),
            unit="s",
            better="lower",
        )
        rows += [base, compare(mine, base, target=None if ctx.quick else 0.75)]
    return rows
