"""A guard that blames a leaked socket or file on the test that leaked it.

pytest turns every warning into an error (``filterwarnings``), and an unclosed
socket's ``ResourceWarning`` comes when the socket is collected -- for one held in
a reference cycle (a test's frame and the ``pytest.raises`` info it holds, an
exception's traceback), at whatever later allocation runs the collector. Three
sockets leaked by some earlier test once failed an innocent model test (the one
whose deep allocation collected them); with ``pytest-xdist`` handing a worker whole
files, the leaker may be in any directory that ran before on that worker.

:func:`_no_leaked_resource` runs the collector after each test at once, and a
``ResourceWarning`` it raises fails that test, with the allocation traceback when
``tracemalloc`` traces (``python -X tracemalloc=20 -m pytest ...``). It costs one
``gc.collect()`` a test (tens of milliseconds: see the conftest that uses it), so
only the directories whose tests open sockets use it, by importing it into their
``conftest.py``::

    from resource_guard import _no_leaked_resource  # noqa: F401  (autouse)
"""

from __future__ import annotations

import gc
import tracemalloc
import warnings
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _no_leaked_resource() -> Iterator[None]:
    """Fail the test (at teardown) if collecting its garbage warns of an unclosed
    socket or file. Autouse, so set up before the test's other fixtures and run
    after they are torn down (servers stopped, runtimes closed)."""
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
