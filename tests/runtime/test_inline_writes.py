"""Inline writes to a store that declares ``inline_writes`` (the in-memory store):
synchronous, in order, no writer task, and a failing write is reported, never lost
silently and never followed by later writes (no holes in the log).

R-CONT-2 (acceptance never waits for *persistence*: a store that can block keeps
the write-behind writer, see ``tests/continuable``), R-RES-3 (a failing flush is
logged and reported, it never fails the agent).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import (
    ErrorCode,
    Event,
    MessageEvent,
    SessionHeader,
    SessionId,
    SubagentError,
    TurnEnd,
    new_message_id,
    new_session_id,
)
from subagents.store import MemoryStore


class FailingAppends(MemoryStore):
    """Appends fail once ``fail`` is set (inline_writes stays True)."""

    def __init__(self) -> None:
        super().__init__()
        self.fail = False
        self.appends = 0

    def append(self, session_id: SessionId | str, events: Sequence[Event], **kw: Any) -> list[int]:
        self.appends += 1
        if self.fail:
            raise SubagentError("disk on fire", code=ErrorCode.INTERNAL)
        return super().append(session_id, events, **kw)


def test_memory_store_is_written_inline_without_a_writer_task(backend: Backend) -> None:
    """Every turn's events are in the store when the turn ends (no flush needed),
    in log order, and no session-writer thread or task was ever started."""
    store = MemoryStore()
    assert MemoryStore.inline_writes and not MemoryStore.blocking
    with Runtime(store, backend=backend) as rt:
        agent = rt.spawn(lambda t: f"re: {t.content}")
        for i in range(50):
            agent.followup(i)
        assert agent.wait_idle(10)
        records = store.read(agent.session_id)
        assert [r.seq for r in records] == list(range(len(records)))
        contents = [r.event.content for r in records if isinstance(r.event, MessageEvent)]
        assert contents == list(range(50))
        outputs = [r.event.output for r in records if isinstance(r.event, TurnEnd)]
        assert outputs == [f"re: {i}" for i in range(50)]
        assert rt.sessions._writer is not None and rt.sessions._writer._task is None
        assert not [t for t in threading.enumerate() if t.name.startswith("subagents-session")]


def test_a_failing_inline_write_is_reported_and_stops_later_writes(backend: Backend) -> None:
    """Issue 19 point 2: the agent whose write failed stops (its next follow-up is
    ``PERSISTENCE_UNAVAILABLE`` with the cause, ``statistics()`` lists it); ``flush``
    of the session raises INTERNAL with the cause; no later event of that session is
    written (the log has no hole); another agent goes on."""
    store = FailingAppends()
    with Runtime(store, backend=backend) as rt:
        agent = rt.spawn(lambda t: "done")
        other = rt.spawn(lambda t: "fine")
        agent.followup("first")
        assert agent.wait_idle(10)
        good = len(store.read(agent.session_id))
        store.fail = True
        agent.followup("second")
        assert agent.wait_disposed(10)
        tried = store.appends
        store.fail = False
        with pytest.raises(SubagentError) as info:
            agent.followup("third")
        assert info.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
        assert "disk on fire" in str(info.value)
        assert store.appends == tried  # nothing more was attempted after the failure
        assert len(store.read(agent.session_id)) == good
        with pytest.raises(SubagentError) as info:
            rt.sessions.flush(agent.session_id)
        assert info.value.code == ErrorCode.INTERNAL and "disk on fire" in str(info.value)
        (failure,) = rt.sessions.statistics().persistence_failures
        assert failure.session_id == agent.session_id and "disk on fire" in failure.message
        other.followup("go on")
        assert other.wait_idle(10)
        assert sum(isinstance(r.event, TurnEnd) for r in store.read(other.session_id)) == 1


def test_a_running_turns_start_is_live_at_once_and_stored_with_its_end(backend: Backend) -> None:
    """While a turn runs, runtime reads (the live tail) already show its
    ``turn/start`` and message; the inline store gets them with ``turn/end`` in one
    write, or earlier on ``flush``; seqs stay gapless and in order either way."""
    store = FailingAppends()
    with Runtime(store, backend=backend) as rt:
        inside = rt.backend.event()
        release = rt.backend.event()

        def behaviour(turn: object) -> str:
            inside.set()
            assert release.wait(10)
            return "out"

        agent = rt.spawn(behaviour)
        sid = agent.session_id
        agent.followup("one")
        assert inside.wait(10)
        live = [type(r.event).__name__ for r in rt.sessions.read(sid)]
        assert live[-2:] == ["TurnStart", "MessageEvent"]
        assert [type(r.event).__name__ for r in store.read(sid)] == live[:-2]
        before = store.appends
        rt.sessions.flush(sid)  # writes the deferred events now
        assert store.appends == before + 1
        assert [type(r.event).__name__ for r in store.read(sid)] == live
        release.set()
        assert agent.wait_idle(10)
        stored = store.read(sid)
        assert [r.seq for r in stored] == list(range(len(stored)))
        assert [type(r.event).__name__ for r in stored][-3:] == [
            "TurnStart",
            "MessageEvent",
            "TurnEnd",
        ]
        assert [r.event for r in stored] == [r.event for r in rt.sessions.read(sid)]


def test_the_owned_appender_keeps_the_store_checks_that_matter() -> None:
    """The inline writer's append skips only argument checks: an unknown session
    is SESSION_NOT_FOUND and a closed store STORE_CLOSED, as from ``append``; a
    subclass that overrides ``append`` gets its own ``append`` called."""
    store = MemoryStore()
    header = SessionHeader(
        id=new_session_id(),
        parent_session=None,
        origin="user",
        delegation_depth=0,
        created_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    )
    store.create_session(header)
    owned = store._owned_appender()
    event = MessageEvent(message_id=new_message_id(), content="x")
    owned(header.id, [event])
    assert [r.event for r in store.read(header.id)] == [event]
    with pytest.raises(SubagentError) as info:
        owned(new_session_id(), [event])
    assert info.value.code == ErrorCode.SESSION_NOT_FOUND
    store.close()
    with pytest.raises(SubagentError) as info:
        owned(header.id, [event])
    assert info.value.code == ErrorCode.STORE_CLOSED
    hooked = FailingAppends()
    assert hooked._owned_appender() == hooked.append


def _header() -> SessionHeader:
    return SessionHeader(
        id=new_session_id(),
        parent_session=None,
        origin="user",
        delegation_depth=0,
        created_at=dt.datetime(2026, 1, 1, tzinfo=dt.UTC),
    )


def _appends_racing_readers() -> None:
    store = MemoryStore()
    headers = [_header() for _ in range(8)]
    for header in headers:
        store.create_session(header)
    owned = store._owned_appender()
    events = {
        h.id: [MessageEvent(message_id=new_message_id(), content=i) for i in range(200)]
        for h in headers
    }
    start = threading.Barrier(len(headers) + 1)
    done = threading.Event()
    prefixes_ok: list[bool] = []

    def write(sid: SessionId) -> None:
        start.wait()
        for event in events[sid]:
            owned(sid, [event])

    def read() -> None:
        start.wait()
        while not done.is_set():
            for h in headers:
                got = [r.event for r in store.read(h.id)]
                prefixes_ok.append(got == events[h.id][: len(got)])
            store.get_projections("subagent")

    threads = [threading.Thread(target=write, args=(h.id,)) for h in headers]
    reader = threading.Thread(target=read)
    for t in [*threads, reader]:
        t.start()
    for t in threads:
        t.join()
    done.set()
    reader.join()
    assert all(prefixes_ok)
    for h in headers:
        assert [r.event for r in store.read(h.id)] == events[h.id]


@pytest.mark.usefixtures("tiny_switch_interval")
def test_owned_appends_from_many_threads_lose_nothing() -> None:
    """About OS threads (the owned append takes no store lock on its common path):
    eight threads append to their own sessions while a ninth reads and lists the
    store; every log ends complete and in order, every read sees a prefix."""
    for _ in range(20):
        _appends_racing_readers()


def _appends_racing_delete_and_close() -> None:
    store = MemoryStore()
    doomed, kept = _header(), _header()
    store.create_session(doomed)
    store.create_session(kept)
    owned = store._owned_appender()
    start = threading.Barrier(3)
    codes: set[ErrorCode] = set()
    unexpected: list[BaseException] = []

    def write(sid: SessionId) -> None:
        start.wait()
        for i in range(300):
            try:
                owned(sid, [MessageEvent(message_id=new_message_id(), content=i)])
            except SubagentError as exc:
                codes.add(exc.code)
            except BaseException as exc:  # pragma: no cover - the failure reported
                unexpected.append(exc)

    def destroy() -> None:
        start.wait()
        store.delete_session(doomed.id)
        assert store.header(doomed.id) is None
        store.close()

    threads = [
        threading.Thread(target=write, args=(doomed.id,)),
        threading.Thread(target=write, args=(kept.id,)),
        threading.Thread(target=destroy),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not unexpected
    assert codes <= {ErrorCode.SESSION_NOT_FOUND, ErrorCode.STORE_CLOSED}
    with pytest.raises(SubagentError) as info:
        store.read(kept.id)
    assert info.value.code == ErrorCode.STORE_CLOSED


@pytest.mark.usefixtures("tiny_switch_interval")
def test_owned_appends_racing_close_and_delete_fail_only_with_their_codes() -> None:
    """About OS threads: appends racing ``delete_session`` and ``close`` either land
    (as if just before them) or raise SESSION_NOT_FOUND / STORE_CLOSED, nothing
    else; a deleted session stays deleted and a closed store stays unreadable."""
    for _ in range(50):
        _appends_racing_delete_and_close()


class _DurableMemory(MemoryStore):
    """An inline-written store that says it is durable (as a user's may)."""

    durable = True


def test_a_run_whose_last_message_is_not_its_to_run_stores_the_turns_before_it(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of queued turns stores its turns at its end, before the agent can be
    seen idle -- also when its last message was not its to run (taken already by
    another delivery of it), a turn that writes nothing itself."""
    from subagents.actors._agents._loop import TurnRunner
    from subagents.actors._agents._messages import UNTAKEN
    from subagents.actors.testing import Gate

    real_run = TurnRunner.run_turn

    def run_turn(self: Any, d: Any, unrun: Any = None, later: bool = False) -> None:
        if d.content == "last":
            d.redelivered = UNTAKEN  # as a message committed to the durable inbox, untaken
        real_run(self, d, unrun, later)

    def take(self: Any, d: Any) -> bool:
        d.redelivered = False
        return False  # taken already (the pickup delivered it too)

    monkeypatch.setattr(TurnRunner, "run_turn", run_turn)
    monkeypatch.setattr(TurnRunner, "_take", take)
    store = _DurableMemory()
    with Runtime(store, backend=backend, durability="relaxed") as rt:
        gate = Gate("first")
        rt.models.register(
            "g",
            lambda _o: lambda turn: gate.pass_through(None) if turn.content == "first" else None,
        )
        agent = rt.spawn("g")
        agent.followup("first")
        assert gate.wait_reached(30)
        for i in range(5):
            agent.followup(i)
        agent.followup("last")  # queued behind them: one run takes them all
        gate.release()
        assert agent.wait_idle(30)
        stored = [r for r in store.read(agent.session_id) if isinstance(r.event, TurnEnd)]
        live = [r for r in rt.sessions.read(agent.session_id) if isinstance(r.event, TurnEnd)]
        assert len(stored) == len(live) == 6
