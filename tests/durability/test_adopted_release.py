"""A top-level session the sweep adopted is let go once quiet (L-7, L-8, R-RES-2).

Process A holds a top-level session (spawned with a recorded model), accepts
messages and dies -- SIGKILL, or ``close()`` with them still queued. Process B's
sweep adopts the session (``_children/_remote.adopt``) and runs what waits. It
kept the agent resident, and its lease, for B's whole life: a later ``resume``
of the session in process C met ``LEASE_HELD`` for ever. Now B lets the agent go
once it has been quiet for ``adopted_grace`` seconds, and C resumes it. The
same for a top-level agent the sweep resumed to run an orphaned child's work
(the child settles first, then its parent is let go). Agents B's own user
spawned or resumed stay; a message arriving as the adoption is let go runs once.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from durability_kit import Noted, until
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._agents import Agent
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Gate
from subagents.protocol import SessionId

WORKER = Path(__file__).with_name("mp_worker.py")
TTL = 1.0  # seconds: the dead holder's lease expires quickly, the sweep runs often
GRACE = 0.2  # seconds an adoption stays resident once quiet


def _worker(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def _session(db: str, backend: Backend) -> SessionId:
    """A top-level ``mark`` session nobody holds (made, then its runtime closed)."""
    with Runtime(db, backend=backend) as rt:
        rt.models.register("mark", lambda _o: lambda turn: None)
        return rt.spawn("mark", label="owned").session_id


def _leave(victim: subprocess.Popen[str], how: str) -> list[str]:
    """Once ``victim`` said its first line: SIGKILL it (``killed``), or let it close
    its runtime (``closed``). Returns the rest of the first line's words."""
    try:
        assert victim.stdout is not None
        first = victim.stdout.readline().split()
        assert first and first[0] == "ready", first
    finally:
        if how == "killed":
            os.kill(victim.pid, signal.SIGKILL)
        _out, err = victim.communicate(timeout=60)
    if how == "closed":
        assert victim.returncode == 0, err
    return first[1:]


def _resume_elsewhere(db: str, backend: Backend, sid: str, marks: Path) -> str:
    """Process C: resume ``sid`` there; what it said (``resumed`` or an error code)."""
    c = _worker("resume", db, sid, "-", "-", "-", str(marks), backend.name, str(TTL))
    out, err = c.communicate(timeout=90)
    assert c.returncode == 0, err
    return out.strip()


def _let_go(rt: Runtime, sid: SessionId, timeout: float = 30.0) -> bool:
    """Wait until ``rt`` holds ``sid`` no more: its agent disposed, its lease released."""
    agent = rt.agents.get(sid)
    if agent is not None and not agent.wait_disposed(timeout):
        return False
    assert rt.store is not None
    return until(rt, lambda: rt.store.get_lease(sid).holder is None, timeout)  # type: ignore[union-attr]


@pytest.mark.slow
@pytest.mark.parametrize("how", ["killed", "closed"])
def test_a_root_the_sweep_adopted_is_let_go_once_quiet_and_resumes_elsewhere(
    backend: Backend, db: str, tmp_path: Path, how: str
) -> None:
    """A holds the session with a turn running and messages queued, then is
    SIGKILLed (or closes: the queued messages stay in the inbox, unrun). B, asked
    nothing, adopts it and runs every message once; once quiet for the grace it
    lets the session go (agent disposed, lease released) while B stays open, and
    process C resumes it. It stayed live in B, and C got ``LEASE_HELD``."""
    sid = _session(db, backend)
    marks = tmp_path / "m"
    count = 3
    mode = "accept" if how == "killed" else "leave"
    _leave(_worker(mode, db, sid, "-", str(count), "-", str(marks), backend.name, str(TTL)), how)
    noted = Noted()
    with Runtime(db, backend=backend, lease_ttl=TTL, adopted_grace=GRACE) as b:
        noted.register(b, "b")
        b.models.register("mark", b.models.require("note"), replace=True)
        expected = ["first", *(f"m{i}" for i in range(count))]
        assert noted.wait_for(lambda items: len(items) >= len(expected), timeout=30)
        assert _let_go(b, sid), "the adopting runtime kept the session"
        assert b.agents.get(sid) is None
        assert _resume_elsewhere(db, backend, str(sid), marks) == "resumed"
        assert noted.contents() == expected  # each once, in order, all in B


@pytest.mark.slow
def test_a_root_the_sweep_woke_for_its_orphaned_child_is_let_go_after_the_child(
    backend: Backend, db: str, tmp_path: Path
) -> None:
    """A holds a top-level agent and its continuable child (its first turn
    running, follow-ups queued) and is SIGKILLed. B's sweep finds the child's
    work, resumes the top-level agent to wake the child below it; the child runs
    every message and settles (its supervisor), and then the top-level agent is
    let go too, so process C resumes it. The top-level agent stayed in B for
    good, and C got ``LEASE_HELD``."""
    count = 2
    marks = tmp_path / "m"
    victim = _worker("tree", db, "-", "-", str(count), "-", str(marks), backend.name, str(TTL))
    lead, child = (SessionId(x) for x in _leave(victim, "killed"))
    noted = Noted()
    with Runtime(db, backend=backend, lease_ttl=TTL, adopted_grace=GRACE) as b:
        noted.register(b, "b")
        b.models.register("stuck", b.models.require("note"), replace=True)
        b.models.register("mark", b.models.require("note"), replace=True)
        expected = [f"m{i}" for i in range(count + 1)]
        assert noted.wait_for(lambda items: len(items) >= len(expected), timeout=30)
        assert _let_go(b, child), "the child did not settle"
        assert _let_go(b, lead), "the adopting runtime kept the top-level agent"
        assert _resume_elsewhere(db, backend, str(lead), marks) == "resumed"
        assert noted.contents() == expected


def _waiting_root(db: str, backend: Backend, content: str) -> SessionId:
    """A top-level ``note`` session with ``content`` accepted and unrun, nobody
    holding it (its runtime closed while the turn was queued behind a stuck one
    that the close cancels and keeps: ``stuck`` runs again too)."""
    with Runtime(db, backend=backend, adopt=False) as a:
        gate = Gate("stuck")
        a.models.register("note", lambda _o: lambda turn: gate.pass_through(turn.signal))
        agent = a.spawn("note", label=content)
        agent.followup("stuck")
        agent.followup(content)
        assert gate.wait_reached(10)
    return agent.session_id


def _idle_root(db: str, backend: Backend) -> SessionId:
    """A top-level ``note`` session with nothing waiting, nobody holding it (made by
    a runtime that adopts nothing: its first sweep, as it opens, would run the
    waiting roots' messages)."""
    with Runtime(db, backend=backend, adopt=False) as a:
        a.models.register("note", lambda _o: lambda turn: None)
        return a.spawn("note", label="idle").session_id


def test_an_adoption_the_user_asks_to_resume_and_the_users_own_agents_stay(
    backend: Backend, db: str
) -> None:
    """B adopts two sessions whose turns wait at gates. B's user asks to resume
    the first while it runs: ``resume`` returns the live agent, the user's from
    then on (it was ``SESSION_EXISTS``). The first goes idle, then the second, which is let go
    (the alarm reached the first's deadline before: it stayed because it is
    kept). Agents B's user spawned and resumed stay live too."""
    kept_sid = _waiting_root(db, backend, "kept")
    witness_sid = _waiting_root(db, backend, "witness")
    mine_sid = _idle_root(db, backend)
    gates = {"kept": Gate("kept"), "witness": Gate("witness")}

    def on_turn(turn: Any) -> Any:
        gate = gates.get(turn.content)
        if gate is not None:
            gate.pass_through(turn.signal)
        return turn.content

    with Runtime(db, backend=backend, lease_ttl=TTL, adopted_grace=0.0) as b:
        b.models.register("note", lambda _o: on_turn, replace=True)
        spawned = b.spawn("note", label="spawned")
        resumed = b.agents.resume(mine_sid)  # the user's (nothing waits: never adopted)
        assert gates["kept"].wait_reached(30) and gates["witness"].wait_reached(30)
        kept = b.agents.resume(kept_sid)
        assert kept is b.agents.get(kept_sid) and not kept.disposed
        gates["kept"].release()
        assert kept.wait_idle(10)
        gates["witness"].release()
        assert _let_go(b, witness_sid)
        assert b.wait_idle(10)
        for agent in (kept, spawned, resumed):
            assert b.agents.get(agent.session_id) is agent and not agent.disposed


@pytest.mark.parametrize("when", ["before-close", "after-close"])
def test_a_send_as_an_adoption_is_let_go_runs_once(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """Race, forced, 10 rounds: B's let-go of a quiet adoption meets a send from
    B's user -- just before the gate closes (admitted: the agent stays and runs
    it) or just after (refused: the send commits it and resumes the session).
    The message runs once either way, and nothing accepted is left unrun."""
    close_if_idle = Agent.close_if_idle
    sends: list[Any] = []  # the send that races the next let-go, given the session

    def racing(agent: Agent) -> bool:
        send = sends.pop() if sends else None
        if send is not None and when == "before-close":
            send(agent.session_id)
        closed = close_if_idle(agent)
        if send is not None and when == "after-close":
            send(agent.session_id)
        return closed

    monkeypatch.setattr(Agent, "close_if_idle", racing)
    noted = Noted()
    with Runtime(db, backend=backend, lease_ttl=TTL, adopted_grace=0.0) as b:
        noted.register(b, "b")
        _race_the_let_go(b, b, db, backend, noted, sends)


def _runs(items: list[tuple[str, Any, bool]]) -> list[tuple[str, Any]]:
    return [(who, content) for who, content, _again in items]


def _race_the_let_go(
    b: Runtime,
    sender: Runtime,
    db: str,
    backend: Backend,
    noted: Noted,
    sends: list[Any],
    also: Callable[[SessionId], bool] = lambda _sid: True,
) -> None:
    """Ten rounds: a session waits for ``b`` to adopt it; the send of ``late{i}``
    from ``sender`` (queued in ``sends`` for the patched gate to fire) races its
    let-go. Each message runs once, in ``b``, which lets the session go with
    nothing pending; ``also(session)`` holds after each round."""
    for i in range(10):
        sent: list[Any] = []
        # (Set before the session exists: B's sweep may adopt it at once.)
        sends.append(lambda sid, i=i, sent=sent: sent.append(sender.agents.send(sid, f"late{i}")))
        sid = _waiting_root(db, backend, f"w{i}")
        b.mail.rung(sid)  # type: ignore[union-attr]  # (else: the next sweep)
        assert noted.wait_for(lambda items, i=i: ("b", f"late{i}") in _runs(items), 30)
        assert sent, "the send did not race the let-go"
        assert b.wait_idle(10)
        assert noted.ran(f"w{i}") == ["b"] and noted.ran(f"late{i}") == ["b"]
        assert _let_go(b, sid)
        assert b.sessions.pending(sid) == []
        assert also(sid)


def test_a_message_from_another_process_as_an_adoption_is_let_go_runs_once(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Race, forced, 10 rounds: while B lets a quiet adoption go -- its gate just
    closed, its lease not yet released -- runtime C on the same store sends to
    the session: C commits the message and, the lease being B's, rings B, whose
    pickup finds the agent leaving. The lease's release finds the message waiting
    and the session is adopted again: it runs once, and is let go again."""
    close_if_idle = Agent.close_if_idle
    sends: list[Any] = []  # the send that races the next let-go, given the session

    def racing(agent: Agent) -> bool:
        closed = close_if_idle(agent)
        if closed and sends:
            sends.pop()(agent.session_id)
        return closed

    monkeypatch.setattr(Agent, "close_if_idle", racing)
    noted = Noted()
    with (
        Runtime(db, backend=backend, lease_ttl=TTL, adopted_grace=0.0) as b,
        Runtime(db, backend=backend, lease_ttl=TTL, adopt=False) as c,
    ):
        noted.register(b, "b")
        noted.register(c, "c")
        _race_the_let_go(b, c, db, backend, noted, sends, lambda sid: c.agents.get(sid) is None)


def _witness(b: Runtime, db: str, backend: Backend, noted: Noted, n: int) -> None:
    """Adopt a session in ``b`` that is let go at once (grace 0) after everything
    adopted before it was due: whatever of those is still live was kept."""
    sid = _waiting_root(db, backend, f"witness{n}")
    b.mail.rung(sid)  # type: ignore[union-attr]  # (else: the next sweep)
    assert noted.wait_for(lambda items: any(c == f"witness{n}" for _, c, _ in items), 30)
    assert _let_go(b, sid)


def test_background_work_keeps_an_adoption_until_it_ends(backend: Backend, db: str) -> None:
    """An adopted agent's turn starts work that outlives it (what a background
    ``delegate`` does: ``hold_residency``). Quiet otherwise, it stays while that
    work is held -- a witness adopted after it is let go -- and is let go once
    the work ends. ``hold_residency`` was None for a top-level agent, and such
    an agent would have been let go under its background run."""
    releases: list[Any] = []
    noted = Noted()
    with Runtime(db, backend=backend, lease_ttl=TTL, adopted_grace=0.0) as b:

        def on_turn(turn: Any) -> Any:
            noted.add(("b", turn.content, turn.redelivered))
            if turn.content == "work":
                releases.append(turn.subagents.hold_residency())
            return turn.content

        b.models.register("note", lambda _o: on_turn, replace=True)
        sid = _waiting_root(db, backend, "work")
        b.mail.rung(sid)  # type: ignore[union-attr]
        assert noted.wait_for(lambda items: any(c == "work" for _, c, _ in items), 30)
        agent = b.agents.get(sid)
        assert agent is not None and agent.wait_idle(10)
        assert releases and releases[0] is not None
        _witness(b, db, backend, noted, 1)
        assert b.agents.get(sid) is agent and not agent.disposed
        releases[0]()
        assert _let_go(b, sid)


def test_a_resident_child_keeps_its_adopted_parent_until_it_settles(
    backend: Backend, db: str
) -> None:
    """B's sweep finds a continuable child's work (its parent's runtime closed
    with it queued), resumes the top-level parent and wakes the child, whose
    turn then waits. The parent, idle, stays while the child is resident -- a
    witness adopted after it is let go -- and is let go once the child settled."""
    gate = Gate("work")
    with Runtime(db, backend=backend, adopt=False) as a:
        stuck = Gate("stuck")
        a.models.register("note", lambda _o: lambda turn: None)
        a.models.register("kid", lambda _o: lambda turn: stuck.pass_through(turn.signal))
        lead = a.spawn("note", label="lead")
        spec = ContinuableStartSpec(
            parent=lead, provider="local", prompt="p", label="kid", model="kid"
        )
        child, _ = a.subagents.start_continuable(spec)
        a.subagents.followup(lead, child, "work")
        assert stuck.wait_reached(10)
    noted = Noted()
    with Runtime(db, backend=backend, lease_ttl=TTL, adopted_grace=0.0) as b:
        noted.register(b, "b")

        def kid(turn: Any) -> Any:
            noted.add(("b", turn.content, turn.redelivered))
            if turn.content == "work":
                gate.pass_through(turn.signal)
            return turn.content

        b.models.register("kid", lambda _o: kid, replace=True)
        b.mail.rung(child)  # type: ignore[union-attr]  # (else: the next sweep)
        assert gate.wait_reached(30)
        assert until(b, lambda: b.agents.adopted.adopted(lead.session_id), 10)
        parent = b.agents.get(lead.session_id)
        assert parent is not None and parent.wait_idle(10)
        _witness(b, db, backend, noted, 1)
        assert b.agents.get(lead.session_id) is parent and not parent.disposed
        gate.release()
        assert _let_go(b, child)
        assert _let_go(b, lead.session_id)
        assert noted.contents()[:2] == ["p", "work"]


@pytest.mark.parametrize("sent", ["send", "send-relaxed"])
def test_a_session_a_send_resumed_is_let_go_once_quiet(
    backend: Backend, db: str, tmp_path: Path, sent: str
) -> None:
    """``agents.send`` to a top-level session nobody holds resumes it here to run
    the message -- for no user here, as the sweep's adoptions: once quiet for the
    grace it is let go (agent disposed, lease released) and another process
    resumes it. It stayed live in the sender for the process's life (a server
    worker that sends to many sessions kept them all, and their leases). A
    session the user resumed, then sent to, stays."""
    sid, mine_sid = _session(db, backend), _session(db, backend)
    durability = "strict" if sent == "send" else "relaxed"
    with Runtime(
        db, backend=backend, lease_ttl=TTL, adopted_grace=GRACE, durability=durability
    ) as b:
        noted = Noted()
        noted.register(b, "b", model="mark")
        mine = b.agents.resume(mine_sid)
        b.agents.send(sid, "hello")
        b.agents.send(mine_sid, "mine")
        assert noted.runs("hello", ["b"], timeout=30)
        assert _let_go(b, sid, timeout=20), "the sender kept the session"
        assert _resume_elsewhere(db, backend, str(sid), tmp_path / "m") == "resumed"
        assert noted.runs("mine", ["b"], timeout=30)
        assert b.agents.get(mine_sid) is mine and not mine.disposed


@pytest.mark.parametrize("by", ["followup", "start"])
def test_a_root_a_call_by_its_id_resumed_is_let_go_after_its_child(
    backend: Backend, db: str, by: str
) -> None:
    """A follow-up (or a start) naming a parent by its id, in a process where nobody
    holds the tree, resumes the top-level agent here to wake the child below it --
    for no user here: once the child settled and the top-level agent is quiet for
    the grace, it is let go (its lease released). It stayed for the process's life
    (a server worker answering requests by id kept every tree it touched)."""
    with Runtime(db, backend=backend) as a:
        a.models.register("mark", lambda _o: lambda turn: None)
        root = a.spawn("mark", label="root")
        child_id, _mid = a.subagents.start_continuable(
            ContinuableStartSpec(parent=root, provider="local", prompt="p", label="c", model="mark")
        )
        assert a.wait_idle(10)
    root_id = root.session_id
    with Runtime(db, backend=backend, lease_ttl=TTL, adopted_grace=GRACE) as b:
        noted = Noted()
        noted.register(b, "b", model="mark")
        if by == "followup":
            b.subagents.followup(root_id, child_id, "x")
        else:
            spec = ContinuableStartSpec(
                parent=root_id, provider="local", prompt="x", label="c2", model="mark"
            )
            child_id, _mid = b.subagents.start_continuable(spec)
        assert noted.runs("x", ["b"], timeout=30)
        assert _let_go(b, child_id), "the child did not settle"
        assert _let_go(b, root_id, timeout=20), "the caller's runtime kept the top-level agent"
