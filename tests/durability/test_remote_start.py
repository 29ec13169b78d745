"""A continuable child started by the parent's *id* from a process that does not hold it.

``start_continuable(ContinuableStartSpec(parent=parent_id, ...))`` is what a
server worker calls when a request to start a child reaches it while another
worker holds the tree; it used to be ``LEASE_HELD`` (409 in the example server).
Now the child's session, descriptor and prompt are committed by the caller,
unheld, and the parent's holder is rung: it activates the child on the parent's
behalf and runs the prompt. Runtimes on one store in one process stand in for
processes (their leases and doorbells are their own); ``db`` runs each test on
SQLite and on PostgreSQL, ``backend`` on both runtimes. R-CONT-1, R-CONT-3,
R-CONT-9 (idempotent start), R-DESC-3.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from durability_kit import Noted, two_runtimes, until, worker
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import (
    ErrorCode,
    MessageSource,
    SessionId,
    SubagentError,
    TurnEnd,
    new_message_id,
    new_session_id,
)
from subagents.store import MemoryStore


@pytest.fixture
def pair(backend: Backend, db: str) -> Iterator[list[Runtime]]:
    """Two strict runtimes on one store: ``a`` holds the tree, ``b`` starts children."""
    yield from two_runtimes(backend, db, 3.0)


@pytest.fixture
def swept(backend: Backend, db: str) -> Iterator[list[Runtime]]:
    """The same, sweeping for unheld work every 0.2 s (``lease_ttl / 3``)."""
    yield from two_runtimes(backend, db, 0.6)


def _spec(parent: Any, prompt: Any = "hello", **kw: Any) -> ContinuableStartSpec:
    return ContinuableStartSpec(
        parent=parent, provider=kw.pop("provider", "local"), prompt=prompt, label="c",
        model="note",
        **kw,
    )  # fmt: skip


def _turn_ends(rt: Runtime, sid: SessionId) -> list[str]:
    assert rt.store is not None
    rt.sessions.flush()
    return [r.event.stop_reason for r in rt.store.read(sid) if isinstance(r.event, TurnEnd)]


def test_a_start_by_id_runs_where_the_parent_lives(pair: list[Runtime]) -> None:
    """``b`` returns the handle once the child and its prompt are committed; ``a``, which
    holds the parent, activates the child and runs the prompt there, once. The child
    is the parent's: its header, ``list_children`` in either runtime, and a follow-up
    from the parent in ``a`` reaches it."""
    a, b = pair
    noted = Noted()
    noted.register(a, "a")
    noted.register(b, "b")
    root = a.spawn("note", label="root")
    child_id, message_id = b.subagents.start_continuable(_spec(root.session_id))
    assert b.store is not None
    header = b.store.header(child_id)
    assert header is not None and header.parent_session == root.session_id
    assert b.store.find_accepted(message_id) == [(child_id, 1)]  # pending, or run by now
    assert noted.runs("hello", ["a"])
    assert b.agents.get(child_id) is None
    for rt in (a, b):
        assert [r.id for r in rt.subagents.list_children(root.session_id).rows] == [child_id]
    assert until(a, lambda: _turn_ends(a, child_id) == ["completed"])
    a.subagents.followup(root, child_id, "again")
    assert noted.runs("again", ["a"])
    assert noted.ran("hello") == ["a"]


def test_a_fork_started_by_id_is_seeded_with_the_parents_stored_history(
    pair: list[Runtime],
) -> None:
    """``provider="fork"`` by id: ``b`` seeds the child with the parent's completed
    history as stored (its turn's message and ``turn/end``), then ``a`` runs it."""
    a, b = pair
    noted = Noted()
    noted.register(a, "a")
    noted.register(b, "b")
    root = a.spawn("note", label="root")
    root.followup("before")
    assert noted.runs("before", ["a"])
    assert until(a, lambda: _turn_ends(a, root.session_id) == ["completed"])
    child_id, _mid = b.subagents.start_continuable(
        _spec(root.session_id, "forked", provider="fork")
    )
    assert noted.runs("forked", ["a"])
    assert b.store is not None
    header = b.store.header(child_id)
    assert header is not None and header.seed_len > 0
    seed = [r.event for r in b.store.read(child_id)][: header.seed_len]
    assert [e.content for e in seed if e.type == "message"] == ["before"]
    assert isinstance(seed[-1], TurnEnd)


def test_a_start_by_id_is_idempotent_across_processes(pair: list[Runtime]) -> None:
    """The same ``message_id`` from ``b`` twice and from ``a`` (by the agent) once: one
    child, one handle, the prompt run once. R-CONT-9."""
    a, b = pair
    noted = Noted()
    noted.register(a, "a")
    noted.register(b, "b")
    root = a.spawn("note", label="root")
    mid = new_message_id()
    first = b.subagents.start_continuable(_spec(root.session_id, "once", message_id=mid))
    again = b.subagents.start_continuable(_spec(str(root.session_id), "once", message_id=mid))
    here = a.subagents.start_continuable(_spec(root, "once", message_id=mid))
    assert first == again == here
    assert first.message_id == mid
    assert until(a, lambda: _turn_ends(a, first.child_id) == ["completed"])
    assert [r.id for r in b.subagents.list_children(root.session_id).rows] == [first.child_id]
    assert noted.ran("once") == ["a"]


def test_a_start_by_id_where_the_parent_is_live_here_is_the_ordinary_start(
    pair: list[Runtime],
) -> None:
    """By id in the runtime that holds the parent: the child is resident at once,
    exactly as when started by the agent (source: the parent)."""
    a, _b = pair
    noted = Noted()
    noted.register(a, "a")
    root = a.spawn("note", label="root")
    child_id, _mid = a.subagents.start_continuable(_spec(root.session_id, "local"))
    assert noted.runs("local", ["a"])
    assert until(a, lambda: _turn_ends(a, child_id) == ["completed"])
    assert a.store is not None
    (record,) = [r for r in a.store.read(child_id) if r.event.type == "message"]
    assert record.event.source == MessageSource(kind="parent", session_id=root.session_id)


def test_a_start_by_id_where_nobody_holds_the_parent_resumes_it_here(
    pair: list[Runtime],
) -> None:
    """Nobody holds the parent (``a``, which made it, closed): ``b`` resumes it from
    its recorded model and starts the child there, as a follow-up by id does."""
    a, b = pair
    noted = Noted()
    noted.register(a, "a")
    noted.register(b, "b")
    root = a.spawn("note", label="root")
    root_id = root.session_id
    a.close()
    child_id, _mid = b.subagents.start_continuable(_spec(root_id, "resumed"))
    assert noted.runs("resumed", ["b"])
    assert b.agents.get(root_id) is not None
    assert until(b, lambda: _turn_ends(b, child_id) == ["completed"])


def test_a_lost_ring_is_made_up_by_the_holders_sweep(
    swept: list[Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The doorbell is a hint: with ``b``'s rings dropped, ``a``'s next sweep (every
    ``lease_ttl / 3``) finds the unheld child with its prompt waiting and runs it."""
    a, b = swept
    noted = Noted()
    noted.register(a, "a")
    noted.register(b, "b")
    root = a.spawn("note", label="root")
    rung: list[bytes] = []
    # Sent, and lost on the way (a datagram the receiver dropped: sendto succeeded).
    monkeypatch.setattr(b.sessions, "ring", lambda _address, p: rung.append(p) or True)
    child_id, _mid = b.subagents.start_continuable(_spec(root.session_id, "swept"))
    assert rung and set(rung) == {child_id.to_bytes()}  # rung (b's sweeps may ring again), lost
    assert noted.runs("swept", ["a"])


def test_a_start_by_id_racing_the_parents_release_runs_once(pair: list[Runtime]) -> None:
    """Race, 20 rounds: ``b`` starts a child by id while ``a`` lets the parent go.
    Whichever way it falls -- ``a`` rung while it still holds the parent, or the
    parent resumed in ``b`` -- the start returns, the prompt runs exactly once, and
    the parent has exactly that child."""
    a, b = pair
    noted = Noted()
    noted.register(a, "a")
    noted.register(b, "b")
    for i in range(20):
        root = a.spawn("note", label=f"root{i}")
        releasing = a.backend.spawn(root.dispose)
        child_id, _mid = b.subagents.start_continuable(_spec(root.session_id, f"race{i}"))
        releasing.join(10)
        ends = lambda c=child_id: _turn_ends(b, c) == ["completed"]  # noqa: E731
        assert until(b, ends), i
        assert len(noted.ran(f"race{i}")) == 1, (i, noted.ran(f"race{i}"))
        rows = b.subagents.list_children(root.session_id).rows
        assert [r.id for r in rows] == [child_id]
        holder = b.agents.get(root.session_id)
        if holder is not None:  # resumed in b: let it go for the next round
            holder.dispose()
    assert sorted(c for _, c, _ in noted.items()) == sorted(f"race{i}" for i in range(20))


def _sessions(rt: Runtime) -> list[SessionId]:
    assert rt.store is not None
    return sorted(h.id for h in rt.store.all_headers())


def test_bad_starts_by_id_create_nothing(pair: list[Runtime], backend: Backend, db: str) -> None:
    """Refused before anything is created, whatever holds the parent: a malformed id
    (``INVALID_ARGUMENT``), an unknown parent (``SESSION_NOT_FOUND``), an unknown
    provider or model, no label (``DESCRIPTOR_INVALID``), a depth past the runtime's
    ceiling (``DEPTH_EXCEEDED``), an aborted signal (``CANCELLED``)."""
    from subagents.actors import AbortController

    a, b = pair
    noted = Noted()
    noted.register(a, "a")
    noted.register(b, "b")
    root = a.spawn("note", label="root")
    before = _sessions(b)
    aborted = AbortController()
    aborted.abort()
    cases: list[tuple[Any, str]] = [
        (_spec("not an id"), ErrorCode.INVALID_ARGUMENT),
        (_spec(42), ErrorCode.INVALID_ARGUMENT),
        (_spec(new_session_id()), ErrorCode.SESSION_NOT_FOUND),
        (_spec(root.session_id, provider="nowhere"), ErrorCode.PROVIDER_NOT_FOUND),
        (
            ContinuableStartSpec(
                parent=root.session_id, provider="local", prompt="p", label="c", model="absent"
            ),
            ErrorCode.MODEL_NOT_FOUND,
        ),
        (
            ContinuableStartSpec(parent=root.session_id, provider="local", prompt="p", label=" "),
            ErrorCode.DESCRIPTOR_INVALID,
        ),
        (_spec(root.session_id, signal=aborted.signal), ErrorCode.CANCELLED),
    ]
    for spec, code in cases:
        with pytest.raises(SubagentError) as err:
            b.subagents.start_continuable(spec)
        assert err.value.code == code, (spec, err.value)
    mid_child, _ = a.subagents.start_continuable(_spec(root, "first"))
    assert until(a, lambda: _turn_ends(a, mid_child) == ["completed"])
    before = _sessions(b)
    with Runtime(db, backend=backend, max_delegation_depth=1) as shallow:
        noted.register(shallow, "shallow")
        with pytest.raises(SubagentError) as err:  # the ceiling of the runtime starting it
            shallow.subagents.start_continuable(_spec(mid_child))
        assert err.value.code == ErrorCode.DEPTH_EXCEEDED
    assert _sessions(b) == before
    assert noted.contents() == ["first"]


def _root_nobody_runs(pair: list[Runtime]) -> tuple[Noted, Any]:
    """A root ``a`` made and let go (closed), of a model registered in ``a`` only:
    nobody holds it, and ``b`` (where ``note`` runs) cannot resume it."""
    a, b = pair
    noted = Noted()
    noted.register(b, "b")
    a.models.register("root-only", lambda _o: lambda turn: None)
    root = a.spawn("root-only", label="root")
    a.close()
    return noted, root


def test_a_start_nobody_can_run_is_withdrawn(pair: list[Runtime]) -> None:
    """Nobody holds the parent (``a``, which made it, closed) and ``b`` cannot resume
    it (its model was registered in ``a`` only): the start raises that error, and
    neither the child nor its prompt remains."""
    noted, root = _root_nobody_runs(pair)
    b = pair[1]
    before = _sessions(b)
    with pytest.raises(SubagentError) as err:
        b.subagents.start_continuable(_spec(root.session_id))
    assert err.value.code == ErrorCode.MODEL_NOT_FOUND
    assert _sessions(b) == before
    assert not noted.items()


def test_a_start_by_id_reaches_a_parent_in_another_real_process(
    backend: Backend, db: str, tmp_path: Path
) -> None:
    """The same across a real process boundary: a worker holds the root; this process
    (which never held it) starts a child by the root's id; the worker runs its prompt
    (the turn writes the worker's pid)."""
    marks = tmp_path / "marks"
    with worker("start_worker.py", db, backend.name, str(marks), "root", "30") as proc:
        assert proc.stdout is not None and proc.stdin is not None
        root = proc.stdout.readline().strip()
        assert root, proc.stderr.read() if proc.stderr else ""
        with Runtime(db, backend=backend) as rt:
            rt.models.register("pid", lambda _o: lambda turn: None)  # never runs here
            child_id, _mid = rt.subagents.start_continuable(
                ContinuableStartSpec(parent=root, provider="local", prompt="p", label="c",
                                     model="pid")
            )  # fmt: skip
            assert until(rt, marks.exists, 30)
            assert rt.agents.get(child_id) is None
        assert marks.read_text().split() == [str(proc.pid), child_id]
        proc.stdin.close()
        assert proc.wait(30) == 0


def test_a_start_by_id_below_a_drained_parent_waits_for_the_tree(
    swept: list[Runtime], caplog: pytest.LogCaptureFixture
) -> None:
    """R-DRAIN-1 across processes: ``a`` drained the parent's descendants, so its
    holder refuses to activate a child ``b`` started by id; the start was committed
    (it returned), so the prompt waits in the child's inbox -- unrun -- until the
    tree is live again: ``a`` closes, ``b`` resumes the parent, and ``b``'s sweep
    runs it, once. ``a``'s sweeps ask again, and warn of it once."""
    caplog.set_level(logging.DEBUG, logger="subagents")
    a, b = swept
    noted = Noted()
    noted.register(a, "a")
    noted.register(b, "b")
    root = a.spawn("note", label="root")
    a.subagents.drain_continuable_descendants([root])
    child_id, message_id = b.subagents.start_continuable(_spec(root.session_id, "later"))
    refused = lambda: any(  # noqa: E731
        "could not wake" in r.getMessage() and str(child_id) in r.getMessage()
        for r in caplog.records
    )
    assert until(a, refused)
    again = lambda: any(  # noqa: E731
        "still cannot wake" in r.getMessage() and str(child_id) in r.getMessage()
        for r in caplog.records
    )
    assert until(a, again)  # a's next sweep asked again ...
    said = [
        r
        for r in caplog.records
        if r.levelno >= logging.WARNING and str(child_id) in r.getMessage()
    ]
    assert len(said) == 1  # ... and said so once
    assert b.store is not None
    assert [e.message_id for e in b.store.pending(child_id)] == [message_id]
    assert not noted.items()
    a.close()
    # The tree is live again in b: by this resume, or by b's own sweep first (it
    # adopts the child, orphaned by a's close, and resumes its parent to wake it).
    try:
        b.agents.resume(root.session_id)
    except SubagentError as exc:
        assert exc.code == ErrorCode.SESSION_EXISTS, exc
    assert b.agents.get(root.session_id) is not None
    assert noted.runs("later", ["b"])


@pytest.mark.parametrize("where", ["memory", "relaxed"])
def test_a_start_by_id_where_nothing_is_committed_for_others_resumes_the_parent(
    backend: Backend, tmp_path: Path, where: str
) -> None:
    """On a memory store, or under relaxed durability, nothing is committed for
    another process to run: a start by id resumes the parent here (from its
    recorded model) and starts the child below it, as by the agent. R-CONT-1."""
    store: Any = MemoryStore() if where == "memory" else str(tmp_path / "relaxed.db")
    with Runtime(store, backend=backend, durability="strict" if where == "memory" else where) as rt:
        noted = Noted()
        noted.register(rt, "here")
        root = rt.spawn("note", label="root")
        root_id = root.session_id
        root.dispose()
        assert rt.agents.get(root_id) is None
        child_id, _mid = rt.subagents.start_continuable(_spec(root_id, "kept"))
        assert rt.agents.get(root_id) is not None  # resumed for the start
        assert noted.runs("kept", ["here"])
        rows = rt.subagents.list_children(root_id).rows
        assert [r.id for r in rows] == [child_id]


def test_a_follow_up_by_id_after_the_trees_holder_was_killed_runs_at_once(
    backend: Backend, tmp_path: Path
) -> None:
    """A worker holding a tree -- its child in a turn -- is SIGKILLed; its leases
    would live for an hour. A follow-up by the root's id from this process finds
    the holders' doorbells gone (nobody there, on this host), takes the tree over
    at once, replays the cut-short turn (``redelivered``), then runs the
    follow-up. SQLite only: on PostgreSQL a ring is a ``NOTIFY``, which cannot tell
    that nobody listens; there the leases' expiry hands the tree over
    (``test_multiprocess.py``)."""
    db = str(tmp_path / "s.db")
    with worker(
        "start_worker.py", db, backend.name, str(tmp_path / "m"), "blocked", "3600"
    ) as proc:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert len(line) == 2, proc.stderr.read() if proc.stderr else ""
        root, child = line
        proc.kill()
        proc.wait()
        with Runtime(db, backend=backend, lease_ttl=3600) as rt:
            noted = Noted()
            noted.register(rt, "here", "block")
            rt.subagents.followup(root, child, "next")
            assert noted.wait_for(lambda items: len(items) == 2)
            assert noted.items() == [("here", "first", True), ("here", "next", False)]


def test_a_duplicate_start_keeps_the_child_a_failed_wake_would_withdraw(
    pair: list[Runtime], backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Race, forced: ``b`` and a third runtime start one child by id with one
    ``message_id``; nobody holds the parent and neither can resume it. ``b``
    commits the child and, while its wake is failing, the third caller finds it
    and is told it exists. ``b``'s withdrawal must then leave it (the third
    caller answered for it): ``b`` returns the same handle rather than raising,
    and the child and its prompt stay until a runtime that can run them does.
    It used to delete the child the third caller held a handle to. R-CONT-9."""
    from subagents.actors._children import _remote

    noted, root = _root_nobody_runs(pair)
    b = pair[1]
    mid = new_message_id()
    real_wake = _remote.wake_child
    told: list[Any] = []
    with Runtime(db, backend=backend, lease_ttl=3.0) as c:
        noted.register(c, "c")

        def wake_racing(*args: Any) -> None:
            if not told:  # b's wake: c's duplicate start lands before it fails
                told.append(c.subagents.start_continuable(_spec(root.session_id, message_id=mid)))
            real_wake(*args)

        monkeypatch.setattr(_remote, "wake_child", wake_racing)
        handle = b.subagents.start_continuable(_spec(root.session_id, message_id=mid))
        monkeypatch.undo()
    assert told == [handle]
    assert b.store is not None
    assert b.store.header(handle.child_id) is not None
    assert [e.message_id for e in b.store.pending(handle.child_id)] == [mid]
    # Nothing lost: a runtime that can run the tree runs the prompt once.
    with Runtime(db, backend=backend, lease_ttl=3.0) as d:
        noted.register(d, "d")
        d.models.register("root-only", lambda _o: lambda turn: None)
        d.subagents.followup(root.session_id, handle.child_id, "next")
        assert noted.runs("next", ["d"])
        assert noted.ran("hello") == ["d"]
