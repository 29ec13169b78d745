"""A runtime's long-lived tasks outlive a failed round (R-DUR, L-7, L-8).

Each of a runtime's background tasks is the only one doing its job: the mail
pickup, the lease renewal, the session writer, the keep-warm alarm. An exception
escaping one round of such a task ended it, and the runtime silently stopped
doing that job for the rest of the process's life: leases expired under live
agents, queued writes were never written (their callers waited until a timeout),
keep-warm children never settled, one failing part of a sweep dropped the
others' pickups. Each test injects a failure at the boundary of one round --
the one method the round calls -- and shows the job is still done after it (or,
for a writer batch whose fate is unknown, that its sessions' writes fail with a
typed error instead of hanging their callers).
"""

from __future__ import annotations

from typing import Any

import pytest
from durability_kit import Noted, until
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import LifecycleProbe
from subagents.protocol import (
    ErrorCode,
    MessageEvent,
    SessionId,
    SubagentError,
    new_message_id,
    trusted_message,
)
from subagents.store import MemoryStore, open_store

pytestmark = pytest.mark.timeout(90)

TTL = 1.5  # seconds: a renewal and a sweep every 0.5 s


def _fail_once(real: Any, failed: list[Any], error: BaseException) -> Any:
    """``real``, but its first call raises ``error`` (noted in ``failed``)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if not failed:
            failed.append(args)
            raise error
        return real(*args, **kwargs)

    return call


def _contents(db: str, session: SessionId) -> list[Any]:
    with open_store(db) as store:
        return [r.event.content for r in store.read(session) if isinstance(r.event, MessageEvent)]


def test_the_lease_renewal_outlives_a_failed_round(backend: Backend, db: str) -> None:
    """A renewal round that raises something other than a store's typed error (a
    bug, a driver's untyped error) is logged and the next round renews: the lease
    of a session live here keeps being extended. The renewal task died with it
    before: the runtime's leases expired under its live agents, and other
    processes took its sessions over."""
    with Runtime(db, backend=backend, lease_ttl=TTL) as a:
        held = a.spawn("echo", label="held").session_id
        leases = a.sessions.leases
        assert leases is not None and a.store is not None
        store = leases._store
        failed: list[Any] = []
        store.renew_lease_count = _fail_once(  # type: ignore[method-assign]
            store.renew_lease_count, failed, RuntimeError("injected renewal failure")
        )
        assert until(a, lambda: bool(failed), 10)
        lease = a.store.get_lease(held)
        assert lease is not None
        after = lease.expires

        def renewed() -> bool:
            now = a.store.get_lease(held)  # type: ignore[union-attr]
            return now is not None and now.expires > after

        assert until(a, renewed, 10)


def test_the_mail_sweep_outlives_a_failed_part(backend: Backend, db: str) -> None:
    """A sweep whose orphan query keeps failing still picks up the mail of the
    sessions this runtime holds: a message committed to a held session's inbox,
    ringing nobody, runs here at a sweep. Before, the failing query dropped the
    whole round -- every sweep -- so such mail was never picked up (only a ring,
    outside a sweep round, delivered it)."""
    with Runtime(db, backend=backend, lease_ttl=TTL) as a:
        noted = Noted()
        noted.register(a, "a", model="mark")
        held = a.spawn("mark", label="held").session_id
        assert a.mail is not None and a.store is not None
        sessions = a.mail._sessions
        failed: list[Any] = []

        def orphans(*args: Any, **kwargs: Any) -> Any:
            failed.append(args)
            raise SubagentError("injected orphan query failure", code=ErrorCode.CORRUPT_RECORD)

        sessions.orphans = orphans  # type: ignore[method-assign]
        assert until(a, lambda: bool(failed), 10)  # a sweep failed
        a.store.accept(held, [trusted_message(new_message_id(), "swept", None)])
        assert noted.runs("swept", ["a"], timeout=10)


def test_the_mail_round_outlives_a_failed_pickup(backend: Backend, db: str) -> None:
    """A pickup that raises every time (a bug in what it calls, for one session)
    leaves the other pickups of its round to run: an orphan -- a session nobody
    holds, with a message waiting -- is adopted by a sweep that also finds mail
    waiting for the failing session (looked at first). Before, that failure ended
    each sweep's round, and the orphan's accepted message never ran."""
    with Runtime(db, backend=backend) as made:
        made.models.register("mark", lambda _o: lambda turn: None)
        orphan = made.spawn("mark", label="orphan").session_id  # released at close
    with Runtime(db, backend=backend, lease_ttl=TTL) as a:
        noted = Noted()
        noted.register(a, "a", model="mark")
        poisoned = a.spawn("mark", label="poisoned").session_id
        assert a.mail is not None and a.store is not None
        mail = a.mail
        real, failed = mail.pickup, []

        def pickup(sid: SessionId) -> None:
            if sid == poisoned:
                failed.append(sid)
                raise RuntimeError("injected pickup failure")
            real(sid)

        mail.pickup = pickup  # type: ignore[method-assign]
        a.store.accept(poisoned, [trusted_message(new_message_id(), "poison", None)])
        assert until(a, lambda: bool(failed), 10)  # a sweep met it
        a.store.accept(orphan, [trusted_message(new_message_id(), "adopted", None)])
        assert noted.runs("adopted", ["a"], timeout=10)
        assert noted.ran("poison") == []


def test_the_keep_warm_alarm_outlives_a_failed_fire(backend: Backend) -> None:
    """The keep-warm alarm whose call back raises once (a bug in what it posts to)
    logs it and fires again: a warm child still settles after its delay. Before,
    the alarm's task ended and no keep-warm child of that runtime ever settled."""
    with Runtime(MemoryStore(), backend=backend, keep_warm=0.05) as rt:
        alarm = rt.continuation._alarm
        failed: list[Any] = []
        alarm._fire = _fail_once(alarm._fire, failed, RuntimeError("injected alarm failure"))
        probe = LifecycleProbe(rt)
        root = rt.spawn("echo", label="root")
        cid = rt.subagents.start_continuable(
            ContinuableStartSpec(parent=root, provider="local", prompt="p", label="kid")
        ).child_id
        assert probe.wait_for(lambda evs: len(evs) == 2, timeout=10)  # started, settled
        assert failed
        assert rt.continuation.activation(cid) is None


def test_the_writer_outlives_a_failed_callback(backend: Backend, db: str) -> None:
    """A batch written whose commit callback raises (a bug in what it calls) is
    written all the same, and the writer goes on: later writes of every session
    reach the store and ``flush`` returns. Before, the writer's task ended with the
    batch: nothing more was written by that runtime, and every flush timed out."""
    with Runtime(db, backend=backend) as rt:
        a = rt.spawn("echo", label="a")
        writer = rt.sessions._writer
        assert writer is not None
        failed: list[Any] = []
        writer._on_committed = _fail_once(
            writer._on_committed, failed, RuntimeError("injected callback failure")
        )
        a.followup("one")
        assert a.wait_idle(10)
        rt.sessions.flush(a.session_id, timeout=10)
        assert failed
        a.followup("two")
        assert a.wait_idle(10)
        rt.sessions.flush(a.session_id, timeout=10)
        assert _contents(db, a.session_id) == ["one", "two"]


def test_a_writer_batch_of_unknown_fate_fails_its_sessions(backend: Backend, db: str) -> None:
    """A writer round that raises with its batch half done (its fate unknown) fails
    the batch's sessions as a failed write does -- their flush raises a typed error,
    their agent stops, their next activation starts from the store -- and the
    writer goes on with the other sessions. Before, its task ended: the flush of
    every session timed out, and nothing more was written."""
    with Runtime(db, backend=backend) as rt:
        a = rt.spawn("echo", label="a")
        b = rt.spawn("echo", label="b")
        rt.sessions.flush(a.session_id, timeout=10)
        rt.sessions.flush(b.session_id, timeout=10)
        writer = rt.sessions._writer
        assert writer is not None
        failed: list[Any] = []
        writer._write_ops = _fail_once(  # type: ignore[method-assign]
            writer._write_ops, failed, RuntimeError("injected batch failure")
        )
        a.followup("lost")
        assert a.wait_disposed(10)  # stopped, as after any failed write
        assert failed
        with pytest.raises(SubagentError) as info:
            rt.sessions.flush(a.session_id, timeout=10)
        assert info.value.code == ErrorCode.INTERNAL
        assert "injected batch failure" in str(info.value)
        assert [f.session_id for f in rt.sessions.statistics().persistence_failures] == [
            a.session_id
        ]
        b.followup("fine")
        assert b.wait_idle(10)
        rt.sessions.flush(b.session_id, timeout=10)
        assert _contents(db, b.session_id) == ["fine"]
        again = rt.agents.resume(a.session_id)  # strict: the accepted message runs again
        assert again.wait_idle(10)
        rt.sessions.flush(a.session_id, timeout=10)
        assert _contents(db, a.session_id) == ["lost"]


def test_a_failed_callback_of_a_stopped_session_spares_the_batch(backend: Backend, db: str) -> None:
    """A session stopped by ``Writer.fail`` (a take that could not be recorded) whose
    failure callback raises leaves the other sessions' writes of the same batch
    alone: they are written. Before, the callback's exception escaped the batch,
    which failed every session in it as of unknown fate -- their writes dropped."""
    with Runtime(db, backend=backend) as rt:
        a = rt.spawn("echo", label="a")
        b = rt.spawn("echo", label="b")
        rt.sessions.flush(a.session_id, timeout=10)
        rt.sessions.flush(b.session_id, timeout=10)
        writer = rt.sessions._writer
        assert writer is not None
        failed: list[Any] = []
        writer._on_failed = _fail_once(
            writer._on_failed, failed, RuntimeError("injected callback failure")
        )
        stop = SubagentError("injected take failure", code=ErrorCode.PERSISTENCE_UNAVAILABLE)
        event = trusted_message(new_message_id(), "kept", None)
        # One batch, as the writer's task takes it: the stop of a, then b's append.
        writer._write(
            [(0, "fail", a.session_id, stop), (0, "append", b.session_id, ((event,), None, ()))]
        )
        writer.report()  # as the task does after each batch (callbacks run with no lock held)
        assert failed
        assert b.session_id not in writer._failed
        assert _contents(db, b.session_id) == ["kept"]
