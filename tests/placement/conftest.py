"""A real local Ray cluster, one per test session, and a pool of hosts on one store.

Ray starts in about five seconds and each host is a process of its own, so the
cluster and one :class:`RayPlacement` (two hosts, on one SQLite file in a session
temporary directory) serve every test; each test uses its own sessions in that
file, through a runtime of its own. Started before any test's leak guard takes
its count, Ray's own threads are not taken for a test's leak.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def ray_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Any]]:
    """``(db, placement)``: the shared store and a RayPlacement of two hosts on it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ray = pytest.importorskip("ray")
        import hostkit
        from subagents.actors.ray import RayPlacement

        path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            runtime_env={"env_vars": {"PYTHONPATH": path}},
        )
        db = str(tmp_path_factory.mktemp("ray") / "placed.db")
        placement = RayPlacement(db, setup=hostkit.setup, hosts=2, lease_ttl=3.0)
        for pid in ray.get([h.pid.remote() for h in placement.host_actors]):
            assert pid != os.getpid()
    try:
        yield db, placement
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            placement.close()
            ray.shutdown()
