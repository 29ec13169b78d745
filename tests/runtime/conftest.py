"""Runtime fixtures, each parametrised over both backends through ``backend``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from subagents.actors import Runtime
from subagents.actors._backend import Backend
from subagents.store import MemoryStore


@pytest.fixture
def rt(backend: Backend) -> Iterator[Runtime]:
    """A runtime without persistence (sessions live only)."""
    with Runtime(backend=backend) as runtime:
        yield runtime


@pytest.fixture
def rt_mem(backend: Backend) -> Iterator[Runtime]:
    """A runtime whose persistence is an in-memory store (cold resume works)."""
    with Runtime(MemoryStore(), backend=backend) as runtime:
        yield runtime


@pytest.fixture
def rt_sqlite(backend: Backend, tmp_path: Path) -> Iterator[Runtime]:
    """A runtime on the embedded SQLite store."""
    with Runtime(str(tmp_path / "sessions.db"), backend=backend) as runtime:
        yield runtime
