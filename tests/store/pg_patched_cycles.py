"""Runtimes on one PostgreSQL server opened, worked and closed in turn, in a process
under ``gevent.monkey.patch_all()`` (as gunicorn's ``-k gevent`` worker runs), or
with ``--threads`` unpatched. Run by ``test_pg_patched.py``: a patched interpreter
cannot be pytest's own.

usage: ``pg_patched_cycles.py URL PREFIX CYCLES [--threads]`` (``URL`` without a
schema: cycle ``i`` takes schema ``PREFIX_i``).

``pg_patched_cycles.py URL PREFIX restart CLUSTER_DIR``: a store opened in gevent's
threadpool (as a runtime opens it) reads, the cluster (``tests/pgcluster.py``) is
restarted, and reads at once from several threadpool threads: prints how long they
took and what they raised, then how long the close took. Prints one JSON line: per cycle, how long
``close()`` took, the store's pool threads (or greenlets) still alive after it,
the native threads still running the store's code, and whether the messages
accepted before the close are in the store after it.
"""

from __future__ import annotations

import sys

if "--threads" not in sys.argv:
    from gevent import monkey

    monkey.patch_all()

# After patching, as a patched server imports.
import json
import os
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from subagents.actors import ContinuableStartSpec, Runtime
from subagents.store import PostgresStore, _native


def _store_threads() -> list[str]:
    """Native threads (not greenlets) running a pool's code, or hosting its hub
    (``store/_native.py``): what outlived its store."""
    found = []
    for ident, frame in sys._current_frames().items():
        if ident == threading.main_thread().ident:
            continue
        stack = traceback.extract_stack(frame)
        if any("psycopg_pool" in f.filename or f.filename == _native.__file__ for f in stack):
            found.append(f"{stack[-1].filename}:{stack[-1].lineno}")
    return found


def _texts(store: PostgresStore, session_id: Any) -> str:
    """The session's log and what waits in its inbox: an accepted message is kept
    in one or the other (a close keeps what its turns did not run yet)."""
    logged = [repr(record.event) for record in store.read(session_id)]
    waiting = [repr(entry.event) for entry in store.pending(session_id)]
    return " ".join(logged + waiting)


def cycle(url: str, schema: str) -> dict[str, Any]:
    rt = Runtime(
        f"{url}?schema={schema}", backend="threading" if "--threads" in sys.argv else "gevent"
    )
    rt.models.register("w", lambda options: lambda text: "ok", replace=True)
    agent = rt.spawn("echo")
    spec = ContinuableStartSpec(
        parent=agent.session_id, provider="local", prompt="p", label="c", model="w"
    )
    child, _ = rt.subagents.start_continuable(spec)
    rt.subagents.followup(agent.session_id, child, "marker-to-child")
    agent.followup("marker-to-agent")
    idle = agent.wait_idle(10)
    started = time.monotonic()
    rt.close()
    seconds = time.monotonic() - started
    left = [t.name for t in threading.enumerate() if schema in t.name]
    store = PostgresStore(f"{url}?schema={schema}", create=False)
    try:
        kept = "marker-to-agent" in _texts(store, agent.session_id) and (
            "marker-to-child" in _texts(store, child)
        )
    finally:
        store.close()
    return {
        "close_s": round(seconds, 3),
        "idle": idle,
        "pool_left": left,
        "kept": kept,
        "store_threads": _store_threads(),
    }


def after_restart(url: str, schema: str, cluster_dir: str) -> dict[str, Any]:
    import gevent
    from subagents.actors import get_backend

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import pgcluster

    base = Path(cluster_dir)
    bindir = pgcluster.bindir()
    assert bindir is not None
    cluster = pgcluster.Cluster(base, int((base / "port").read_text()), bindir)
    gevent_backend = get_backend("gevent")
    store = gevent_backend.run_blocking(
        PostgresStore, f"{url}?schema={schema}", connect_timeout_s=5
    )
    gevent_backend.run_blocking(store.list_headers, None)
    cluster.restart()
    errors: list[str] = []

    def read() -> None:
        try:
            gevent_backend.run_blocking(store.list_headers, None)
        except Exception as exc:
            errors.append(repr(exc))

    started = time.monotonic()
    gevent.joinall([gevent.spawn(read) for _ in range(8)])
    reads = time.monotonic() - started
    started = time.monotonic()
    gevent_backend.run_blocking(store.close)
    return {
        "reads_s": round(reads, 3),
        "errors": errors,
        "close_s": round(time.monotonic() - started, 3),
        "pool_left": [t.name for t in threading.enumerate() if schema in t.name],
    }


def main() -> None:
    url, prefix = sys.argv[1], sys.argv[2]
    if sys.argv[3] == "restart":
        print(json.dumps(after_restart(url, f"{prefix}_r", sys.argv[4])), flush=True)
        return
    cycles = int(sys.argv[3])
    results = []
    for i in range(cycles):
        results.append(cycle(url, f"{prefix}_{i}"))
        time.sleep(0.3)  # gevent's threadpool lets idle workers go meanwhile
    print(json.dumps(results), flush=True)


if __name__ == "__main__":
    # os._exit: a leaked pool greenlet or thread must not hold the exit.
    try:
        main()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)
