"""A listing meets a child leaving the live set while the store is read.

Under relaxed durability a child's rows reach the store after its turn, on the
writer's time; when it leaves residency its writes are flushed first. A listing
that read the store and then the live set could find such a child in neither:
not yet stored when the store was read, no longer live when the live set was.
The live set is taken first, so the child is in one of them.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import SessionId
from subagents.store import SqliteStore
from subagents.store._native import native_lock

pytestmark = pytest.mark.timeout(60)

WAIT = 20.0


class _Event:
    """An event of one native lock: waited on in the store's threads and set from
    the test's (under gevent's monkey-patching too, where ``threading.Event``
    belongs to one hub's greenlets)."""

    def __init__(self) -> None:
        self._lock = native_lock()
        self._lock.acquire()

    def set(self) -> None:
        with contextlib.suppress(RuntimeError):  # set already
            self._lock.release()

    def clear(self) -> None:
        self._lock.acquire(blocking=False)

    def is_set(self) -> bool:
        return not self._lock.locked()

    def wait(self, timeout: float) -> bool:
        if not self._lock.acquire(timeout=timeout):
            return False
        self._lock.release()
        return True


class _PausingStore(SqliteStore):
    """A real SQLite store whose writes wait at a gate while ``writes`` is clear, and
    whose next children read (``pause_read`` set) announces its result and waits."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.writes = _Event()
        self.writes.set()
        self.pause_read = False
        self.read_done = _Event()
        self.proceed = _Event()

    def write_many(self, ops: Any) -> Any:
        assert self.writes.wait(WAIT), "the test never opened the writes"
        return super().write_many(ops)

    def _held_read(self, result: Any) -> Any:
        if self.pause_read:
            self.pause_read = False
            self.read_done.set()
            assert self.proceed.wait(WAIT), "the test never let the read go on"
        return result

    def scan_children(self, parents: Any) -> Any:
        return self._held_read(super().scan_children(parents))

    def scan_children_with(self, parents: Any, unit: str) -> Any:
        return self._held_read(super().scan_children_with(parents, unit))


def _until(backend: Backend, done: Any) -> bool:
    deadline = time.monotonic() + WAIT
    while not done():
        if time.monotonic() > deadline:
            return False
        backend.sleep(0.005)
    return True


def _listing(rt: Runtime, parent: SessionId, into: list[Any]) -> None:
    into.append(rt.subagents.list_children(parent))


def test_a_child_leaving_residency_during_the_listing_is_listed(
    backend: Backend, tmp_path: Path
) -> None:
    """R-LIST-1, R-LIST-5: the child's create is not committed when the listing reads
    the store; before the listing looks at the live set, the writes go through and
    the child settles (leaves residency). It is listed all the same (it was live when the
    listing began), with its identity read from the store. Ten rounds."""
    store = _PausingStore(str(tmp_path / "sessions.db"))
    with Runtime(store, backend=backend, durability="relaxed") as rt:
        root = rt.spawn("echo")
        expected: list[SessionId] = []
        for i in range(10):
            store.writes.clear()
            store.read_done.clear()
            store.proceed.clear()
            spec = ContinuableStartSpec(
                parent=root, provider="local", prompt=f"hi {i}", label=f"c{i}"
            )
            child = rt.subagents.start_continuable(spec).child_id
            expected.append(child)
            assert store.header(child) is None, i  # not committed yet
            listed: list[Any] = []
            store.pause_read = True
            task = backend.spawn(_listing, rt, root.session_id, listed)
            assert _until(backend, store.read_done.is_set), i
            store.writes.set()
            # A child settles after its turn (flushing its writes, then leaving).
            assert _until(backend, lambda child=child: rt.sessions.live(child) is None), i
            store.proceed.set()
            assert task.join(WAIT), i
            (listing,) = listed
            assert [row.id for row in listing.rows] == expected, i
            assert [row.label for row in listing.rows][-1] == f"c{i}"
            assert listing.diagnostics == ()
