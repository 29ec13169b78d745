"""Crash soak driver (a tool, not a test): see README.md.

    python tests/soak/run.py SEED SECONDS DB [NWORKERS] [TTL] [--runs DIR]

DB: ``sqlite`` (a new file in the run directory) or a ``postgresql://`` URL (a
schema of its own, ``soak_<seed>_<pid>``, is added). Starts NWORKERS workers
(threading or gevent at random per start, gevent half of the time
monkey-patched), SIGKILLs (or, with SOAK_STALL, SIGSTOPs) a random worker once it
is up and restarts it, for SECONDS; then stops them (a clean close), runs a clean
recovery, the checker and ``subagents tree``. Exit 0 when all of them passed.
The run directory is DIR/<sq|pg>_<seed> (DIR: --runs, else $SOAK_RUNS, else
<system temp dir>/subagents-soak), emptied first.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import IO, Any

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("seed", type=int)
    p.add_argument("seconds", type=float)
    p.add_argument("db", help="sqlite, or a postgresql:// URL")
    p.add_argument("nworkers", type=int, nargs="?", default=3)
    p.add_argument("ttl", nargs="?", default="4", help="lease TTL in seconds (default 4)")
    default_runs = os.environ.get("SOAK_RUNS") or os.path.join(
        tempfile.gettempdir(), "subagents-soak"
    )
    p.add_argument("--runs", default=default_runs, help=f"runs directory ({default_runs})")
    return p.parse_args(argv)


def with_schema(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}schema={schema}"


class Driver:
    """The workers, their kills and stalls (recorded to kills.jsonl)."""

    def __init__(self, run_dir: str, db: str, ttl: str, rnd: random.Random, pg: bool) -> None:
        self.dir, self.db, self.ttl, self.rnd, self.pg = run_dir, db, ttl, rnd, pg
        self.stall = float(os.environ.get("SOAK_STALL", "0"))
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.born: dict[int, float] = {}  # when it may be killed; -1: not up yet
        # Held for the whole run, closed by stop().
        self.kills: IO[str] = open(os.path.join(run_dir, "kills.jsonl"), "a")  # noqa: SIM115
        self.logs: IO[bytes] = open(os.path.join(run_dir, "workers.log"), "ab")  # noqa: SIM115
        self.nkills = 0

    def note(self, **fields: Any) -> None:
        self.kills.write(json.dumps(fields) + "\n")
        self.kills.flush()

    def start(self, i: int) -> None:
        backend = self.rnd.choice(["threading", "gevent"])
        # A stuck worker is sent SIGABRT at the stop: faulthandler prints its threads.
        env = dict(os.environ, PYTHONFAULTHANDLER="1")
        if self.rnd.random() < 0.5:
            env["SOAK_PATCH"] = "1"
        seed = str(self.rnd.randrange(1 << 30))
        argv = [PY, os.path.join(HERE, "worker.py"), self.dir, self.db, f"w{i}", backend, seed]
        self.procs[i] = subprocess.Popen(
            [*argv, self.ttl], stdout=self.logs, stderr=self.logs, env=env
        )
        self.born[i] = -1.0

    def step(self) -> None:
        """Restart a worker that died by its own hand; kill or stall one that is up."""
        rnd = self.rnd
        time.sleep(rnd.uniform(0.2, 2.0))
        for i, p in list(self.procs.items()):
            if p.poll() is not None:  # a die flag
                self.start(i)
        for j, p in self.procs.items():
            if self.born[j] < 0 and os.path.exists(os.path.join(self.dir, f"up_{p.pid}")):
                self.born[j] = time.monotonic() + rnd.uniform(0.0, 4.0 if self.pg else 2.0)
        ready = [j for j in self.procs if 0 <= self.born[j] <= time.monotonic()]
        if not ready:
            return
        i = rnd.choice(ready)
        p = self.procs[i]
        t = time.time()
        if self.stall and rnd.random() < self.stall and p.poll() is None:
            os.kill(p.pid, signal.SIGSTOP)
            time.sleep(float(self.ttl) * rnd.uniform(0.5, 2.0))
            os.kill(p.pid, signal.SIGCONT)
            self.note(pid=p.pid, stop=t, cont=time.time())
            return
        if p.poll() is None:
            self.note(pid=p.pid, t=t)
            os.kill(p.pid, signal.SIGKILL)
            p.wait()
            self.nkills += 1
        if rnd.random() >= 0.8:
            time.sleep(rnd.uniform(0, 1))
        self.start(i)

    def stop(self) -> bool:
        """Ask every worker to close; False if one did not within 60 s (killed)."""
        open(os.path.join(self.dir, "stop"), "w").close()
        ok = True
        for p in self.procs.values():
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                self.note(pid=p.pid, t=time.time(), stuck=True)
                print("STUCK: worker did not close within 60 s:", p.pid, flush=True)
                os.kill(p.pid, signal.SIGABRT)  # its stacks, to workers.log
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    os.kill(p.pid, signal.SIGKILL)
                    p.wait()
                ok = False
        self.kills.close()
        self.logs.close()
        return ok


def main(argv: list[str] | None = None) -> int:
    a = parse(argv)
    rnd = random.Random(a.seed)
    pg = a.db.startswith("postgres")
    run_dir = os.path.join(os.path.abspath(a.runs), f"{'pg' if pg else 'sq'}_{a.seed}")
    shutil.rmtree(run_dir, ignore_errors=True)
    os.makedirs(run_dir)
    if pg:
        db = with_schema(a.db, f"soak_{a.seed}_{os.getpid()}")
    else:
        db = os.path.join(run_dir, "sessions.db")
    with open(os.path.join(run_dir, "db.txt"), "w") as f:
        f.write(db)
    print("run directory", run_dir, flush=True)
    d = Driver(run_dir, db, a.ttl, rnd, pg)
    for i in range(a.nworkers):
        d.start(i)
    end = time.monotonic() + a.seconds
    while time.monotonic() < end:
        d.step()
    rc = 0 if d.stop() else 1
    backend = rnd.choice(["threading", "gevent"])
    r = subprocess.run(
        [PY, os.path.join(HERE, "recover.py"), run_dir, db, backend],
        capture_output=True,
        text=True,
        timeout=300,
    )
    print("recover rc", r.returncode, r.stdout.strip()[-2000:], r.stderr.strip()[-3000:])
    rc |= r.returncode != 0
    c = subprocess.run(
        [PY, os.path.join(HERE, "check.py"), run_dir, db],
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(c.stdout[-6000:], c.stderr[-3000:], flush=True)
    rc |= c.returncode != 0
    t = subprocess.run(
        [PY, "-m", "subagents", "tree", db], capture_output=True, text=True, timeout=120
    )
    if t.returncode != 0 or "Traceback" in t.stderr:
        print("CLI tree failed", t.returncode, t.stderr[-2000:], flush=True)
        rc = 1
    print(f"seed {a.seed} kills {d.nkills} rc {rc}", flush=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
