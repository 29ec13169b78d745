"""Helpers of the durable-catalog suite: hooked stores, clocks, hand-written sessions.

* :class:`HookedMemoryStore` / :class:`HookedSqliteStore` -- the two real stores,
  counting every persistence read by method and session, tracking how many
  ``read`` calls run at once, and calling ``hooks[method](*args)`` before a read
  (a test blocks at a :class:`~subagents.actors.testing.Gate`, aborts a signal
  or raises there).
* :class:`StepClock` -- an injectable clock: each call returns ``start + n *
  step`` (``step=0`` gives equal times), so durations and orders are exact.
* :func:`write_child` -- write a session straight into a store, with an optional
  fork seed and its own events, the way a runtime would have persisted it.
* :class:`InTask` -- run a call in a backend task (a thread or a greenlet) and
  collect its result later, while the test drives gates.
* :func:`garble` / :func:`reparent` -- damage a stored row by hand, through raw
  SQL on an SQLite file (a path) or any other connection (an :data:`Execute`).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pgcluster import outside_sql
from subagents.actors import Backend, Runtime
from subagents.protocol import (
    ContinuableDescriptor,
    CorruptRecordError,
    Event,
    MessageEvent,
    OneShotDescriptor,
    SessionHeader,
    SessionId,
    SubagentDescriptorEvent,
    TurnEnd,
    TurnStart,
    descriptor_event,
    encode_header,
    new_message_id,
    new_session_id,
    packb,
)
from subagents.store import LogRecord, MemoryStore, SessionStore, SqliteStore

__all__ = [
    "GARBAGE",
    "T0",
    "Execute",
    "HookedMemoryStore",
    "HookedSqliteStore",
    "InTask",
    "StepClock",
    "continuable",
    "future_descriptor",
    "garble",
    "identity_blob",
    "one_shot",
    "reparent",
    "sid",
    "turn",
    "write_child",
]

T0 = _dt.datetime(2030, 1, 1, tzinfo=_dt.UTC)


class StepClock:
    """``start + n * step`` on the n-th call; thread-safe."""

    def __init__(self, step: float = 1.0, start: _dt.datetime = T0) -> None:
        self._step = _dt.timedelta(seconds=step)
        self._start = start
        self._count = itertools.count()
        self._lock = threading.Lock()

    def __call__(self) -> _dt.datetime:
        with self._lock:
            n = next(self._count)
        return self._start + n * self._step


def at(seconds: float) -> _dt.datetime:
    return T0 + _dt.timedelta(seconds=seconds)


# -- events and sessions -------------------------------------------------------------


def one_shot(label: str | None = None, provider: str = "local") -> SubagentDescriptorEvent:
    return descriptor_event(OneShotDescriptor(provider=provider, label=label))


def continuable(label: str, provider: str = "local") -> SubagentDescriptorEvent:
    return descriptor_event(
        ContinuableDescriptor(provider=provider, label=label, agent_provider="local", model="echo")
    )


def future_descriptor(label: str = "from the future") -> SubagentDescriptorEvent:
    return SubagentDescriptorEvent(
        payload={"v": 2, "mode": "continuable", "provider": "local", "label": label}
    )


def turn(index: int, start: float, end: float | None) -> list[Event]:
    """A turn's events at ``T0 + start`` .. ``T0 + end`` (left open when ``end`` is None)."""
    mid = new_message_id()
    events: list[Event] = [
        TurnStart(turn=index, at=at(start), message_ids=(mid,)),
        MessageEvent(message_id=mid, content=f"turn {index}"),
    ]
    if end is not None:
        events.append(TurnEnd(turn=index, at=at(end), stop_reason="completed", output="ok"))
    return events


def sid(n: int) -> SessionId:
    """A session id whose hex order follows ``n``."""
    return SessionId(f"{n:032x}")


def identity_blob(mode: str, label: str | None) -> bytes:
    return packb({"mode": mode, "label": label})


def write_child(
    store: SessionStore,
    parent: SessionId | None,
    own: Sequence[Event],
    *,
    seed: Sequence[Event] = (),
    created_at: _dt.datetime = T0,
    origin: str = "subagent",
    session_id: SessionId | None = None,
    label: str | None = None,
) -> SessionHeader:
    """Persist a session whose log is ``seed`` then ``own`` (``seed_len`` set)."""
    header = SessionHeader(
        id=session_id or new_session_id(),
        parent_session=parent,
        origin=origin,
        delegation_depth=0 if parent is None else 1,
        created_at=created_at,
        label=label,
        seed_len=len(seed),
    )
    store.create_session(header, [*seed, *own])
    return header


# -- damage by hand ------------------------------------------------------------------

GARBAGE = b"\xc1\xc1"  # 0xc1 is never used by msgpack

#: Runs one SQL statement (``?`` placeholders) on a store's tables; its row count.
Execute = Callable[[str, tuple[Any, ...]], int]


def sqlite_execute(path: Path | str) -> Execute:
    """An :data:`Execute` on an SQLite file: one connection and commit per statement."""

    return lambda sql, params: outside_sql(str(path), sql, *params)


def _execute(db: Path | str | Execute) -> Execute:
    return sqlite_execute(db) if isinstance(db, (Path, str)) else db


def garble(db: Path | str | Execute, session: SessionId, seq: int) -> None:
    """Overwrite one stored event with bytes that do not decode."""
    count = _execute(db)(
        "UPDATE events SET body = ? WHERE session = ? AND seq = ?",
        (GARBAGE, session.to_bytes(), seq),
    )
    assert count == 1


def reparent(db: Path | str | Execute, header: SessionHeader, parent: SessionId) -> None:
    """Point a stored header at another parent, column and authoritative blob alike."""
    blob = encode_header(dataclasses.replace(header, parent_session=parent))
    count = _execute(db)(
        "UPDATE sessions SET parent = ?, header = ? WHERE id = ?",
        (parent.to_bytes(), blob, header.id.to_bytes()),
    )
    assert count == 1


# -- hooked stores -------------------------------------------------------------------


class _Hooks:
    """Counting and hooks shared by both hooked stores (a mixin over a real store)."""

    def _init_hooks(self) -> None:
        self.hook_lock = threading.Lock()
        self.calls: Counter[str] = Counter()
        self.reads_of: Counter[SessionId] = Counter()
        self.read_log: list[tuple[str, Any]] = []
        #: ``hooks[method](*args)`` runs before ``method``; ``create_session`` too.
        self.hooks: dict[str, Callable[..., None]] = {}
        self.inside_read = 0
        self.max_inside_read = 0

    def reset_counts(self) -> None:
        with self.hook_lock:
            self.calls.clear()
            self.reads_of.clear()
            self.read_log.clear()
            self.max_inside_read = 0

    def _enter(self, method: str, *args: Any) -> None:
        with self.hook_lock:
            self.calls[method] += 1
            self.read_log.append((method, args[0] if args else None))
            if method in ("read", "scan"):
                self.reads_of[SessionId(args[0])] += 1
        hook = self.hooks.get(method)
        if hook is not None:
            hook(*args)


class _HookedReads(_Hooks):
    """The counted, hookable store methods; mixed in before a concrete store."""

    def all_headers(self) -> list[SessionHeader]:
        self._enter("all_headers")
        return super().all_headers()  # type: ignore[misc, no-any-return]

    def scan_headers(self) -> list[SessionHeader | CorruptRecordError]:
        self._enter("scan_headers")
        return super().scan_headers()  # type: ignore[misc, no-any-return]

    def scan_children(
        self, parents: Sequence[SessionId | str]
    ) -> list[SessionHeader | CorruptRecordError]:
        self._enter("scan_children", parents)
        return super().scan_children(parents)  # type: ignore[misc, no-any-return]

    def list_headers(self, parent_session: SessionId | str | None) -> list[SessionHeader]:
        self._enter("list_headers", parent_session)
        return super().list_headers(parent_session)  # type: ignore[misc, no-any-return]

    def read(self, session_id: SessionId | str, from_seq: int = 0) -> list[LogRecord]:
        with self.hook_lock:
            self.inside_read += 1
            self.max_inside_read = max(self.max_inside_read, self.inside_read)
        try:
            self._enter("read", session_id, from_seq)
            return super().read(session_id, from_seq)  # type: ignore[misc, no-any-return]
        finally:
            with self.hook_lock:
                self.inside_read -= 1

    def header(self, session_id: SessionId | str) -> SessionHeader | None:
        self._enter("header", session_id)
        return super().header(session_id)  # type: ignore[misc, no-any-return]

    def get_projection(self, session_id: SessionId | str, unit: str) -> tuple[int, bytes] | None:
        self._enter("get_projection", session_id, unit)
        return super().get_projection(session_id, unit)  # type: ignore[misc, no-any-return]

    def get_projections(self, unit: str) -> dict[SessionId, tuple[int, bytes]]:
        self._enter("get_projections", unit)
        return super().get_projections(unit)  # type: ignore[misc, no-any-return]

    def get_projections_of(
        self, unit: str, sessions: Iterable[SessionId | str]
    ) -> dict[SessionId, tuple[int, bytes]]:
        self._enter("get_projections_of", unit)
        return super().get_projections_of(unit, sessions)  # type: ignore[misc, no-any-return]

    def create_session(self, header: SessionHeader, events: Sequence[Event] = (), **kw: Any) -> int:
        hook = self.hooks.get("create_session")
        if hook is not None:
            hook(header, events)
        return super().create_session(header, events, **kw)  # type: ignore[misc, no-any-return]


class HookedMemoryStore(_HookedReads, MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self._init_hooks()

    def scan_headers(self) -> list[SessionHeader | CorruptRecordError]:
        # The base class's scan_headers calls the (hooked) all_headers: count one read.
        self._enter("scan_headers")
        return list(MemoryStore.all_headers(self))


class HookedSqliteStore(_HookedReads, SqliteStore):
    def __init__(self, path: str) -> None:
        super().__init__(path)
        self._init_hooks()

    def scan_children_with(
        self, parents: Sequence[SessionId | str], unit: str
    ) -> tuple[
        list[SessionHeader | CorruptRecordError], dict[SessionId, tuple[int, bytes]], set[SessionId]
    ]:
        # The parent-index read with the identity rows joined in: one read, counted
        # as the parent-index read it is (``hooks["scan_children_with"]`` runs first:
        # a test breaks the joined read alone so).
        hook = self.hooks.get("scan_children_with")
        if hook is not None:
            hook(parents, unit)
        self._enter("scan_children", parents)
        return SqliteStore.scan_children_with(self, parents, unit)

    def sole_root(self) -> SessionId | None:
        self._enter("sole_root")
        return SqliteStore.sole_root(self)

    def write_many(self, ops: Sequence[tuple[Any, ...]]) -> list[Any]:
        # One op at a time through the (hooked) single-op methods.
        return SessionStore.write_many(self, ops)


HookedStore = HookedMemoryStore | HookedSqliteStore


def hooked(rt: Runtime) -> HookedStore:
    store = rt.store
    assert isinstance(store, (HookedMemoryStore, HookedSqliteStore))
    return store


# -- running a call in a backend task -------------------------------------------------


class InTask:
    """``fn()`` in a task of ``backend``; ``result()`` joins and returns or raises."""

    def __init__(self, backend: Backend, fn: Callable[[], Any]) -> None:
        self._box: dict[str, Any] = {}

        def target() -> None:
            try:
                self._box["value"] = fn()
            except BaseException as exc:
                self._box["error"] = exc

        self._task = backend.spawn(target, name="catalog-test-task")

    def result(self, timeout: float = 20.0) -> Any:
        assert self._task.join(timeout), "the task did not finish"
        if "error" in self._box:
            raise self._box["error"]
        return self._box.get("value")
