"""The gevent server example under load from a second process (issue 17 point 4).

``load_server.py`` at a smaller scale: 1,200 sessions (7,200 requests) from four
keep-alive clients against a server keeping at most 100 agents live. The full
measurement (30,000 requests, the window after 3,000 sessions) is the script:
``python tests/examples/load_server.py``.

The bounds are loose on purpose -- the machine is shared -- and compare figures of
the same run: they catch a keep-alive client held back by Nagle's algorithm (a
ratio near 0.02), or a cost per request growing with the sessions served, not a
few percent.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from load_server import keepalive_vs_new, run_sessions
from server_kit import start_server, stop_server


@pytest.mark.slow
def test_keepalive_memory_and_throughput_under_load(tmp_path: Path) -> None:
    srv = start_server(tmp_path / "load.db", "--max-live", "100")
    try:
        keepalive, fresh = keepalive_vs_new(srv, 300)
        load = run_sessions(srv, 1200, 4, 200)
        status, stats = srv.call("GET", "/stats")
    finally:
        stop_server(srv)
    assert not load.errors, load.errors[:5]
    assert status == 200 and stats["live_agents"] <= 100, stats
    assert stats["disposed_idle"] >= 1100, stats
    start, late = load.cpu_rate(100, 200), load.cpu_rate(1000, 200)
    (_, first), (_, last) = load.rss[1], load.rss[-1]
    print(
        f"\nkeep-alive {keepalive:.0f} requests/s, new connection each {fresh:.0f};"
        f" sessions per server CPU-second {start:.1f} at start, {late:.1f} after 1,000;"
        f" RSS {first / 2**20:.1f} -> {last / 2**20:.1f} MiB"
    )
    assert keepalive >= 0.5 * fresh, (keepalive, fresh)
    assert late >= 0.5 * start, (start, late)
