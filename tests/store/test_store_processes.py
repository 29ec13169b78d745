"""Two OS processes appending to one SQLite file."""

from __future__ import annotations

import datetime as dt
import multiprocessing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from subagents.protocol import MessageEvent, SessionHeader, new_message_id
from subagents.store import SqliteStore

MakeHeader = Callable[..., SessionHeader]

ROUNDS = 100
BATCH = 3


def _worker(path: str, own: str, shared: str, tag: str, start: Any) -> None:
    """Child process: append to its own session and to the shared one."""
    with SqliteStore(path) as store:
        start.wait(30)  # both processes write at the same time
        for i in range(ROUNDS):
            events = [
                MessageEvent(message_id=new_message_id(), content=f"{tag}:{i}:{j}")
                for j in range(BATCH)
            ]
            store.append(own, events)
            store.append(shared, events[:1])


def test_two_processes_append_without_loss(tmp_path: Path, make_header: MakeHeader) -> None:
    path = tmp_path / "shared.db"
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    shared, a, b = (make_header(created_at=t0) for _ in range(3))
    with SqliteStore(path) as store:
        for h in (shared, a, b):
            store.create_session(h)
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Barrier(2)
    procs = [
        ctx.Process(target=_worker, args=(str(path), str(h.id), str(shared.id), tag, start))
        for h, tag in ((a, "a"), (b, "b"))
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0, 0]
    for p in procs:
        p.close()

    with SqliteStore(path) as store:
        for h, tag in ((a, "a"), (b, "b")):
            records = store.read(h.id)
            assert [r.seq for r in records] == list(range(ROUNDS * BATCH))
            assert [r.event.content for r in records] == [  # type: ignore[attr-defined]
                f"{tag}:{i}:{j}" for i in range(ROUNDS) for j in range(BATCH)
            ]
        records = store.read(shared.id)
        assert [r.seq for r in records] == list(range(2 * ROUNDS))
        for tag in "ab":
            mine = [r.event.content for r in records if r.event.content.startswith(tag)]  # type: ignore[attr-defined]
            assert mine == [f"{tag}:{i}:0" for i in range(ROUNDS)]
