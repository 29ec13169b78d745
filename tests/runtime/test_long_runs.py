"""What a long-running server must not accumulate (found by a hunt that ran each
workload for thousands of cycles and watched what grew): each test fails on the
code before its fix (checked)."""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path
from typing import Any

from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, SubagentError, new_message_id, packb, trusted_message
from subagents.store import SqliteStore


def test_a_failed_write_keeps_no_frame_of_its_batch(backend: Backend, tmp_path: Path) -> None:
    """A session whose lease another process took over fails its next write
    (``LEASE_LOST``) and is never activated here again: the runtime keeps its
    error for good, and kept with it the traceback's frames -- the failed batch
    and every event in it (about 20 KB a session). Now the error alone."""
    db = str(tmp_path / "s.db")
    with Runtime(db, backend=backend, durability="relaxed") as rt, SqliteStore(db) as other:
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
            error = rt.sessions._writer._failed.get(agent.session_id)
            assert error is not None and error.code == ErrorCode.LEASE_LOST
            chain: list[BaseException | None] = [error]
            while chain:
                exc = chain.pop()
                if exc is not None:
                    assert exc.__traceback__ is None, exc
                    chain += [exc.__cause__, exc.__context__]


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
