"""A message in doubt (its commit's answer lost) that the store does not show yet
stays in doubt for a while: the server may still be finishing that COMMIT,
invisible to other connections until it ends (a connection the deadline's
watchdog cut while the server waited on its disk). Forgotten at the first look
that missed it, it would land taken by the live activation and never run there.
R-DUR-1, R-FUP-5."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from subagents.actors import Runtime
from subagents.actors._agents import _followups
from subagents.actors._kernel._backend import Backend
from subagents.protocol import new_message_id, trusted_message


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


@pytest.mark.parametrize("landed", [False, True])
def test_a_retry_of_a_message_in_doubt_runs_once_when_the_pickup_settles_meanwhile(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, landed: bool
) -> None:
    """R-DUR-1, R-FUP-5: a retry by id of a message in doubt commits it; the mail
    pickup (woken by the doubt) settles the doubts right after that commit -- forced
    here, in every run, by doing it inside the store call. The pickup must leave the
    retry's own commit to the retry: it ran twice (the pickup queued it, and the
    retry delivered it). ``landed``: the commit in doubt had landed after all (the
    retry is a duplicate): it runs once, queued by whoever settles it."""
    for _ in range(5):
        with Runtime(str(tmp_path / "d.db"), backend=backend) as rt:
            agent = rt.spawn("echo")
            agent.followup("first")
            assert agent.wait_idle(10)
            mid = new_message_id()
            sessions = rt.sessions
            real = sessions.accept
            if landed:  # committed, taken by this activation: only its answer was lost
                real(agent.session_id, [trusted_message(mid, "second", None)], agent.session)
            agent._doubt([mid])
            if not landed:
                agent._settle_unsure()  # the store does not show it (yet): it stays

            def accept_then_settle(*args: Any, real: Any = real, agent: Any = agent) -> Any:
                accepted = real(*args)
                agent._settle_unsure()  # what the pickup does, at the worst moment
                return accepted

            monkeypatch.setattr(sessions, "accept", accept_then_settle)
            assert agent.followup("second", message_id=mid) == mid
            monkeypatch.undo()
            assert agent.wait_idle(10)
            assert agent._in_doubt() == []
            assert agent.statistics().turns == 2
            sessions.flush(agent.session_id)  # (its turn's end leaves the inbox with it)
            assert sessions.pending(agent.session_id) == []
        (tmp_path / "d.db").unlink()
