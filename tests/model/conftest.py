"""Fixtures of the model tests: a loopback fake OpenAI server, a runtime per backend,
and a guard that blames a leaked socket on the test that leaked it.

The guard: pytest turns every warning into an error (``filterwarnings``), and an
unclosed socket's ``ResourceWarning`` comes when the socket is collected -- for one
held in a reference cycle, at whatever later allocation runs the collector. Three
sockets leaked by some earlier test once failed an innocent test (the one whose deep
allocation collected them). So after each test here the collector runs at once and
a ``ResourceWarning`` it raises fails that test, with the allocation traceback when
``tracemalloc`` traces (``python -X tracemalloc=20 -m pytest ...``). It costs one
``gc.collect()`` a test -- 45 to 70 ms (measured on this directory's 423 tests:
27 s of CPU, 12 to 16 s more wall time on two workers) -- which is why it is here
and not in the root conftest.
"""

from __future__ import annotations

import gc
import tracemalloc
import warnings
from collections.abc import Iterator

import pytest
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import FakeOpenAI
from subagents.store import MemoryStore


@pytest.fixture(autouse=True)
def _no_leaked_resource() -> Iterator[None]:
    """Fail the test (at teardown) if collecting its garbage warns of an unclosed
    socket or file. Autouse, so set up before the test's other fixtures and run
    after they are torn down (the fake server stopped, the runtime closed)."""
    yield
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    leaked = [w for w in caught if issubclass(w.category, ResourceWarning)]
    for other in caught:  # any other warning meets the configured filters, as before
        if not issubclass(other.category, ResourceWarning):
            warnings.warn_explicit(
                other.message, other.category, other.filename, other.lineno, source=other.source
            )
    if leaked:
        pytest.fail(
            "the test leaked what it did not close:\n" + "\n".join(map(_describe, leaked)),
            pytrace=False,
        )


def _describe(caught: warnings.WarningMessage) -> str:
    where = tracemalloc.get_object_traceback(caught.source) if caught.source is not None else None
    if where is None:
        return f"  {caught.message} (run under -X tracemalloc=20 for where it was made)"
    return f"  {caught.message}, made at:\n" + "\n".join(where.format(most_recent_first=True))


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    """A fake ``/v1/chat/completions`` on 127.0.0.1, stopped (threads joined) afterwards."""
    with FakeOpenAI(api_key="test-key") as server:
        yield server


@pytest.fixture
def rt(backend: Backend) -> Iterator[Runtime]:
    """A runtime on an in-memory store (cold resume works), on the backend under test."""
    with Runtime(MemoryStore(), backend=backend) as runtime:
        yield runtime
