"""Group ``durability``: what strict durability costs, across threads and processes.

* durable acceptance -- 1, 16 and 100 producer threads calling ``followup`` on
  one agent of a strict SQLite runtime (each call returns after its message is
  fsynced; concurrent calls share a commit), against raw ``sqlite3`` writing the
  same rows into the same table (the store's inbox, its indexes included): one
  row per commit (1 producer), or the ideal group commit of as many rows per
  commit as there are producers (one thread, no coordination). The target rows
  accept into an agent busy in a turn (the acceptance path alone: every message
  queued); the ``turns running`` rows accept while the agent runs each message
  as it comes, its turns' writes sharing the store with the producers;
* a follow-up across processes -- this process ``send``s to a session another
  process holds; the holder's doorbell wakes it, it runs the turn and answers on
  a datagram socket: the round trip's p50, beside the same round trip in one
  process;
* the CPU an idle lease holder burns in 10 s (its renewals and mail sweeps);
* the replay of 10,000 accepted messages after the process that accepted them
  was killed, beside the same messages followed up and run in one process.
"""

from __future__ import annotations

import os
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

from subagents.actors import Runtime
from subagents.protocol import encode_event, new_message_id, new_session_id, trusted_message
from subagents.store import SqliteStore

from bench._harness import Context, Row, best_of_each, compare, group, run_threads, settle
from bench._renewal import HOLDER, UPDATE_ALL, hold_leases, renewal_rows

PAYLOAD = "x" * 130

# The holder process: spawns a session whose turns answer on a datagram socket,
# prints its id, then holds it until its stdin closes.
_HOLDER = textwrap.dedent(
    """
    import socket, sys
    from subagents.actors import Runtime
    db, reply = sys.argv[1], sys.argv[2]
    out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    def answer(_o):
        def on_turn(turn):
            out.sendto(str(turn.content).encode(), reply)
        return on_turn
    with Runtime(db) as rt:
        rt.models.register("answer", answer)
        agent = rt.spawn("answer")
        print(agent.session_id, flush=True)
        sys.stdin.read()
    """
)

# The producer that is killed: accepts N messages behind a turn that never ends.
_VICTIM = textwrap.dedent(
    """
    import sys, threading
    from subagents.actors import Runtime
    db, n = sys.argv[1], int(sys.argv[2])
    block = threading.Event()
    def stuck(_o):
        def on_turn(turn):
            block.wait()
        return on_turn
    rt = Runtime(db)
    rt.models.register("sink", stuck)
    agent = rt.spawn("sink")
    agent.followup("first")
    def produce(k):
        for i in range(k, n, 16):
            agent.followup(i)
    threads = [threading.Thread(target=produce, args=(k,)) for k in range(16)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(agent.session_id, flush=True)
    block.wait()
    """
)


def _sink(_options: Any) -> Any:
    return lambda turn: None


def _raw(path: Path, n: int, batch: int) -> float:
    """Raw sqlite3 writing the same rows into the same table: the store's inbox
    (its schema, its indexes -- the dedup index among them), WAL,
    synchronous=FULL, ``batch`` rows per commit (rows/s)."""
    SqliteStore(path).close()  # the schema, and nothing else
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("pragma synchronous=FULL")
        body = encode_event(trusted_message(new_message_id(), PAYLOAD, None))
        key = new_session_id().to_bytes()
        start = time.perf_counter()
        for j in range(0, n, batch):
            conn.execute("begin immediate")
            conn.executemany(
                _INSERT,
                (
                    (key, i + 1, new_message_id().to_bytes(), body, 1, 0.0)
                    for i in range(j, min(n, j + batch))
                ),
            )
            conn.execute("commit")
        return n / (time.perf_counter() - start)
    finally:
        conn.close()


_INSERT = (
    "INSERT INTO inbox (session, n, message_id, body, epoch, accepted_at) VALUES (?, ?, ?, ?, ?, ?)"
)


def accept_rate(path: Path | str, producers: int, per: int, *, running: bool) -> float:
    """Messages accepted per second by ``producers`` threads following up one agent:
    busy in a turn until they are done (``running=False``: the acceptance path
    alone, every message queued), or running their turns as they arrive."""
    hold = threading.Event()
    with Runtime(str(path)) as rt:
        rt.models.register("sink", lambda _o: lambda turn: None if running else hold.wait())
        agent = rt.spawn("sink")
        if not running:
            agent.followup("occupy")

        def produce() -> None:
            for _ in range(per):
                agent.followup(PAYLOAD)

        settle()
        elapsed = run_threads([produce] * producers)
        hold.set()
        agent.wait_idle(600)
    return producers * per / elapsed


def in_process_round_trip(path: Path | str, n: int) -> list[float]:
    done = threading.Event()
    with Runtime(str(path)) as rt:
        rt.models.register("answer", lambda _o: lambda turn: done.set())
        agent = rt.spawn("answer")
        samples = []
        for i in range(n):
            done.clear()
            start = time.perf_counter()
            agent.followup(i)
            done.wait(30)
            samples.append(time.perf_counter() - start)
    return samples


def cross_process_round_trip(
    ctx: Context, n: int, db: str | None = None
) -> tuple[list[float], float]:
    """p50 samples of send -> the holder's turn -> its answer; and the holder's CPU
    seconds while idle for the idle window. ``db``: the shared store (default: an
    SQLite file in the scratch directory)."""
    db = db if db is not None else str(ctx.tmpdir / "cross.db")
    reply = str(ctx.tmpdir / f"reply-{os.getpid()}-{time.monotonic_ns()}.sock")
    inbox = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    inbox.bind(reply)
    inbox.settimeout(30)
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, db, reply],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdin is not None
        sid = holder.stdout.readline().strip()
        samples = []
        with Runtime(db) as rt:
            for i in range(n):
                start = time.perf_counter()
                rt.agents.send(sid, i)
                inbox.recv(64)
                samples.append(time.perf_counter() - start)
        idle = _idle_cpu(holder.pid, ctx.size(10, 1))
        holder.stdin.close()
        holder.wait(60)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        inbox.close()
    return samples, idle


def _idle_cpu(pid: int, seconds: float) -> float:
    """CPU seconds (user + system) process ``pid`` used over ``seconds`` of wall time."""
    import psutil

    proc = psutil.Process(pid)
    before = proc.cpu_times()
    time.sleep(seconds)  # the measured window: the process is left alone
    after = proc.cpu_times()
    return (after.user - before.user) + (after.system - before.system)


def _idle_python_cpu(seconds: float) -> float:
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        time.sleep(0.5)  # past its start-up
        return _idle_cpu(sleeper.pid, seconds)
    finally:
        sleeper.kill()
        sleeper.wait()


def _replay(ctx: Context, n: int) -> float:
    """Messages/s replayed by a resume after the process that accepted them was killed."""
    db = str(ctx.tmpdir / "replay.db")
    victim = subprocess.Popen(
        [sys.executable, "-c", _VICTIM, db, str(n)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert victim.stdout is not None
        sid = victim.stdout.readline().strip()
    finally:
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait()
    with Runtime(db) as rt:
        rt.models.register("sink", _sink)
        settle()
        start = time.perf_counter()
        agent = rt.agents.resume(sid)
        agent.wait_idle(600)
        elapsed = time.perf_counter() - start
    return (n + 1) / elapsed


def _pipelined(path: Path, n: int) -> float:
    """The same number of messages followed up and run in one process (msgs/s)."""
    with Runtime(str(path)) as rt:
        rt.models.register("sink", _sink)
        agent = rt.spawn("sink")
        settle()
        start = time.perf_counter()
        for i in range(n):
            agent.followup(i)
        agent.wait_idle(600)
        return n / (time.perf_counter() - start)


def _row(workload: str, value: float, unit: str, **kw: Any) -> Row:
    return Row(
        workload=workload, backend="threading", store="sqlite FULL", value=value, unit=unit, **kw
    )


def acceptance_rows(
    raw: str, store: str, producers: int, rates: list[float], target: float | None
) -> list[Row]:
    """The rows of one producer count: the ``raw`` baseline (``raw`` names the driver),
    then ours queued and with turns running on ``store``. ``rates``: the three, in
    that order (as :func:`best_of_each` returns them)."""
    raw_value, queued, running = rates
    label = f"{producers} producer{'s' if producers > 1 else ''}"
    if producers == 1:
        workload = f"raw {raw} inbox row, commit per message"
    else:
        workload = f"raw {raw} inbox rows, group commit x{producers}"
    base = Row(workload=workload, backend="-", store=f"raw {raw}", value=raw_value, unit="msg/s")

    def ours(workload: str, value: float) -> Row:
        return Row(workload=workload, backend="threading", store=store, value=value, unit="msg/s")

    return [
        base,
        compare(ours(f"durable acceptance, {label}", queued), base, target=target),
        compare(ours(f"durable acceptance, {label}, turns running", running), base),
    ]


def round_trip_rows(
    store: str, local: list[float], remote: list[float], remote_name: str
) -> list[Row]:
    """The p50 of a follow-up's round trip in one process, and across processes
    against it (seconds in, microseconds out)."""

    def p50(workload: str, samples: list[float]) -> Row:
        value = statistics.median(samples) * 1e6
        return Row(
            workload=workload, backend="threading", store=store, value=value, unit="us",
            better="lower",
        )  # fmt: skip

    local_row = p50("follow-up round trip, one process, p50", local)
    remote_row = p50(remote_name, remote)
    return [local_row, compare(remote_row, local_row)]


@group("durability")
def durability_group(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    for producers, per, target in ((1, 600, 0.8), (16, 150, 0.3), (100, 30, None)):
        size = ctx.size(per, 5)
        rows_n = ctx.size(600, 30) if producers == 1 else ctx.size(6000, 200)
        # The raw rows and ours in turn, best of three each (five for one producer:
        # a round is short and an fsync's time varies by +-20% from round to round
        # on the same disk): a slow spell of the machine lands on both sides.
        rounds = iter(range(1_000_000))
        rates = best_of_each(
            1 if ctx.quick else 5 if producers == 1 else 3,
            lambda: _raw(ctx.tmpdir / f"raw{producers}-{next(rounds)}.db", rows_n, producers),
            lambda: accept_rate(
                ctx.tmpdir / f"accept{producers}-{next(rounds)}.db", producers, size, running=False
            ),
            lambda: accept_rate(
                ctx.tmpdir / f"run{producers}-{next(rounds)}.db", producers, size, running=True
            ),
        )
        rows += acceptance_rows("sqlite3", "sqlite FULL", producers, rates, target)
    n = ctx.size(300, 20)
    local = in_process_round_trip(ctx.tmpdir / "local.db", n)
    remote, idle = cross_process_round_trip(ctx, n)
    rows += round_trip_rows("sqlite FULL", local, remote, "follow-up across processes, p50")
    window = ctx.size(10, 1)
    python_idle = Row(
        workload=f"idle python process, CPU over {window} s",
        backend="-",
        store="-",
        value=_idle_python_cpu(window) * 1000,
        unit="ms",
        better="lower",
    )
    rows.append(python_idle)
    budget = Row(
        workload="budget 1% of a core", backend="-", store="-", value=window * 10.0, unit="ms"
    )
    rows.append(
        compare(
            _row(f"idle lease holder, CPU over {window} s", idle * 1000, "ms", better="lower"),
            budget,
            target=1.0,
        )
    )
    count = ctx.size(10_000, 200)
    pipelined = _row(
        f"{count} follow-ups run in one process",
        _pipelined(ctx.tmpdir / "pipelined.db", count),
        "msg/s",
    )
    rows.append(pipelined)
    rows.append(
        compare(
            _row(f"replay of {count} accepted after SIGKILL", _replay(ctx, count), "msg/s"),
            pipelined,
        )
    )
    rows += _renewal(ctx.tmpdir / "renewal.db", ctx.size(100_000, 500), 1 if ctx.quick else 5)
    return rows


def _renewal(path: Path, n: int, rounds: int) -> list[Row]:
    with SqliteStore(path) as store:
        hold_leases(store, n)
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("pragma synchronous=FULL")

            def update_all(expires: float) -> int:
                conn.execute("begin immediate")
                updated = conn.execute(UPDATE_ALL, (expires, HOLDER)).rowcount
                conn.execute("commit")
                return int(updated)

            return renewal_rows(store, n, "sqlite FULL", update_all, rounds)
        finally:
            conn.close()
