"""A PostgreSQL server that hangs -- alive to TCP, answering nothing (a storage
stall, a frozen host) -- fails the calls that wait on it after the store's
``statement_timeout_s`` instead of blocking them for ever, ``Runtime.close()``
included; once the server answers again the store works (R-ERR-1, issue 14).

The hang is real: every process of a private cluster is stopped (``SIGSTOP``), so
the kernel still accepts and acknowledges what is sent and nothing replies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, MessageEvent, SubagentError, new_message_id
from subagents.store import PostgresStore

#: Far above the 1 s deadline the tests set, far below "for ever".
BOUND = 20.0


def _cluster_pids(cluster: Any) -> list[int]:
    """The postmaster of ``cluster`` and every process it started."""
    postmaster = int((Path(cluster.base) / "data" / "postmaster.pid").read_text().split()[0])
    pids = [postmaster]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                stat = (Path("/proc") / entry / "stat").read_text()
                if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                    pids.append(int(entry))
    return pids


@contextlib.contextmanager
def _hung(cluster: Any) -> Iterator[None]:
    pids = _cluster_pids(cluster)
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _fails_in_time(call: Any) -> str:
    start = time.monotonic()
    with pytest.raises(SubagentError) as caught:
        call()
    assert time.monotonic() - start < BOUND
    return str(caught.value.code)


def _message(text: str) -> MessageEvent:
    return MessageEvent(message_id=new_message_id(), content=text)


def test_a_hung_server_fails_store_calls_in_time(own_pg_server: Any, make_header: Any) -> None:
    """Writes and reads on a hung server fail ``PERSISTENCE_UNAVAILABLE`` after the
    deadline, and ``close()`` returns; nothing accepted before is lost, and a
    store opened once the server answers again reads it and writes."""
    url = f"{own_pg_server.url}?schema=s_{uuid.uuid4().hex[:12]}"
    header = make_header()
    store = PostgresStore(url, statement_timeout_s=1.0, connect_timeout_s=2.0)
    try:
        store.create_session(header)
        store.accept(header.id, [_message("before")], now=1.0)
        with _hung(own_pg_server):
            code = _fails_in_time(lambda: store.accept(header.id, [_message("during")], now=2.0))
            assert code == ErrorCode.PERSISTENCE_UNAVAILABLE
            code = _fails_in_time(lambda: store.pending(header.id))
            assert code == ErrorCode.PERSISTENCE_UNAVAILABLE
            start = time.monotonic()
            store.close()
            assert time.monotonic() - start < BOUND
    finally:
        store.close()
    with PostgresStore(url) as again:
        contents = [e.event.content for e in again.pending(header.id)]
        assert contents[0] == "before" and contents in (["before"], ["before", "during"])
        again.accept(header.id, [_message("after")], now=3.0)
        assert [e.event.content for e in again.pending(header.id)][-1] == "after"


def test_a_hung_server_stops_no_runtime_for_ever(backend: Backend, own_pg_server: Any) -> None:
    """A runtime on a hung server: a strict follow-up fails in time (nothing
    accepted), ``Runtime.close()`` returns; reopened once the server answers, the
    session holds every follow-up that was accepted, each run once."""
    url = f"{own_pg_server.url}?schema=s_{uuid.uuid4().hex[:12]}"
    store = PostgresStore(url, statement_timeout_s=1.0, connect_timeout_s=2.0)
    rt = Runtime(store, backend=backend, lease_ttl=3.0)
    try:
        agent = rt.spawn("echo")
        agent.followup("before")
        assert agent.wait_idle(30)
        rt.sessions.flush()
        with _hung(own_pg_server):
            assert _fails_in_time(lambda: agent.followup("during")) in (
                ErrorCode.PERSISTENCE_UNAVAILABLE,
                ErrorCode.AGENT_DISPOSED,  # a renewal failed first and stopped it
            )
            start = time.monotonic()
            rt.close()
            assert time.monotonic() - start < BOUND
    finally:
        rt.close()
        store.close()
    with Runtime(url, backend=backend) as again:
        resumed = again.agents.resume(agent.session_id)
        resumed.followup("after")
        assert resumed.wait_idle(30)
        outputs = [e.output for e in again.sessions.turn_ends(agent.session_id)]
        assert outputs == ["before", "after"]


def test_a_deadline_cuts_only_the_wait_it_guards(pg_url: str) -> None:
    """The watchdog shuts a connection down only while that wait is in flight:
    across threads, with deadlines as short as the statements, every statement
    either answers -- and its connection then serves a statement with no
    deadline, or is closed (cut after the answer came in) -- or fails
    ``DeadlinePassed`` with its connection broken. A statement longer than its
    deadline always fails."""
    import random
    import threading

    from subagents.store._pg_deadline import DeadlineConnection, DeadlinePassed

    conninfo = pg_url.split("?", 1)[0]
    failures: list[str] = []
    cut = [0, 0]  # answered, cut

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        conn = DeadlineConnection.connect(conninfo, autocommit=True)
        try:
            for _ in range(150):
                conn.deadline_s = rng.choice((0.0005, 0.001, 0.002, 0.01, 5.0))
                try:
                    conn.execute("SELECT 1").fetchall()
                except DeadlinePassed:
                    cut[1] += 1
                    if not conn.broken:
                        failures.append("a cut connection still reads as sound")
                    conn.close()
                    conn = DeadlineConnection.connect(conninfo, autocommit=True)
                    continue
                cut[0] += 1
                if conn.closed:  # cut as the answer came in: never reused
                    conn = DeadlineConnection.connect(conninfo, autocommit=True)
                    continue
                conn.deadline_s = None
                try:
                    conn.execute("SELECT 2").fetchall()
                except Exception as exc:  # cut after its wait was over
                    failures.append(repr(exc))
                    conn.close()
                    conn = DeadlineConnection.connect(conninfo, autocommit=True)
            conn.deadline_s = 0.05
            with pytest.raises(DeadlinePassed):
                conn.execute("SELECT pg_sleep(2)")
        finally:
            conn.close()

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert cut[0] > 0


def test_a_writer_stopped_inside_a_transaction_holds_its_locks_no_longer(
    pg_url: str, make_header: Any, make_events: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process stopped (or starved) in the middle of a write transaction kept its
    session row locks for as long as its connection lived: every other process's
    writes to those sessions waited ``lock_timeout_s`` and failed ``TIMEOUT`` (and
    a group commit waiting so held up everything else it wrote, lease renewals
    too). The server now ends a connection idle in a transaction (10 s; 1 s
    here), and the other process's write goes through."""
    from subagents.store import _pg_txn, _postgres

    monkeypatch.setattr(_postgres, "_IDLE_IN_TRANSACTION_MS", 1000)
    header = make_header()
    with PostgresStore(pg_url, lock_timeout_s=20.0) as first, PostgresStore(pg_url) as other:
        first.create_session(header)
        stalled = first.connect()  # a connection as the store's writer has it
        try:
            stalled.execute("BEGIN")
            stalled.execute(_pg_txn._LOCK_SESSION.replace("?", "%s"), (header.id.to_bytes(),))
            start = time.monotonic()
            other.accept(header.id, make_events(1), now=1.0)  # waited 20 s, then TIMEOUT
            assert time.monotonic() - start < 15
            assert len(other.pending(header.id)) == 1
            with pytest.raises(Exception):  # noqa: B017 - the server ended it
                stalled.execute("SELECT 1")
        finally:
            stalled.close()
