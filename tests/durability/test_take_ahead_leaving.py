"""Messages a follow-up's take-ahead took for an agent found leaving go back to
nobody (R-DUR-2, R-FUP-1, L-8), both backends, SQLite and PostgreSQL.

A follow-up of a live agent committed past a gap in its durable inbox first takes
the messages ahead of it that nobody took (another process's ``send``) and
queues them (``_ahead.take_ahead``). When the agent's gate closed between the
take and the queueing -- it was being disposed, or a settling child retired as
it went idle -- the queueing failed and the messages stayed taken by the ending
activation: never run, yet the next activation read them as taken by an earlier
one and ran them flagged ``redelivered`` (and the lease's release, finding no
message waiting untaken, did not say work was left). The crash soak logged the
failed take-ahead (``AGENT_DISPOSED``) now and then. The mail pickup already gave
back what it took for an agent found leaving; the take-ahead now does too.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import pytest
from durability_kit import exited, gated_pickup, until, worker
from subagents.actors import Runtime
from subagents.actors._agents import _ahead, _mail
from subagents.actors._kernel._backend import Backend
from subagents.protocol import SubagentError, TurnEnd, TurnStart


def test_messages_taken_ahead_for_an_agent_found_leaving_run_unflagged(
    backend: Backend, db: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker process sends ``w-0`` to a top-level session this runtime holds
    (committed untaken; this runtime's pickup is held at a gate). The agent's own
    follow-up ``m2`` then takes ``w-0`` ahead of it, and as it queues it the agent
    is found disposed. ``w-0`` runs once, in a later activation, not flagged
    ``redelivered`` (it was: taken by the disposed activation, which never ran it)."""
    pickup, gated = gated_pickup()
    real_replay = _ahead.replay
    disposing: list[Any] = []

    def leaving(agent: Any, entries: Any, **kw: Any) -> None:
        # Once: the take-ahead took w-0; now the agent is disposed (another thread).
        monkeypatch.setattr(_ahead, "replay", real_replay)
        disposing.append(agent._host.backend.spawn(agent.dispose, name="disposer"))
        assert until(a, lambda: agent.disposed)
        real_replay(agent, entries, **kw)

    with Runtime(db, backend=backend) as a:
        a.models.register("mark", lambda _o: lambda turn: turn.content)
        root = a.spawn("mark", label="held")
        sid = root.session_id
        monkeypatch.setattr(_mail.Mailman, "pickup", gated)
        marks = str(tmp_path / "marks")
        args = ("send", db, str(sid), "w", "1", "1", marks, backend.name, "30")
        with worker("mp_worker.py", *args) as b:
            assert b.stdout is not None
            w0 = b.stdout.readline().strip()  # committed, this runtime rung
            assert w0
            monkeypatch.setattr(_ahead, "replay", leaving)
            with contextlib.suppress(SubagentError):  # the agent is disposed
                root.followup("m2")
            (disposer,) = disposing
            assert disposer.join(30)
            pickup.release()
            with contextlib.suppress(SubagentError):  # (or another runtime took it up)
                a.agents.resume(sid)

            def ran() -> list[tuple[bool, str]]:
                turns: dict[int, bool] = {}
                out = []
                for r in a.sessions.read(sid):
                    ev = r.event
                    if isinstance(ev, TurnStart) and w0 in [str(m) for m in ev.message_ids]:
                        turns[ev.turn] = ev.redelivered
                    elif isinstance(ev, TurnEnd) and ev.turn in turns:
                        out.append((turns[ev.turn], ev.stop_reason))
                return out

            assert until(a, lambda: "completed" in [s for _r, s in ran()], timeout=30)
            assert exited(a, b) == 0  # (b waits to see the turn run)
        assert ran() == [(False, "completed")]
