"""Fixtures of the durable-catalog suite, each parametrised over both backends.

* ``rt``: no persistence (live-only listing);
* ``rtp``: persistence on a hooked store, the in-memory one then SQLite
  (``mem``/``sqlite``), with a :class:`~catalog_kit.StepClock` of one second a
  call, so every ``created_at`` and turn duration is exact;
* ``probe``: a lifecycle probe on ``rtp``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from catalog_kit import HookedMemoryStore, HookedSqliteStore, StepClock
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import LifecycleProbe


@pytest.fixture
def rt(backend: Backend) -> Iterator[Runtime]:
    """A runtime without persistence (sessions live only)."""
    with Runtime(backend=backend, clock=StepClock()) as runtime:
        yield runtime


@pytest.fixture(params=["mem", "sqlite"])
def rtp(request: pytest.FixtureRequest, backend: Backend, tmp_path: Path) -> Iterator[Runtime]:
    """A runtime on a hooked persistent store: in memory, then SQLite."""
    store: HookedMemoryStore | HookedSqliteStore
    if request.param == "mem":
        store = HookedMemoryStore()
    else:
        store = HookedSqliteStore(str(tmp_path / "sessions.db"))
    with Runtime(store, backend=backend, clock=StepClock()) as runtime:
        yield runtime


@pytest.fixture
def probe(rtp: Runtime) -> Iterator[LifecycleProbe]:
    p = LifecycleProbe(rtp)
    yield p
    p.close()
