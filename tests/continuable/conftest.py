"""Fixtures of the continuable-children suite, each parametrised over both backends.

* ``rt``: no persistence (continuable starts must refuse it);
* ``rt_mem``: a :class:`~continuable_kit.CountingStore` (an in-memory store that
  counts what it reads and lets a test hook its writes): cold resume works;
* ``rt_sqlite``: the embedded SQLite store;
* ``rtp``: both persistent stores in turn (``mem``/``sqlite``), for the rules a
  real durable store could break (cold resume above all);
* ``kit``/``kitp``: a :class:`~continuable_kit.Kit` over ``rt_mem``/``rtp``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from continuable_kit import CountingStore, Kit
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend


@pytest.fixture
def rt_mem(backend: Backend) -> Iterator[Runtime]:
    """A runtime on a counting in-memory store (cold resume works)."""
    with Runtime(CountingStore(), backend=backend) as runtime:
        yield runtime


@pytest.fixture(params=["mem", "sqlite"])
def rtp(request: pytest.FixtureRequest, backend: Backend, tmp_path: Path) -> Iterator[Runtime]:
    """A runtime with persistence: the counting memory store, then SQLite."""
    store = CountingStore() if request.param == "mem" else str(tmp_path / "sessions.db")
    with Runtime(store, backend=backend) as runtime:
        yield runtime


@pytest.fixture
def kit(rt_mem: Runtime) -> Iterator[Kit]:
    """The scripted tree kit over ``rt_mem``."""
    k = Kit(rt_mem)
    yield k
    k.close()


@pytest.fixture
def kitp(rtp: Runtime) -> Iterator[Kit]:
    """The scripted tree kit over both persistent stores."""
    k = Kit(rtp)
    yield k
    k.close()
