"""``examples/gevent_server.py`` serving one connection at a time (its pool holds one,
not ``MAX_CONNECTIONS``): the next ones wait in the listen backlog, for the test of
what a SIGTERM does to them. Run as the server is (``server_kit.start_server(db,
script=...)``); nothing else differs."""

from __future__ import annotations

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import gevent_server  # after its directory is on the path
import gevent_server_http

gevent_server.NoDelayServer = functools.partial(  # type: ignore[attr-defined,assignment]
    gevent_server_http.NoDelayServer, max_connections=1
)

if __name__ == "__main__":
    sys.exit(gevent_server.main())
