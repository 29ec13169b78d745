"""What a long-running server must not accumulate (found by a hunt that ran each
workload for thousands of cycles and watched what grew): each test fails on the
code before its fix (checked)."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, SubagentError, new_message_id, packb, trusted_message
from subagents.store import MemoryStore, SqliteStore


def test_a_failed_write_keeps_no_frame_of_its_batch(backend: Backend, tmp_path: Path) -> None:
    """A session whose lease another process took over fails its next write
    (``LEASE_LOST``) and is never activated here again: the runtime kept its
    error with the traceback's frames -- the failed batch and every event in it
    (about 20 KB a session). Now the error alone, and only while the writes of
    its activation may still come (see the next test)."""
    db = str(tmp_path / "s.db")
    with Runtime(db, backend=backend, durability="relaxed") as rt, SqliteStore(db) as other:
        kept = _kept_at_end(rt)
        for _ in range(3):
            agent = rt.spawn("echo")
            agent.followup("x")
            assert agent.wait_idle(10)
            rt.sessions.flush()  # (relaxed: written behind) its session is in the store
            later = time.time() + 3600  # as another process would, after a stall
            other.acquire_lease(agent.session_id, "thief", now=later, expires=later + 60)
            with contextlib.suppress(SubagentError):
                agent.followup("y" * 1000)
            assert agent.wait_disposed(10)
            error = kept[agent.session_id]
            assert error is not None and error.code == ErrorCode.LEASE_LOST
            chain: list[BaseException | None] = [error]
            while chain:
                exc = chain.pop()
                if exc is not None:
                    assert exc.__traceback__ is None, exc
                    chain += [exc.__cause__, exc.__context__]


def _kept_at_end(rt: Runtime) -> dict[Any, Any]:
    """The error the writer keeps for each session as its activation ends (it
    forgets it after: see the next test), filled in as they end."""
    writer = rt.sessions._writer
    assert writer is not None
    ended = writer.ended
    kept: dict[Any, Any] = {}

    def spy(session_id: Any) -> None:
        kept[session_id] = writer._failed.get(session_id)
        ended(session_id)

    writer.ended = spy  # type: ignore[method-assign]
    return kept


class _Refusing(MemoryStore):
    """A write-behind store (as an SQL one is) that refuses every event row of
    the sessions in ``refused``: a real failure of the store."""

    inline_writes = False

    def __init__(self) -> None:
        super().__init__()
        self.refused: set[Any] = set()

        self.held: Any = None  # (session, gate, reached): its next append waits at the gate

    def append(self, session_id: Any, events: Any, **kw: Any) -> list[int]:
        held = self.held
        if held is not None and held[0] == session_id:
            self.held = None
            held[2].set()  # the writer is here: what is queued now waits behind it
            held[1].wait(10)
        if session_id in self.refused:
            raise SubagentError("refused by the store", code=ErrorCode.PERSISTENCE_UNAVAILABLE)
        return super().append(session_id, events, **kw)


def test_sessions_whose_writes_failed_leave_the_writer_when_they_end(backend: Backend) -> None:
    """R-ERR-1: an outage fails the writes of every session writing then; each
    stops, and none is activated here again (a one-shot child, a disposed
    agent, one resumed elsewhere). The writer kept each one's error for the
    runtime's life (one entry a failed session). Now it forgets it once the
    activation's writes are done; ``flush`` of the session still raises its
    failure (from ``statistics()``), and so does its agent's next follow-up."""
    store = _Refusing()
    with Runtime(store, backend=backend) as rt:
        agents = []
        for _ in range(30):
            agent = rt.spawn("echo")
            agent.followup("x")
            assert agent.wait_idle(10)
            rt.sessions.flush(agent.session_id)
            store.refused.add(agent.session_id)
            agent.followup("lost")  # accepted; its turn's writes fail: the agent stops
            assert agent.wait_disposed(10)
            agents.append(agent)
        rt.sessions.flush()
        assert rt.sessions._writer._failed == {}
        stats = rt.sessions.statistics()
        assert stats.failed_writes == 30 and len(stats.persistence_failures) == 30
        for sid in (agents[0].session_id, agents[-1].session_id):
            with pytest.raises(SubagentError) as info:
                rt.sessions.flush(sid)
            assert info.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
        with pytest.raises(SubagentError) as info:
            agents[-1].followup("again")
        assert info.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
        store.refused.clear()
        again = rt.agents.resume(agents[0].session_id)  # activated again: writes go through
        again.followup("back")
        assert again.wait_idle(10)
        rt.sessions.flush(again.session_id)
        assert len(rt.sessions.statistics().persistence_failures) == 29


def test_a_failure_in_the_batch_that_ends_its_activation_is_forgotten(
    backend: Backend,
) -> None:
    """R-ERR-1, forced: an agent is disposed while its last write waits behind
    another session's (a busy writer), and that write fails in the same batch
    as the end of its activation. The end is carried out after the batch's
    failures are recorded: the writer keeps nothing for it."""
    store = _Refusing()
    with Runtime(store, backend=backend) as rt:
        kept = _kept_at_end(rt)
        agent, other = rt.spawn("echo"), rt.spawn("echo")
        for a in (agent, other):
            a.followup("x")
            assert a.wait_idle(10)
        rt.sessions.flush()
        gate, reached = rt.backend.event(), rt.backend.event()
        store.held = (other.session_id, gate, reached)
        other.followup("slow")  # the writer waits at the gate with its turn's write
        assert reached.wait(10)  # ... before the failing write is queued behind it
        store.refused.add(agent.session_id)
        agent.followup("lost")  # its write queues behind, and will fail
        assert agent.wait_idle(10)
        agent.dispose(flush=False)  # ends while the failing write still waits
        assert kept == {agent.session_id: None}  # (not failed yet)
        gate.set()
        rt.sessions.flush()
        assert rt.sessions._writer._failed == {}
        assert [f.session_id for f in rt.sessions.statistics().persistence_failures] == [
            agent.session_id
        ]


def test_the_failure_table_keeps_the_latest_failed_sessions(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-ERR-1: ``statistics().persistence_failures`` listed every session whose
    writes ever failed and that was not activated here again -- all of them, for
    the runtime's life. Now the latest ``KEPT_FAILURES``; ``failed_writes``
    still counts every one."""
    from subagents.actors._agents import _failures

    monkeypatch.setattr(_failures, "KEPT_FAILURES", 5)
    store = _Refusing()
    with Runtime(store, backend=backend) as rt:
        sids = []
        for _ in range(12):
            agent = rt.spawn("echo")
            store.refused.add(agent.session_id)
            agent.followup("lost")
            assert agent.wait_disposed(10)
            sids.append(agent.session_id)
        stats = rt.sessions.statistics()
        assert stats.failed_writes == 12
        assert [f.session_id for f in stats.persistence_failures] == sids[-5:]
        # Past the listing, flush still says the writes did not land (it is no
        # success of a session whose writes failed): the table remembers more.
        with pytest.raises(SubagentError) as err:
            rt.sessions.flush(sids[0])
        assert err.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE


def test_a_thread_keeps_no_large_packing_buffer() -> None:
    """Every thread (on threads: every agent) kept a msgpack packer with a 256 KiB
    buffer, and after packing a large value kept that size for its whole life
    (a 1 MB output: 2 MB an agent). A thread's packer now starts small and is
    dropped after a large frame."""
    from subagents.protocol import _codec

    sizes: dict[str, Any] = {}

    def work() -> None:
        packb({"small": 1})
        sizes["first"] = _codec._local.packer
        packb({"big": "x" * 1_000_000})
        sizes["after big"] = getattr(_codec._local, "packer", None)

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert sizes["after big"] is None  # dropped, its buffer with it
    assert sizes["first"] is not None
    assert _codec._FIRST_BUFFER <= 4096


def test_a_parent_drained_again_and_again_listens_once(rt: Runtime) -> None:
    """Each drain of the same live parent added a dispose listener to it (its
    cutoff's end), kept until the parent was disposed: one more per drain."""
    parent = rt.spawn("echo")
    for _ in range(20):
        rt.subagents.drain_continuable_descendants([parent])
    assert len(parent._dispose_listeners) <= 2


def test_orphans_said_once_are_forgotten_when_someone_runs_them(
    backend: Backend, tmp_path: Path
) -> None:
    """Two workers on one store, the second without the session's model: an
    orphan its sweep could not adopt was remembered (said once) for good -- one
    more per session -- even after the other worker ran it. Now forgotten then."""
    from subagents.actors._children._remote import wake_orphan

    db = str(tmp_path / "s.db")
    with Runtime(db, backend=backend) as first, Runtime(db, backend=backend) as second:
        first.models.register("mine", lambda _o: lambda turn: turn.content)
        agent = first.spawn("mine")
        sid = agent.session_id
        agent.dispose()
        first.sessions.flush()  # its lease released
        second.sessions.accept(sid, [trusted_message(new_message_id(), "waits", None)])
        said: set[Any] = set()

        def sweep() -> None:
            wake_orphan(
                second.agents, second.sessions, second.subagents._continuation,  # type: ignore[attr-defined]
                sid, everything=True, said=said,
            )  # fmt: skip

        sweep()  # no model "mine" there: said once
        assert said == {sid}
        second.sessions.flush()  # the lease its try took is released
        for _ in range(200):  # (the second's own sweep may be trying it again just now)
            try:
                first.agents.resume(sid)  # the first worker runs it
                break
            except SubagentError as exc:
                assert exc.code == ErrorCode.LEASE_HELD, exc
                backend.sleep(0.05)
        sweep()  # held elsewhere now
        assert said == set()
