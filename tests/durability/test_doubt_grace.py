"""A message in doubt (its commit's answer lost) that the store does not show yet
stays in doubt for a while: the server may still be finishing that COMMIT,
invisible to other connections until it ends (a connection the deadline's
watchdog cut while the server waited on its disk). Forgotten at the first look
that missed it, it would land taken by the live activation and never run there.
R-DUR-1, R-FUP-5."""

from __future__ import annotations

from pathlib import Path

import pytest
from subagents.actors import Runtime
from subagents.actors._agents import _followups
from subagents.actors._kernel._backend import Backend
from subagents.protocol import new_message_id


def test_an_unseen_message_in_doubt_stays_so_for_the_grace(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Runtime(str(tmp_path / "d.db"), backend=backend) as rt:
        agent = rt.spawn("echo")
        agent.followup("first")
        assert agent.wait_idle(10)
        mid = new_message_id()
        agent._doubt([mid])  # as after a commit whose answer was lost
        agent._settle_unsure()  # the store does not show it (yet)
        assert agent._in_doubt() == [mid]
        # A retry by id that commits it itself: no longer in doubt (run once).
        assert agent.followup("second", message_id=mid) == mid
        assert agent._in_doubt() == []
        assert agent.wait_idle(10)
        assert agent.statistics().turns == 2
        other = new_message_id()
        agent._doubt([other])
        monkeypatch.setattr(_followups, "DOUBT_GRACE", 0.0)  # the grace is over
        agent._settle_unsure()
        assert agent._in_doubt() == []
