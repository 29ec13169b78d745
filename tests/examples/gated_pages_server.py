"""``examples/gevent_server.py`` whose ``GET /sessions/{id}`` pages cannot be built
without other requests being answered meanwhile: a page's scan, once under way,
waits until a ``GET /stats`` begun after it has been answered. Built off the hub
(in gevent's thread pool), it goes on as soon as one is; built on the hub -- a
whole-log read used to be -- it holds the hub, no ``/stats`` is answered, and the
page fails (500, after a generous bound) instead of passing on a fast machine.
Run as the server is (``server_kit.start_server(db, script=...)``)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import gevent_server  # after its directory is on the path
import gevent_server_errors

#: Seconds a page waits for a ``/stats`` to be answered (a bound, not a timing).
BOUND = 60.0

_answered = threading.Condition()  # the OS's own (nothing here is monkey-patched)
_count = 0  # the ``GET /stats`` answered so far
_stats = gevent_server.App.stats
_page = gevent_server_errors._page


def _counted_stats(self: Any, client: str, body: Any) -> Any:
    global _count
    answer = _stats(self, client, body)
    with _answered:
        _count += 1
        _answered.notify_all()
    return answer


def _gated_page(scan: Callable[[], Iterator[Any]], limit: int) -> Any:
    with _answered:
        seen = _count  # (a /stats being handled now may count: it overlaps the page)

    def gated() -> Iterator[Any]:
        records = scan()
        try:
            for n, record in enumerate(records):
                if n == 1:  # the scan under way
                    with _answered:
                        if not _answered.wait_for(lambda: _count > seen, BOUND):
                            raise RuntimeError("no GET /stats answered while a page was built")
                yield record
        finally:
            close = getattr(records, "close", None)
            if close is not None:
                close()

    return _page(gated, limit)


gevent_server.App.stats = _counted_stats  # type: ignore[method-assign]
gevent_server_errors._page = _gated_page

if __name__ == "__main__":
    sys.exit(gevent_server.main())
