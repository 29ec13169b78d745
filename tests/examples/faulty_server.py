"""``examples/gevent_server.py`` with a bug put in on purpose: ``GET /stats`` raises
a plain ``RuntimeError`` (what no handler expects), for the test of the server's
answer to an unexpected exception. Run as the server is (``server_kit.start_server
(db, script=...)``); every other route is the example's own."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import gevent_server  # after its directory is on the path


def _broken_stats(self: Any, client: str, body: Any) -> Any:
    raise RuntimeError("a bug put in by faulty_server.py")


gevent_server.App.stats = _broken_stats  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(gevent_server.main())
