"""The mail's adoption of a top-level session nobody holds (R-DUR, R-LIFE).

A message committed to a top-level session's inbox rings this runtime's mail,
which adopts the session when nobody holds it (``_children/_remote.adopt``). The
caller that committed it (``agents.send``) resumes the session too: one of them
activates it, the other finds it live. An adoption decided on a read of the
inbox from before the message ran must not bring back, for nothing, an agent its
owner has since disposed: top-level agents never settle, so it stayed resident
(a thread each on threads) for the runtime's life.
"""

from __future__ import annotations

from typing import Any

import pytest
from subagents.actors import Runtime
from subagents.actors._children import _remote
from subagents.actors._kernel._backend import Backend


def test_an_adoption_that_finds_nothing_waiting_leaves_nothing_live(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced: the adoption reads the inbox while the message waits; the message
    then runs and its agent is disposed; the adoption resumes the session after.
    It finds nothing waiting, so it lets the session go again."""
    go = backend.event()

    def lead(turn: Any) -> str:
        if turn.content == "again":
            go.wait(10)
        return "ok"

    with Runtime(db, backend=backend, adopt=False) as rt:
        rt.models.register("lead", lambda _o: lead)
        root = rt.spawn("lead", label="root")
        sid = root.session_id
        root.dispose()
        rt.agents.send(sid, "again")
        waiting = rt.sessions.pending(sid)  # the adoption's read, before the turn ended
        assert [e.event.content for e in waiting] == ["again"]
        go.set()
        assert rt.wait_idle(10)
        agent = rt.agents.get(sid)
        assert agent is not None
        agent.dispose()
        reads = iter([waiting])
        real = rt.sessions.pending

        def stale_first(session_id: Any, **kw: Any) -> Any:
            return next(reads, None) or real(session_id, **kw)

        monkeypatch.setattr(rt.sessions, "pending", stale_first)
        _remote.adopt(rt.agents, rt.sessions, rt.continuation, sid)
        monkeypatch.undo()
        assert rt.agents.get(sid) is None
        assert rt.agents.list() == []


def test_sends_to_disposed_roots_leave_none_live(backend: Backend, db: str) -> None:
    """Race, 60 rounds with the mail adopting: spawn, dispose, ``agents.send``,
    wait, dispose. After all of them no agent is live."""
    with Runtime(db, backend=backend) as rt:
        rt.models.register("lead", lambda _o: lambda turn: "ok")
        for i in range(60):
            root = rt.spawn("lead", label=f"r{i}")
            sid = root.session_id
            root.dispose()
            rt.agents.send(sid, "again")
            assert rt.wait_idle(10)
            agent = rt.agents.get(sid)
            if agent is not None:
                agent.dispose()
        assert rt.wait_idle(10)
        rt.sessions.flush()
        assert rt.agents.wait_stopped(10)
        live = [a.session_id for a in rt.agents.list()]
        assert live == []


@pytest.mark.parametrize("when", ["registered", "gate-closed"])
def test_a_send_racing_the_let_go_of_an_adoption_runs(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """Forced: the adoption's resume found nothing waiting (taken since its look
    under the claim), and a message is sent to the session while it lets its
    agent go -- once the agent is live (registered), or once its gate closed.
    Nothing is discarded: the live agent keeps and runs it, or the send goes on
    as to a session nobody holds (committed: its next activation runs it). It
    was discarded unrun (the let-go was a plain dispose)."""
    from subagents.actors._agents import Agent
    from subagents.protocol import TurnEnd

    with Runtime(db, backend=backend, adopt=False) as rt:
        rt.models.register("lead", lambda _o: lambda turn: f"ran {turn.content}")
        root = rt.spawn("lead", label="root")
        sid = root.session_id
        root.dispose()
        sent: list[Any] = []

        def send() -> None:
            if not sent:  # once (the send's own resume unclaims too)
                sent.append(None)
                sent[0] = rt.agents.send(sid, "late")

        if when == "registered":
            claims = type(rt.agents._claims)
            unclaim = claims.unclaim
            monkeypatch.setattr(claims, "unclaim", lambda self, s: (unclaim(self, s), send()))
        else:
            close_if_idle = Agent.close_if_idle
            monkeypatch.setattr(
                Agent, "close_if_idle", lambda self: (close_if_idle(self), send())[0]
            )
        # The adoption's read and its look under the claim: something waited (then
        # taken by another process, say: the resume finds nothing).
        stale = iter([[object()], [object()]])
        real = rt.sessions.pending
        monkeypatch.setattr(
            rt.sessions, "pending", lambda s, **kw: next(stale, None) or real(s, **kw)
        )
        monkeypatch.setattr(_remote, "_only_quiet", lambda _pending: False)
        _remote.adopt(rt.agents, rt.sessions, rt.continuation, sid)
        monkeypatch.undo()
        assert sent and sent[0] is not None
        assert rt.wait_idle(10)
        rt.sessions.flush()
        ends = [
            (e.output, e.error) for r in rt.store.read(sid) if isinstance(e := r.event, TurnEnd)
        ]
        waiting = [e.event.content for e in rt.sessions.pending(sid)]
        if when == "registered":  # the live agent kept it
            assert (ends, waiting) == ([("ran late", None)], [])
        else:  # committed as to a session nobody holds: its next activation runs it
            assert (ends, waiting) == ([], ["late"])
            again = rt.agents.resume(sid)
            assert again.wait_idle(10)
            assert rt.sessions.turn_ends(sid)[-1].output == "ran late"
