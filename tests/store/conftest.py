"""Fixtures of the store tests: both stores, headers and events."""

from __future__ import annotations

import datetime as dt
import itertools
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from subagents.protocol import (
    MessageEvent,
    MessageSource,
    SessionHeader,
    SessionId,
    new_message_id,
    new_session_id,
)
from subagents.store import MemoryStore, PostgresStore, SessionStore, SqliteStore

T0 = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)

MakeHeader = Callable[..., SessionHeader]
MakeEvents = Callable[..., list[MessageEvent]]


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SessionStore]:
    """Each behavioural test runs against every store: memory, SQLite and
    PostgreSQL (a schema of its own on the test server)."""
    s: SessionStore
    if request.param == "memory":
        s = MemoryStore()
    elif request.param == "sqlite":
        s = SqliteStore(tmp_path / "s.db")
    else:
        s = PostgresStore(request.getfixturevalue("pg_url"))
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[SqliteStore]:
    s = SqliteStore(tmp_path / "s.db")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def make_header() -> MakeHeader:
    """``make_header(parent=None, created_at=T0 + n seconds, depth=0, ...)``."""
    counter = itertools.count()

    def make(
        *,
        id: SessionId | None = None,
        parent: SessionId | None = None,
        created_at: dt.datetime | None = None,
        depth: int = 0,
        label: str | None = None,
    ) -> SessionHeader:
        return SessionHeader(
            id=id or new_session_id(),
            parent_session=parent,
            origin="user" if parent is None else "subagent",
            delegation_depth=depth,
            created_at=created_at or T0 + dt.timedelta(seconds=next(counter)),
            label=label,
        )

    return make


@pytest.fixture
def make_events() -> MakeEvents:
    """``make_events(n, tag="")``: ``n`` message events of about 200 bytes each."""

    def make(n: int, tag: str = "") -> list[MessageEvent]:
        source = MessageSource(kind="parent", session_id=new_session_id())
        return [
            MessageEvent(
                message_id=new_message_id(), content=f"{tag}:{i}:" + "x" * 150, source=source
            )
            for i in range(n)
        ]

    return make


def run_threads(targets: list[Callable[[], Any]], timeout: float = 60.0) -> list[Any]:
    """Run each target in its own thread, join them all, re-raise the first error."""
    results: list[Any] = [None] * len(targets)
    errors: list[BaseException] = []

    def wrap(i: int, target: Callable[[], Any]) -> None:
        try:
            results[i] = target()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=wrap, args=(i, t)) for i, t in enumerate(targets)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    assert not any(t.is_alive() for t in threads), "a worker thread hung"
    if errors:
        raise errors[0]
    return results


@pytest.fixture
def threads() -> Callable[..., list[Any]]:
    return run_threads
