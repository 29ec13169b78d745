"""Runtime fixtures, each parametrised over both backends through ``backend``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.store import MemoryStore


@pytest.fixture
def rt_mem(backend: Backend) -> Iterator[Runtime]:
    """A runtime whose persistence is an in-memory store (cold resume works)."""
    with Runtime(MemoryStore(), backend=backend) as runtime:
        yield runtime
