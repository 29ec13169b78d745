"""Fixtures of the durability tests: ``db``, a store every runtime of a test shares.

``db`` is parametrised over SQLite (a file in the test's directory) and PostgreSQL
(a schema of the test server of its own, see ``pg_url``): the durable-inbox,
dedup, lease, fencing and crash-replay tests run unchanged on both, with their
worker processes on one file or one server.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store location every runtime and worker process of the test opens."""
    if request.param == "sqlite":
        return str(tmp_path / "sessions.db")
    url: str = request.getfixturevalue("pg_url")
    return url
