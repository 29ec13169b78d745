"""Turns starting together after a stall ask the store once whether their leases
are still held (R-DUR-3: a turn starts only under a lease known held; issue 20
point 3: 100,000 idle children resident at once).

Past two thirds of the lease ttl without a renewal (the process was stopped, or
starved -- building 100,000 children starves the renewal task), each turn's
``Leases.confirm`` asked the store on its own, every one of them renewing and
reading back the whole list of leases, with a copy of every lease held: the
``idle100k`` bench's build grew past 24 GB and was killed. Now one asks; the
turns starting meanwhile wait for its answer. Here twenty agents' turns all reach
``confirm`` while the first question is held at the store, then it answers.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from subagents.actors import Runtime
from subagents.actors._agents import Leases
from subagents.actors._kernel._backend import Backend

pytestmark = pytest.mark.timeout(60)

AGENTS = 20


def test_turns_starting_after_a_stall_ask_the_store_once(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    arrived: list[object] = []
    everyone = threading.Event()
    real_confirm = Leases.confirm

    def counted_confirm(self: Any, session_id: Any) -> bool:
        arrived.append(session_id)
        if len(arrived) == AGENTS:
            everyone.set()
        return bool(real_confirm(self, session_id))

    with Runtime(tmp_path / "s.db", backend=backend, lease_ttl=600.0) as rt:
        agents = [rt.spawn("echo", label=f"a{i}") for i in range(AGENTS)]
        assert rt.store is not None
        store: Any = rt.store
        asked: list[float] = []
        real_renew = store.renew_leases

        def held_renew(holder: str, expires: float) -> Any:
            asked.append(expires)
            assert everyone.wait(10)  # (a thread of its own: the hub goes on)
            return real_renew(holder, expires)

        monkeypatch.setattr(Leases, "confirm", counted_confirm)
        monkeypatch.setattr(store, "renew_leases", held_renew)
        rt.sessions.leases._sure_until = 0.0  # a stall: no renewal for too long
        for agent in agents:
            agent.followup("hi")
        for agent in agents:
            assert agent.wait_idle(30)
        assert len(arrived) == AGENTS
        assert len(asked) == 1
        for agent in agents:
            assert [e.output for e in rt.sessions.turn_ends(agent.session_id)] == ["hi"]
