"""Load on ``examples/gevent_server.py`` from a second process: keep-alive, memory, throughput.

Run from the repository's root (about two minutes on two cores)::

    python tests/examples/load_server.py                # 5,000 sessions: 30,000 requests
    python tests/examples/load_server.py --sessions 1000 --window 200

It starts the server as a subprocess on a fresh SQLite store and prints:

* requests per second for one client over one keep-alive connection, and for
  one client opening a new connection per request (the same requests);
* the server's RSS after the first window of sessions and at the end, and the
  live top-level agents it reports (``GET /stats``): idle disposal keeps them,
  and so memory, bounded however many sessions were created;
* sessions per second in the first window after a warm-up and in the window
  starting after 3,000 sessions (their ratio should stay >= 0.8), by the wall
  clock and per second of the server's CPU time (what other processes on a
  shared machine disturb much less).

A session is one client's conversation: create a top-level agent, start a child,
follow it up, have it report (waking, usually after it settled), message the
agent, list its children -- six requests. ``test_examples.py`` runs the same
functions on a smaller scale.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
from server_kit import Server, start_server, stop_server

REQUESTS_PER_SESSION = 6


def keepalive_vs_new(server: Server, n: int) -> tuple[float, float]:
    """Requests/s of ``n`` ``GET /stats``: over one keep-alive connection, then each
    on a new connection."""
    conn = server.connect()
    try:
        server.call("GET", "/stats", conn=conn)  # connected
        start = time.perf_counter()
        for _ in range(n):
            assert server.call("GET", "/stats", conn=conn)[0] == 200
        keepalive = n / (time.perf_counter() - start)
    finally:
        conn.close()
    start = time.perf_counter()
    for _ in range(n):
        assert server.call("GET", "/stats")[0] == 200
    return keepalive, n / (time.perf_counter() - start)


def session(server: Server, conn: object, name: str) -> None:
    """One client session (six requests, see the module docstring)."""
    kw = {"client": name, "conn": conn}

    def ok(method: str, path: str, body: object = None) -> dict[str, str]:
        status, data = server.call(method, path, body, **kw)  # type: ignore[arg-type]
        assert status == 200, (method, path, status, data)
        return data  # type: ignore[no-any-return]

    agent = ok("POST", "/agents", {"label": "boss"})["session_id"]
    child = ok("POST", f"/agents/{agent}/children", {"prompt": "go", "label": "kid"})["child_id"]
    ok("POST", f"/agents/{agent}/children/{child}/followup", {"content": "more"})
    ok("POST", f"/agents/{agent}/children/{child}/report", {"content": 1, "delivery": "waking"})
    ok("POST", f"/agents/{agent}/messages", {"content": "hello"})
    ok("GET", f"/agents/{agent}/children")


@dataclass
class Load:
    """What a run measured: when each session finished, RSS by requests served."""

    finished: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # the server's CPU seconds then
    rss: list[tuple[int, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def rate(self, first: int, window: int) -> float:
        """Sessions/s over the ``window`` sessions finished after the ``first``."""
        return window / (self.finished[first + window - 1] - self.finished[first - 1])

    def cpu_rate(self, first: int, window: int) -> float:
        """Sessions per second of the server's CPU time, over the same window: what
        other processes on the machine change much less than wall-clock rates."""
        return window / (self.cpu[first + window - 1] - self.cpu[first - 1])


def run_sessions(server: Server, sessions: int, clients: int, rss_every: int) -> Load:
    """``sessions`` sessions from ``clients`` threads, each on its own keep-alive
    connection; the server's RSS sampled every ``rss_every`` sessions."""
    load = Load()
    counter = itertools.count()
    lock = threading.Lock()
    proc = psutil.Process(server.proc.pid)
    load.rss.append((0, proc.memory_info().rss))

    def client(c: int) -> None:
        conn = server.connect()
        try:
            while next(counter) < sessions:
                session(server, conn, f"client-{c}")
                with lock:
                    load.finished.append(time.perf_counter())
                    times = proc.cpu_times()
                    load.cpu.append(times.user + times.system)
                    done = len(load.finished)
                    if done % rss_every == 0:
                        load.rss.append((done * REQUESTS_PER_SESSION, proc.memory_info().rss))
        except Exception as exc:  # reported by the caller
            with lock:
                load.errors.append(repr(exc))
        finally:
            conn.close()

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if len(load.finished) % rss_every:
        load.rss.append((len(load.finished) * REQUESTS_PER_SESSION, proc.memory_info().rss))
    return load


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=5000, help="(6 requests each)")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients")
    parser.add_argument("--window", type=int, default=300, help="sessions per throughput window")
    parser.add_argument("--after", type=int, default=3000, help="the later window starts here")
    parser.add_argument("--requests", type=int, default=500, help="keep-alive vs new connection")
    parser.add_argument("server_args", nargs="*", help="more arguments for the server")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp) / "load.db", *args.server_args)
        try:
            keepalive, fresh = keepalive_vs_new(server, args.requests)
            print(f"keep-alive: {keepalive:.0f} requests/s; new connection each: {fresh:.0f}")
            load = run_sessions(server, args.sessions, args.clients, args.window)
            stats = server.call("GET", "/stats")[1]
        finally:
            stop_server(server)
    if load.errors:
        print("errors:", load.errors[:5])
        return 1
    (_, first), (n, last) = load.rss[1], load.rss[-1]
    print(
        f"RSS after {load.rss[1][0]} requests: {first / 2**20:.1f} MiB;"
        f" after {n}: {last / 2**20:.1f} MiB ({(last - first) / 2**20:+.1f} MiB)"
    )
    print("RSS (MiB) by requests:", ", ".join(f"{n}: {r / 2**20:.1f}" for n, r in load.rss))
    print(f"server: {stats}")
    w = args.window
    for name, rate in (
        ("sessions/s", load.rate),
        ("sessions per server CPU-second", load.cpu_rate),
    ):
        start, after = rate(w, w), rate(args.after, w)
        print(
            f"{name}: {start:.1f} at start (sessions {w}-{2 * w}),"
            f" {after:.1f} after {args.after} sessions: ratio {after / start:.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
