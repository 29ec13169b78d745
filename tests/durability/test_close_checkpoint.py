"""A closing runtime checkpoints its idle continuable children, as settling would.

R-DUR-3, R-RES-9. A child kept warm (``keep_warm``) never settles while work keeps
coming; a server that restarts closes its runtime with such children resident.
The close disposed them without a checkpoint, so each restart's resume refolded
the child's whole log (from its last settle's checkpoint, if it ever settled).
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from refusal_kit import refuse
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._agents._sessions import SessionService
from subagents.actors._kernel import Gate
from subagents.actors._kernel._backend import Backend
from subagents.protocol import SessionId, unpackb
from subagents.store import open_store


def _register(rt: Runtime, gate: Gate | None = None) -> None:
    def on_turn(turn: Any) -> Any:
        if gate is not None and turn.content == "hold":
            gate.pass_through(turn.signal)
        return f"done {turn.content}"

    rt.models.register("note", lambda _options: on_turn, replace=True)


def _start(rt: Runtime, parent: Any) -> str:
    spec = ContinuableStartSpec(
        parent=parent, provider="local", prompt="t0", label="kid", model="note"
    )
    return str(rt.subagents.start_continuable(spec).child_id)


def test_an_idle_child_kept_warm_leaves_its_checkpoint(backend: Backend, db: str) -> None:
    """The child ran three turns and is idle, resident (kept warm), when the runtime
    closes: its checkpoint is stored through its last turn, and the next runtime's
    follow-up by the parent's id resumes it from there, its turns numbered on."""
    with Runtime(db, backend=backend, keep_warm=3600) as rt:
        _register(rt)
        root = rt.spawn("note", label="root")
        child = _start(rt, root)
        for content in ("t1", "t2"):
            rt.subagents.followup(root, child, content)
        assert rt.wait_idle(30)
        assert rt.agents.get(child) is not None  # warm: never settled
        root_id = root.session_id
    with open_store(db) as store:
        found = store.get_checkpoint(child)
        assert found is not None, "the close wrote no checkpoint"
        assert unpackb(found[1])["next_turn"] == 3
    with Runtime(db, backend=backend) as rt:
        _register(rt)
        rt.subagents.followup(str(root_id), child, "t3")
        assert rt.wait_idle(30)
        ends = rt.sessions.turn_ends(child)
        assert [(e.turn, e.output) for e in ends] == [
            (0, "done t0"), (1, "done t1"), (2, "done t2"), (3, "done t3")
        ]  # fmt: skip


def test_a_child_busy_when_the_runtime_closes_is_not_checkpointed_by_it(
    backend: Backend, db: str
) -> None:
    """A child whose turn the close cuts short is disposed as before, without a
    checkpoint (its turn runs again at the next activation, a redelivery)."""
    gate = Gate("hold")
    with Runtime(db, backend=backend, keep_warm=3600) as rt:
        _register(rt, gate)
        root = rt.spawn("note", label="root")
        child = _start(rt, root)
        assert rt.wait_idle(30)
        rt.subagents.followup(root, child, "hold")
        assert gate.wait_reached(30)
        root_id = root.session_id
    with open_store(db) as store:
        assert store.get_checkpoint(child) is None
    with Runtime(db, backend=backend) as rt:
        _register(rt)
        rt.subagents.followup(str(root_id), child, "after")
        assert rt.wait_idle(30)
        ends = rt.sessions.turn_ends(child)
        assert [e.output for e in ends if e.stop_reason == "completed"][-2:] == [
            "done hold", "done after"
        ]  # fmt: skip


def test_a_close_waits_for_no_child_alone_and_loses_no_release(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """R-RES-5, R-DUR-3: a closing runtime disposes its resident children without a
    flush each (their last writes and releases queue in order, and the writer's
    drain writes them together). A child whose checkpoint the store refuses then
    (a real store error, a trigger) is logged, and its lease still goes back: the
    next runtime's follow-up resumes it from its log, its turns numbered on. Its
    siblings' checkpoints are stored."""
    with Runtime(db, backend=backend, keep_warm=3600) as rt:
        _register(rt)
        root = rt.spawn("note", label="root")
        kids = [_start(rt, root) for _ in range(3)]
        assert rt.wait_idle(30)
        rt.sessions.flush()
        refuse(db, SessionId(kids[1]), table="checkpoints", what="checkpoint")
        flushed: list[Any] = []
        flush = SessionService.flush

        def counting(self: Any, session_id: Any = None, timeout: Any = 30.0) -> None:
            flushed.append(session_id)
            flush(self, session_id, timeout)

        monkeypatch.setattr(SessionService, "flush", counting)
        root_id = root.session_id
        with caplog.at_level(logging.ERROR, logger="subagents"):
            rt.close()
    monkeypatch.undo()
    assert [s for s in flushed if s is not None] == []  # no disposal flushed its session
    assert any(kids[1] in r.getMessage() for r in caplog.records), caplog.text
    with open_store(db) as store:
        assert [store.get_checkpoint(k) is not None for k in kids] == [True, False, True]
        leases = store.get_leases([SessionId(k) for k in kids])
        assert all(lease.holder is None for lease in leases.values()), leases
    with Runtime(db, backend=backend) as rt:
        _register(rt)
        rt.subagents.followup(str(root_id), kids[1], "t1")
        assert rt.wait_idle(30)
        assert [e.turn for e in rt.sessions.turn_ends(kids[1])] == [0, 1]
