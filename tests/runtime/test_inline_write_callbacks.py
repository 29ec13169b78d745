"""A failed inline write stops its agent with no lock held: the stop runs the
running turn's abort listeners -- behaviour code -- which may write to or read the
very session whose write failed.

The in-memory store is written inline, by the appending caller, under the
session's lock (``LiveSession._lock``, a plain non-reentrant lock). Its failure
callback stopped the agent right there, so an abort listener that appended to the
session (``turn.expect``) or read it (``turn.history``) waited for a lock its own
thread held: the interrupt that made the write never returned, on either backend.

R-INT-7 (an admitted interrupt returns promptly), R-INT-8 (it aborts the running
turn's signal), and the durability contract of a failed write (its agent stops,
nothing of that session is written after it, ``statistics()`` lists it:
``docs/durability.md``).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from listening_child import listening_child
from subagents.actors import Runtime, UserAuthority
from subagents.actors._agents._messages import Deliver
from subagents.actors._agents._sessions import SessionService
from subagents.actors._kernel._backend import Backend
from subagents.protocol import (
    ErrorCode,
    ExpectedEvent,
    MessageEvent,
    SessionHeader,
    SubagentError,
    TurnRecord,
    new_message_id,
    new_session_id,
)
from subagents.store import MemoryStore


def _listen(rt: Runtime, parent: Any, turn: Any, heard: list[Any]) -> Any:
    """The abort listener: promise a message (an append to this session), read the
    session's history (the live lock, then the store), and follow it up as its
    parent would; each outcome noted in ``heard``."""

    def listener(_reason: Any) -> None:
        try:
            turn.expect(new_message_id(), "stand-in")
            heard.append("expected")
        except SubagentError as exc:
            heard.append(("expect refused", exc.code))
        try:
            heard.append(("history", len(turn.history)))
        except SubagentError as exc:  # (its store has no such session any more)
            heard.append(("history refused", exc.code))
        try:
            rt.subagents.followup(parent, turn.agent.session_id, "after")
            heard.append("followed up")
        except SubagentError as exc:
            heard.append(("followup refused", exc.code))

    return listener


@pytest.mark.parametrize("how", ["interrupt", "flush"])
def test_an_abort_listener_may_touch_the_session_whose_inline_write_failed(
    backend: Backend, how: str
) -> None:
    """A continuable child's turn runs with an abort listener; its session is
    deleted from the shared in-memory store (as another holder of the store
    would), so the next inline write of it -- an interrupt's log entry, or a
    flush of its deferred turn start -- fails ``SESSION_NOT_FOUND``. The agent
    stops as after any failed write; the listener's append, read and follow-up
    each return (accepted or refused with a code); the interrupt or flush
    returns; nothing of the session reaches the store after the failure."""
    store = MemoryStore()
    heard: list[Any] = []
    with Runtime(store, backend=backend) as rt:
        parent, child, agent = listening_child(
            rt, store, lambda turn, parent: _listen(rt, parent, turn, heard)
        )
        if how == "interrupt":
            rt.subagents.interrupt(child, UserAuthority(parent.session_id))
        else:
            with pytest.raises(SubagentError) as info:
                rt.sessions.flush(child)
            assert info.value.code == ErrorCode.SESSION_NOT_FOUND
        assert agent.wait_disposed(30)
        assert rt.agents.get(child) is None
        (failure,) = rt.sessions.statistics().persistence_failures
        assert failure.session_id == child and failure.code == ErrorCode.SESSION_NOT_FOUND
        # The listener ran to its end, each step answered.
        assert heard[0] == "expected" or heard[0][0] == "expect refused"
        assert heard[1] == ("history refused", ErrorCode.SESSION_NOT_FOUND)
        assert heard[2] == "followed up" or heard[2][0] == "followup refused"
        assert len(heard) == 3
        # No later write of that session landed (no hole in its log: none at all).
        with pytest.raises(SubagentError) as info:
            store.read(child)
        assert info.value.code == ErrorCode.SESSION_NOT_FOUND
        # The runtime goes on: the parent still runs turns.
        parent.followup("still here")
        assert parent.wait_idle(30)


def test_an_expect_from_the_abort_listener_is_kept_out_of_the_store(backend: Backend) -> None:
    """The same failure with the store otherwise healthy: another session, written
    after, is stored; the failed session's promise made by the listener (accepted
    into the live log) never reaches the store."""
    store = MemoryStore()
    promised: list[str] = []
    with Runtime(store, backend=backend) as rt:

        def listener_for(turn: Any, _parent: Any) -> Any:
            def listener(_reason: Any) -> None:
                mid = new_message_id()
                turn.expect(mid, "stand-in")
                promised.append(mid)

            return listener

        parent, child, agent = listening_child(rt, store, listener_for)
        rt.subagents.interrupt(child, UserAuthority(parent.session_id))
        assert agent.wait_disposed(30)
        assert len(promised) == 1
        other = rt.spawn("echo")
        other.followup("x")
        assert other.wait_idle(30)
        rt.sessions.flush(other.session_id)
        assert store.read(other.session_id)
        stored = [
            r.event
            for sid in (parent.session_id, other.session_id)
            for r in store.read(sid)
            if isinstance(r.event, ExpectedEvent)
        ]
        assert stored == []


def test_every_inline_writes_failure_calls_back_with_no_lock_held(backend: Backend) -> None:
    """The session service's own paths on the in-memory store: a failed ``create``
    (the id is the store's already), a failed append (``flush`` of deferred events,
    an append, a turn's end) and a failed checkpoint each call the failure back
    once the writer's lock and the session's are both free -- the callback may
    write again (here: to another session) -- and once per session; nothing of a
    failed session is written after its failure."""
    store = MemoryStore()
    calls: list[tuple[Any, bool, bool]] = []
    lives: dict[Any, Any] = {}

    def lost(sid: Any) -> None:
        writer = service._writer
        assert writer is not None
        free = writer._lock.acquire(blocking=False)
        if free:
            writer._lock.release()
        live = lives.get(sid)
        mine = live is None or live._lock.acquire(blocking=False)
        if live is not None and mine:
            live._lock.release()
        calls.append((sid, free, mine))
        service.append(spare, [MessageEvent(message_id=new_message_id(), content="on")])

    service = SessionService(store, backend, lost=lost)
    try:
        spare = service.open(_header())
        taken = _header()
        store.create_session(taken)
        service.open(taken)  # SESSION_EXISTS in the store: its create fails
        assert calls == [(taken.id, True, True)]
        ids = []
        for how in ("flush", "append", "end", "checkpoint"):
            live = service.open(_header())
            lives[live.id] = live
            ids.append(live.id)
            event = MessageEvent(message_id=new_message_id(), content=how)
            service.append(live, [event], defer=True)
            store.delete_session(live.id)
            if how == "flush":
                with pytest.raises(SubagentError):
                    service.flush(live.id)
            elif how == "append":
                service.append(live, [event])
            elif how == "end":
                go = Deliver(0, new_message_id(), "go", None, "message", (), None)
                record = TurnRecord(0, _AT, go)
                service.begin_turn(live, record)
                record.end = ("completed", "out", None, None, None, None)
                service.end_turn(live, record, ())
            else:
                service.checkpoint(live, {"x": 1})
            service.append(live, [event])  # dropped: its writes stopped at the failure
        assert calls[1:] == [(sid, True, True) for sid in ids]
        assert sum(isinstance(r.event, MessageEvent) for r in store.read(spare.id)) == 5
    finally:
        service.close()


_AT = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def _header() -> SessionHeader:
    return SessionHeader(
        id=new_session_id(), parent_session=None, origin="user", delegation_depth=0, created_at=_AT
    )


def test_an_inline_writers_other_callbacks_run_with_its_lock_released(backend: Backend) -> None:
    """R-DUR-3: an inline writer (the in-memory store) writes in its caller, under
    the writer's lock. A release that finds messages nobody took (``WAITING``)
    calls back (the runtime's pickup) -- from under that lock, so a callback that
    wrote again, or waited on a thread that did, waited for ever. The callback here
    has another thread write through the same writer and waits for it; it runs once
    the releasing caller let go of the lock, and the other write goes through."""
    import threading
    import time

    from subagents.actors._agents._writer import Writer

    store = MemoryStore()
    header = SessionHeader(
        id=new_session_id(),
        parent_session=None,
        origin="user",
        delegation_depth=0,
        created_at=dt.datetime.now(dt.UTC),
        label="waiting",
    )
    store.create_session(header)
    now = time.time()
    lease = store.acquire_lease(header.id, "holder", now=now, expires=now + 60)
    store.accept(header.id, [MessageEvent(message_id=new_message_id(), content="x")], now=now)
    seen: list[Any] = []
    others: list[threading.Thread] = []

    def waiting(sid: Any) -> None:
        other = threading.Thread(target=lambda: writer.submit("ended", sid, None))
        others.append(other)
        other.start()
        other.join(5)  # (a bound for the old code, where it never returned)
        seen.append((sid, "written" if not other.is_alive() else "stuck"))

    writer = Writer(store, backend, lambda *_: None, lambda *_: None, waiting)
    assert writer.inline
    writer.submit("release", header.id, (lease.token(), ()))
    for other in others:
        other.join()
    assert seen == [(header.id, "written")]
    writer.close()
