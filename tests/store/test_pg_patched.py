"""PostgreSQL stores in a process under ``gevent.monkey.patch_all()`` (gunicorn's
``-k gevent`` worker): ``pg_patched_cycles.py`` opens, works and closes runtimes
in turn there (a patched interpreter cannot be pytest's own), on the test server.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CYCLES = Path(__file__).with_name("pg_patched_cycles.py")


@pytest.fixture
def schemas(pg_server: str) -> Iterator[tuple[str, str]]:
    """``(server url, schema prefix)``; the schemas named by the prefix are dropped after."""
    prefix = f"t_{uuid.uuid4().hex[:12]}"
    yield pg_server, prefix
    _drop(pg_server, prefix)


def _drop(url: str, prefix: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        names = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (prefix,)
        ).fetchall()
        for (name,) in names:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _run(url: str, prefix: str, *args: str) -> Any:
    done = subprocess.run(
        [sys.executable, str(CYCLES), url, prefix, *args],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("mode", ["patched", "threads"])
def test_close_returns_promptly_and_leaves_no_pool_behind(
    schemas: tuple[str, str], mode: str
) -> None:
    """Six runtimes in turn, each starting a child and following both up, then
    closed. Patched, the pool's worker and scheduler were greenlets of the hub of
    whichever threadpool thread opened the store -- a hub that stopped running once
    that thread went idle, and was destroyed when gevent let the thread go. A close
    made from any other thread asked them to stop, waited 5 s for each ("couldn't
    stop thread 'subagents-<schema>-worker-0'"), and left both behind: most runs had
    one to five of six closes take 10 s. Now every close returns at once, leaves no
    pool thread or greenlet (nor a thread running the store's code) behind, and what
    was accepted before it is in the store after (in the log, or in the inbox when
    the close came before its turn)."""
    url, prefix = schemas
    results = _run(url, prefix, "6", *(["--threads"] if mode == "threads" else []))
    for i, r in enumerate(results):
        assert r["idle"], (i, results)
        assert r["close_s"] < 1.0, (i, results)
        assert r["pool_left"] == [], (i, results)
        assert r["store_threads"] == [], (i, results)
        assert r["kept"], (i, results)


def test_reads_go_on_after_a_server_restart(own_pg_server: Any) -> None:
    """A store opened in gevent's threadpool, as a runtime opens it; the server
    restarts; eight reads at once from threadpool threads. A read finding its
    pooled connection dead hands the pool a connection to make and waits for it:
    made by the pool's worker, a greenlet that a task handed over from another
    thread's hub woke only when something else woke its own (a read waited its
    whole ``connect_timeout_s`` and failed ``TIMEOUT``). Every read succeeds,
    promptly, and the close is prompt and leaves no pool behind."""
    prefix = f"t_{uuid.uuid4().hex[:12]}"
    try:
        r = _run(own_pg_server.url, prefix, "restart", str(own_pg_server.base))
    finally:
        _drop(own_pg_server.url, prefix)
    assert r["errors"] == [] and r["reads_s"] < 4.0, r
    assert r["close_s"] < 1.0 and r["pool_left"] == [], r
