"""``examples/gevent_server.py`` under ``gevent.monkey.patch_all()``, as gunicorn's
``-k gevent`` worker (or a server of the user's own) runs it: every ``threading``
lock is then gevent's. Run as the server is (``server_kit.start_server(db,
script=...)``); nothing else differs."""

from __future__ import annotations

from gevent import monkey

monkey.patch_all()

import sys  # noqa: E402 -- after patching, as a patched server does
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import gevent_server  # noqa: E402 -- after its directory is on the path

if __name__ == "__main__":
    sys.exit(gevent_server.main())
