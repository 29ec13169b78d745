"""The durable inbox and leases (``store/_durable.py``), one contract for every store.

L-7, L-8: a session's accepted messages are kept until the turn that ran them
ended, deduplicated by id, and a session has at most one lease, taken by
compare-and-swap; a write fenced by a lease its writer no longer holds writes
nothing.
"""

from __future__ import annotations

import datetime as dt
import sqlite3
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from conftest import MakeEvents, MakeHeader
from subagents.protocol import (
    CorruptRecordError,
    ErrorCode,
    MessageEvent,
    MessageId,
    ReportEvent,
    SessionHeader,
    SessionId,
    SubagentError,
    TurnEnd,
    TurnStart,
    encode_event,
    new_message_id,
    new_session_id,
)
from subagents.store import Accepted, Lease, LogRecord, SessionStore, SqliteStore

NOW = 1_000.0


def _code(exc: pytest.ExceptionInfo[SubagentError]) -> str:
    return exc.value.code


# -- the inbox ----------------------------------------------------------------------


def test_accept_queues_in_order_and_deduplicates(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    h = make_header()
    store.create_session(h)
    first, second = make_events(2, "a"), make_events(1, "b")
    assert [(a.n, a.duplicate) for a in store.accept(h.id, first, now=NOW)] == [
        (1, False),
        (2, False),
    ]
    again = store.accept(h.id, [*first[1:], *second], now=NOW)
    assert [(a.n, a.duplicate) for a in again] == [(2, True), (3, False)]
    # A new entry's run: the places its transaction filled in one go, a repeat none.
    assert [a.run for a in again] == [None, (3, 3)]
    pending = store.pending(h.id)
    assert [(e.n, e.event, e.epoch) for e in pending] == [
        (1, first[0], None),
        (2, first[1], None),
        (3, second[0], None),
    ]
    assert [e.message_id for e in pending] == [e.message_id for e in (*first, *second)]
    third = store.accept(h.id, make_events(2, "c"), now=NOW)
    assert [a.run for a in third] == [(4, 5), (4, 5)]


def test_a_turn_end_completes_its_messages_atomically(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """``append(..., done=ids)`` logs the turn and takes its messages off the inbox in
    one write; ``complete`` does the second half alone; unknown ids are ignored."""
    h = make_header()
    store.create_session(h)
    messages = make_events(3)
    store.accept(h.id, messages, epoch=4)
    store.append(h.id, [TurnStart(turn=0, at=_at())], done=[messages[0].message_id])
    assert [e.n for e in store.pending(h.id)] == [2, 3]
    store.complete(h.id, [messages[2].message_id, new_message_id()])
    assert [(e.n, e.epoch) for e in store.pending(h.id)] == [(2, 4)]
    assert store.last_seq(h.id) == 0
    # A done message is still remembered: accepting it again queues nothing.
    assert store.accept(h.id, messages[:1])[0].duplicate
    assert [e.n for e in store.pending(h.id)] == [2]


def test_retract_and_hand_over(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    h = make_header()
    store.create_session(h)
    a, b, c = make_events(3)
    store.accept(h.id, [a, b])
    store.accept(h.id, [c], epoch=1)
    # Only what nobody took, by compare-and-swap: b, not c.
    assert store.hand_over(h.id, [c.message_id, b.message_id], 2) == [b.message_id]
    assert store.hand_over(h.id, [b.message_id], 3) == []
    assert store.retract(h.id, a.message_id)  # not taken yet: gone
    assert not store.retract(h.id, a.message_id)
    assert not store.retract(h.id, b.message_id)  # handed over: stays
    assert not store.retract(h.id, c.message_id)  # taken by epoch 1
    assert store.retract(h.id, c.message_id, epoch=1)  # ... which takes it back
    assert [(e.event, e.epoch) for e in store.pending(h.id)] == [(b, 2)]


def test_a_retraction_leaves_what_another_acceptance_answered_for(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """Two callers accept one id (two workers, a client's retry): the first
    inserted it, the second was told "accepted" (a duplicate). The first caller's
    retraction, with its own acceptance time, then leaves it: it stays accepted
    (it deleted it, and the second caller's message was lost). Its own entry,
    answered for by nobody, it still takes back."""
    h = make_header()
    store.create_session(h)
    a, b = make_events(2)
    (first,) = store.accept(h.id, [a], now=100.0)
    assert first.at == 100.0 and not first.duplicate
    (again,) = store.accept(h.id, [a], now=101.0)
    assert again.duplicate
    assert not store.retract(h.id, a.message_id, accepted_at=first.at)
    assert [e.event for e in store.pending(h.id)] == [a]
    (own,) = store.accept(h.id, [b], now=102.0)
    assert store.retract(h.id, b.message_id, accepted_at=own.at)
    assert [e.event for e in store.pending(h.id)] == [a]


def test_a_withdrawal_leaves_a_created_session_answered_for_taken_or_run(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """``withdraw`` deletes a session created with a message in its inbox, in one
    transaction, only while that message is pending, untaken and unanswered;
    ``answer`` (a start that found the session made) moves it on, so the creator's
    withdrawal leaves it. A withdrawn session answers ``SESSION_NOT_FOUND``."""
    for case in ("alone", "answered", "taken", "done"):
        h = make_header()
        (prompt,) = make_events(1, case)
        store.create_session(h, [], inbox=[prompt])
        if case == "answered":
            assert store.answer(h.id, prompt.message_id)
        elif case == "taken":
            assert store.hand_over(h.id, [prompt.message_id], 1) == [prompt.message_id]
        elif case == "done":
            store.complete(h.id, [prompt.message_id])
            assert not store.answer(h.id, prompt.message_id)  # nothing pending to answer
        assert store.withdraw(h.id, prompt.message_id) == (case == "alone"), case
        if case == "alone":
            assert store.header(h.id) is None
            assert not store.withdraw(h.id, prompt.message_id)  # unknown: False
            with pytest.raises(SubagentError) as err:
                store.answer(h.id, prompt.message_id)
            assert _code(err) == ErrorCode.SESSION_NOT_FOUND
        else:
            assert store.header(h.id) == h, case
    other = make_header()
    store.create_session(other)
    (later,) = make_events(1, "later")
    store.accept(other.id, [later], now=NOW)  # accepted, not created with the session
    assert not store.withdraw(other.id, later.message_id)
    assert [e.event for e in store.pending(other.id)] == [later]


def _withdraw_and_answer(store: SessionStore, sid: SessionId, mid: MessageId) -> dict[str, Any]:
    """A withdrawal and an answer of one entry, let go at once in two threads."""
    gate = threading.Barrier(2)
    out: dict[str, Any] = {}

    def withdraw() -> None:
        gate.wait()
        out["withdrawn"] = store.withdraw(sid, mid)

    def answer() -> None:
        gate.wait()
        try:
            out["answered"] = store.answer(sid, mid)
        except SubagentError as exc:
            out["answered"] = exc.code

    threads = [threading.Thread(target=withdraw), threading.Thread(target=answer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    return out


def test_an_answer_racing_a_withdrawal_never_answers_for_a_deleted_session(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """Race, 60 rounds: a creator withdraws while another caller answers. Exactly
    one wins: the withdrawal (the answer then finds no session) or the answer (the
    session stays, its message pending)."""
    for i in range(60):
        h = make_header()
        (prompt,) = make_events(1, f"r{i}")
        store.create_session(h, [], inbox=[prompt])
        out = _withdraw_and_answer(store, h.id, prompt.message_id)
        if out["withdrawn"]:
            assert out["answered"] == ErrorCode.SESSION_NOT_FOUND, (i, out)
            assert store.header(h.id) is None
        else:
            assert out["answered"] is True, (i, out)
            assert [e.event for e in store.pending(h.id)] == [prompt]


def test_find_accepted_and_prune(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    one, two = make_header(), make_header()
    store.create_session(one)
    store.create_session(two)
    (shared,) = make_events(1)
    store.accept(one.id, [shared], now=10.0)
    store.accept(two.id, [shared], now=30.0)
    assert sorted(store.find_accepted(shared.message_id)) == sorted([(one.id, 1), (two.id, 1)])
    assert store.prune_inbox(100.0) == 0  # nothing done yet
    store.complete(one.id, [shared.message_id])
    store.complete(two.id, [shared.message_id])
    assert store.prune_inbox(20.0) == 1  # done and accepted before 20
    assert store.find_accepted(shared.message_id) == [(two.id, 1)]
    assert not store.accept(one.id, [shared])[0].duplicate  # forgotten: accepted anew


def test_reports_are_inbox_messages_and_nothing_else_is(
    store: SessionStore, make_header: MakeHeader
) -> None:
    h = make_header()
    store.create_session(h)
    report = ReportEvent(message_id=new_message_id(), content="r", delivery="waking")
    store.accept(h.id, [report])
    assert store.pending(h.id)[0].event == report
    with pytest.raises(SubagentError) as err:
        store.accept(h.id, [TurnStart(turn=0, at=_at())])  # type: ignore[list-item]
    assert _code(err) == ErrorCode.INVALID_ARGUMENT


def test_created_with_a_lease_and_a_prompt(store: SessionStore, make_header: MakeHeader) -> None:
    """A session made with its first lease (epoch 1) and its prompt handed to that
    epoch, in one write."""
    h = make_header()
    prompt = MessageEvent(message_id=new_message_id(), content="go")
    store.create_session(h, lease=("me", NOW + 30, "wake-me"), inbox=[prompt])
    lease = store.get_lease(h.id)
    assert lease == Lease(h.id, "me", 1, NOW + 30, "wake-me")
    assert [(e.event, e.epoch) for e in store.pending(h.id)] == [(prompt, 1)]


def test_unknown_sessions_bad_arguments_and_a_closed_store(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    ghost = new_session_id()
    for call in (
        lambda: store.accept(ghost, make_events(1)),
        lambda: store.pending(ghost),
        lambda: store.acquire_lease(ghost, "me", now=NOW, expires=NOW + 1),
    ):
        with pytest.raises(SubagentError) as err:
            call()
        assert _code(err) == ErrorCode.SESSION_NOT_FOUND
    h = make_header()
    store.create_session(h)
    for call in (
        lambda: store.accept(h.id, make_events(1), now=float("nan")),
        lambda: store.accept(h.id, make_events(1), lease=("me", "1")),  # type: ignore[arg-type]
        lambda: store.complete(h.id, "not a list"),  # type: ignore[arg-type]
        lambda: store.acquire_lease(h.id, "", now=NOW, expires=NOW),
        lambda: store.acquire_lease(h.id, "me", now=NOW, expires=float("inf")),
        lambda: store.create_session(make_header(), lease=("me", NOW)),  # type: ignore[arg-type]
    ):
        with pytest.raises(SubagentError) as err:
            call()
        assert _code(err) == ErrorCode.INVALID_ARGUMENT
    store.close()
    for call in (
        lambda: store.pending(h.id),
        lambda: store.get_lease(h.id),
        lambda: store.renew_leases("me", NOW),
        lambda: store.renew_lease_count("me", NOW),
        lambda: store.find_accepted(new_message_id()),
    ):
        with pytest.raises(SubagentError) as err:
            call()
        assert _code(err) == ErrorCode.STORE_CLOSED


# -- leases -------------------------------------------------------------------------


def test_a_lease_is_taken_by_compare_and_swap(store: SessionStore, make_header: MakeHeader) -> None:
    h = make_header()
    store.create_session(h)
    assert store.get_lease(h.id) is None
    a = store.acquire_lease(h.id, "a", now=NOW, expires=NOW + 10, wake="wa")
    assert (a.holder, a.epoch, a.expires, a.wake) == ("a", 1, NOW + 10, "wa")
    with pytest.raises(SubagentError) as err:
        store.acquire_lease(h.id, "b", now=NOW + 5, expires=NOW + 15)
    assert _code(err) == ErrorCode.LEASE_HELD
    assert err.value.hint == {"holder": "a", "expires": NOW + 10, "wake": "wa"}
    again = store.acquire_lease(h.id, "a", now=NOW + 5, expires=NOW + 20)
    assert again.epoch == 2  # every acquisition is a new epoch, the same holder's too
    b = store.acquire_lease(h.id, "b", now=NOW + 20, expires=NOW + 30)  # expired: taken
    assert (b.holder, b.epoch) == ("b", 3)
    c = store.acquire_lease(h.id, "c", now=NOW + 21, expires=NOW + 31, dead=lambda w: w == "b")
    assert (c.holder, c.epoch) == ("c", 4)  # a holder known to be gone
    assert not store.release_lease(h.id, ("b", 3))  # not b's any more
    assert store.release_lease(h.id, ("c", 4))
    free = store.get_lease(h.id)
    assert free is not None and free.holder is None and free.epoch == 4
    d = store.acquire_lease(h.id, "d", now=NOW + 22, expires=NOW + 32)
    assert d.epoch == 5


def test_unrun_messages_go_back_to_nobody(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """``give_back`` and ``release_lease(unrun=)`` undo only the named epoch's own
    mark on messages not done (so an unrun message is not replayed as a
    redelivery); a failed release (not the holder) changes nothing."""
    h = make_header()
    store.create_session(h)
    lease = store.acquire_lease(h.id, "a", now=NOW, expires=NOW + 10)
    ran, unrun, routed, other = make_events(4)
    store.accept(h.id, [ran, unrun, routed], epoch=lease.epoch, lease=lease.token())
    store.accept(h.id, [other], epoch=7)
    store.complete(h.id, [ran.message_id], lease=lease.token())
    assert store.give_back(h.id, [routed.message_id, other.message_id], lease.epoch) == 1
    assert store.give_back(h.id, [ran.message_id], lease.epoch) == 0  # done: left alone
    assert not store.release_lease(h.id, ("b", lease.epoch), unrun=[unrun.message_id])
    assert [e.epoch for e in store.pending(h.id)] == [lease.epoch, None, 7]
    assert store.release_lease(h.id, lease.token(), unrun=[unrun.message_id, other.message_id])
    assert [(e.event, e.epoch) for e in store.pending(h.id)] == [
        (unrun, None),
        (routed, None),
        (other, 7),
    ]
    assert store.write_many([("release", h.id, lease.token(), [])]) == [False]


def test_waiting_names_a_holders_sessions_with_untaken_messages(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """What a holder's mail pickup reads: its leased sessions whose inbox holds a
    message no activation took; not another holder's, not a taken or done one."""
    mine, taken, theirs, free = (make_header() for _ in range(4))
    for h in (mine, taken, theirs, free):
        store.create_session(h)
    for h, holder in ((mine, "me"), (taken, "me"), (theirs, "them")):
        store.acquire_lease(h.id, holder, now=NOW, expires=NOW + 10)
    for h in (mine, taken, theirs, free):
        store.accept(h.id, make_events(1))
    (done,) = make_events(1)
    store.accept(mine.id, [done])
    store.complete(mine.id, [done.message_id])
    store.hand_over(taken.id, [e.message_id for e in store.pending(taken.id)], 1)
    assert store.waiting("me") == [mine.id]
    assert store.waiting("them") == [theirs.id]
    assert store.waiting("nobody") == []


def test_orphans_are_sessions_with_work_and_no_live_lease(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """Issue 13 point 4: what a sweep adopts -- a session with a message not done
    (taken by a dead epoch or by nobody) whose lease is absent, released or
    expired; never one a live lease covers, nor one whose work is done."""
    never, released, expired, held, done, idle = (make_header() for _ in range(6))
    for h in (never, released, expired, held, done, idle):
        store.create_session(h)
    gone = store.acquire_lease(released.id, "me", now=NOW, expires=NOW + 10)
    store.release_lease(released.id, gone.token())
    store.acquire_lease(expired.id, "dead", now=NOW - 20, expires=NOW - 10)
    store.acquire_lease(held.id, "alive", now=NOW, expires=NOW + 10)
    for h in (never, released, expired, held, done):
        store.accept(h.id, make_events(1))
    store.hand_over(expired.id, [e.message_id for e in store.pending(expired.id)], 1)
    store.complete(done.id, [e.message_id for e in store.pending(done.id)])
    assert set(store.orphans(NOW)) == {never.id, released.id, expired.id}
    assert set(store.orphans(NOW + 10)) == {never.id, released.id, expired.id, held.id}
    with pytest.raises(SubagentError) as err:
        store.orphans("now")  # type: ignore[arg-type]
    assert err.value.code == ErrorCode.INVALID_ARGUMENT


def test_renewal_extends_only_the_holders_leases(
    store: SessionStore, make_header: MakeHeader
) -> None:
    mine, theirs, released = make_header(), make_header(), make_header()
    for h in (mine, theirs, released):
        store.create_session(h)
    store.acquire_lease(mine.id, "me", now=NOW, expires=NOW + 1)
    store.acquire_lease(theirs.id, "them", now=NOW, expires=NOW + 1)
    gone = store.acquire_lease(released.id, "me", now=NOW, expires=NOW + 1)
    store.release_lease(released.id, gone.token())
    assert store.renew_leases("me", NOW + 50) == [mine.id]
    renewed = store.get_lease(mine.id)
    other = store.get_lease(theirs.id)
    assert renewed is not None and renewed.expires == NOW + 50 and renewed.epoch == 1
    assert other is not None and other.expires == NOW + 1
    # The count of the same renewal: the holder's leases alone, each extended.
    assert store.renew_lease_count("me", NOW + 60) == 1
    assert store.renew_lease_count("nobody", NOW + 60) == 0
    again = store.get_lease(mine.id)
    other = store.get_lease(theirs.id)
    assert again is not None and again.expires == NOW + 60 and again.epoch == 1
    assert other is not None and other.expires == NOW + 1


def test_a_stale_lease_writes_nothing(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """Fencing: after another holder took the session over, every write carrying the
    old token is ``LEASE_LOST`` and leaves the log and the inbox as they were."""
    h = make_header()
    store.create_session(h)
    old = store.acquire_lease(h.id, "old", now=NOW, expires=NOW + 1)
    messages = make_events(2)
    store.accept(h.id, messages[:1], lease=old.token())
    store.append(h.id, messages[:1], lease=old.token())
    new = store.acquire_lease(h.id, "new", now=NOW + 2, expires=NOW + 12)
    for call in (
        lambda: store.append(h.id, messages[1:], lease=old.token()),
        lambda: store.accept(h.id, messages[1:], lease=old.token()),
        lambda: store.complete(h.id, [messages[0].message_id], lease=old.token()),
        lambda: store.hand_over(h.id, [messages[0].message_id], 9, lease=old.token()),
    ):
        with pytest.raises(SubagentError) as err:
            call()
        assert _code(err) == ErrorCode.LEASE_LOST
    assert store.read(h.id) == [LogRecord(0, messages[0])]
    assert [e.event for e in store.pending(h.id)] == messages[:1]
    store.append(h.id, messages[1:], lease=new.token(), done=[messages[0].message_id])
    assert store.last_seq(h.id) == 1 and store.pending(h.id) == []


def test_a_stale_lease_writes_no_checkpoint(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """Fencing covers checkpoints: a holder that lost its lease could otherwise store
    a checkpoint folded from events it never got to write (the new holder wrote its
    own at those seqs), and the next resume would start from that state. Refused
    alone and in a batch (``write_many``), where it does not fail the others."""
    h = make_header()
    store.create_session(h, make_events(3))
    old = store.acquire_lease(h.id, "old", now=NOW, expires=NOW + 1)
    store.put_checkpoint(h.id, 1, b"old's", lease=old.token())
    new = store.acquire_lease(h.id, "new", now=NOW + 2, expires=NOW + 12)
    with pytest.raises(SubagentError) as err:
        store.put_checkpoint(h.id, 2, b"stale", lease=old.token())
    assert _code(err) == ErrorCode.LEASE_LOST
    stale, fresh = store.write_many(
        [
            ("checkpoint", h.id, 2, b"stale", old.token()),
            ("projection", h.id, "unit", 2, b"derived"),
        ]
    )
    assert isinstance(stale, SubagentError) and stale.code == ErrorCode.LEASE_LOST
    assert fresh is None
    assert store.get_checkpoint(h.id) == (1, b"old's")
    assert store.write_many([("checkpoint", h.id, 2, b"new's", new.token())]) == [None]
    assert store.get_checkpoint(h.id) == (2, b"new's")
    store.put_checkpoint(h.id, 0, b"unfenced")  # no token: a store without leases' use
    assert store.get_checkpoint(h.id) == (0, b"unfenced")


def test_racing_acquisitions_have_one_winner(
    store: SessionStore, make_header: MakeHeader, threads: object
) -> None:
    """Eight holders race for one free lease, 20 rounds: exactly one wins each round,
    and its epoch is the only one that can still write."""
    h = make_header()
    store.create_session(h)
    for round_ in range(20):
        winners: list[Lease] = []
        lock = threading.Lock()
        now = NOW + round_ * 100

        def grab(
            i: int,
            now: float = now,
            lock: threading.Lock = lock,
            winners: list[Lease] = winners,
        ) -> None:
            try:
                lease = store.acquire_lease(h.id, f"h{i}", now=now, expires=now + 50)
            except SubagentError as exc:
                assert exc.code == ErrorCode.LEASE_HELD
                return
            with lock:
                winners.append(lease)

        threads([lambda i=i: grab(i) for i in range(8)])  # type: ignore[operator]
        assert len(winners) == 1, winners
        assert store.get_lease(h.id) == winners[0]


# -- SQLite: durable, shared by processes --------------------------------------------


def test_the_inbox_and_leases_survive_a_reopen(
    tmp_path: Path, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    path = tmp_path / "q.db"
    h = make_header()
    messages = make_events(2)
    with SqliteStore(path) as store:
        store.create_session(h, lease=("me", NOW + 10, None), inbox=messages[:1])
        store.accept(h.id, messages[1:], now=NOW)
    with SqliteStore(path) as again:
        assert [(e.event, e.epoch) for e in again.pending(h.id)] == [
            (messages[0], 1),
            (messages[1], None),
        ]
        assert again.get_lease(h.id) == Lease(h.id, "me", 1, NOW + 10, None)
        with pytest.raises(SubagentError) as err:
            again.acquire_lease(h.id, "you", now=NOW, expires=NOW + 20)
        assert _code(err) == ErrorCode.LEASE_HELD


def test_two_stores_on_one_file_share_one_lease(
    tmp_path: Path, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """Two stores on one file (two processes' view of it): the second sees the first's
    lease, and once it took the session over, the first's fenced writes are refused
    -- also the acceptances whose lease check the first had kept from its earlier
    transactions (kept only while no other connection commits)."""
    path = tmp_path / "shared.db"
    h = make_header()
    with SqliteStore(path) as one, SqliteStore(path) as two:
        one.create_session(h)
        first = one.acquire_lease(h.id, "one", now=NOW, expires=NOW + 1)
        one.accept(h.id, make_events(1), epoch=first.epoch, lease=first.token())
        one.accept(h.id, make_events(1), epoch=first.epoch, lease=first.token())
        with pytest.raises(SubagentError) as err:
            two.acquire_lease(h.id, "two", now=NOW, expires=NOW + 10)
        assert _code(err) == ErrorCode.LEASE_HELD
        taken = two.acquire_lease(h.id, "two", now=NOW + 2, expires=NOW + 12)
        assert taken.epoch == 2
        with pytest.raises(SubagentError) as err:
            one.append(h.id, make_events(1), lease=first.token())
        assert _code(err) == ErrorCode.LEASE_LOST
        with pytest.raises(SubagentError) as err:
            one.accept(h.id, make_events(1), epoch=first.epoch, lease=first.token())
        assert _code(err) == ErrorCode.LEASE_LOST
        two.append(h.id, make_events(1), lease=taken.token())
        assert one.last_seq(h.id) == 0


def test_a_corrupt_inbox_row_is_named(tmp_path: Path, make_header: MakeHeader) -> None:
    path = tmp_path / "c.db"
    h = make_header()
    with SqliteStore(path) as store:
        store.create_session(h)
        store.accept(h.id, [MessageEvent(message_id=new_message_id(), content="x")])
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("UPDATE inbox SET body = x'c1'")
        conn.close()
        with pytest.raises(CorruptRecordError) as err:
            store.pending(h.id)
        assert err.value.code == ErrorCode.CORRUPT_RECORD and "inbox entry 1" in str(err.value)


def _four_messages(store: SessionStore, h: SessionHeader) -> list[MessageId]:
    """Create ``h``'s session and accept four messages (contents 0-3); their ids."""
    store.create_session(h)
    ids = [new_message_id() for _ in range(4)]
    store.accept(h.id, [MessageEvent(message_id=i, content=k) for k, i in enumerate(ids)])
    return ids


def test_a_corrupt_inbox_row_can_be_skipped_and_named(
    tmp_path: Path, make_header: MakeHeader
) -> None:
    """With ``damaged=[]`` a row that does not decode -- garbage, or an event that is
    not a message -- is skipped and its place named; the rows around it are read,
    and the damaged rows stay in the store untouched."""
    path = tmp_path / "c.db"
    h = make_header()
    with SqliteStore(path) as store:
        ids = _four_messages(store, h)
        not_a_message = encode_event(TurnEnd(turn=0, at=_at(), stop_reason="completed"))
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("UPDATE inbox SET body = x'c1' WHERE n = 2")
        conn.execute("UPDATE inbox SET body = ? WHERE n = 3", (not_a_message,))
        conn.close()
        damaged: list[int] = []
        entries = store.pending(h.id, damaged=damaged)
        assert [(e.n, e.message_id) for e in entries] == [(1, ids[0]), (4, ids[3])]
        assert damaged == [2, 3]
        with pytest.raises(CorruptRecordError):
            store.pending(h.id)  # still there, still named without damaged=
        other = make_header()
        store.create_session(other, inbox=[MessageEvent(message_id=new_message_id(), content=1)])
        places: dict[SessionId, list[int]] = {}
        many = store.pending_many([h.id, other.id], damaged=places)
        assert many == {h.id: entries, other.id: store.pending(other.id)}
        assert places == {h.id: [2, 3]}  # a session with no damage has no list
        with pytest.raises(CorruptRecordError) as err:
            store.pending_many([other.id, h.id])
        assert err.value.session_id == h.id


def test_deleting_a_session_deletes_its_inbox_and_lease(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    h = make_header()
    store.create_session(h, lease=("me", NOW, None), inbox=make_events(1))
    store.delete_session(h.id)
    store.create_session(h)
    assert store.pending(h.id) == [] and store.get_lease(h.id) is None


def _at() -> dt.datetime:
    return dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_concurrent_acceptances_with_shared_ids_accept_each_id_once(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """Issue 13 points 1 and 3: acceptances that share a commit (the SQLite store
    writes a run of them for one session in one insert) still accept every id
    once -- a repeat, in the same batch or after it, is a duplicate naming the
    original's ``n`` -- and the inbox holds each id once, in ``n`` order. Many
    rounds of 8 racing threads."""
    for _ in range(20):
        h = make_header()
        store.create_session(h)
        pool = make_events(12)
        store.accept(h.id, pool[:2])  # accepted before the race
        results = _race_acceptances(store, h.id, pool)
        pending = store.pending(h.id)
        by_id = {e.message_id: e.n for e in pending}
        assert len(by_id) == len(pending)
        assert [e.n for e in pending] == sorted(e.n for e in pending)
        fresh = Counter(mid for mid, a in results if not a.duplicate)
        assert all(count == 1 for count in fresh.values())
        for mid, accepted in results:
            assert by_id[mid] == accepted.n
        assert set(by_id) == {pool[i].message_id for i in range(2)} | {m for m, _ in results}


def _race_acceptances(
    store: SessionStore, sid: Any, pool: list[MessageEvent]
) -> list[tuple[MessageId, Any]]:
    """8 threads released together, each accepting 4 of ``pool`` (overlapping)."""
    results: list[tuple[MessageId, Any]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def worker(k: int) -> None:
        mine = [pool[(k + i) % len(pool)] for i in range(0, 12, 3)]
        barrier.wait()
        for event in mine:
            (accepted,) = store.accept(sid, [event])
            with lock:
                results.append((event.message_id, accepted))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_a_run_of_acceptances_in_one_insert_reports_each_like_alone(
    sqlite_store: SqliteStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """The SQLite store's merged insert (a run of acceptances for one session and
    lease in one batch): fresh ids numbered in order with no place left empty (a
    duplicate in the run left one before), an id accepted before or earlier in the
    same run a duplicate with the original's ``n``; a run whose lease is stale
    fails as a whole, writing nothing."""
    from subagents.store._committed import encode_messages
    from subagents.store._queue_txn import AcceptOp

    h = make_header()
    sqlite_store.create_session(h)
    lease = sqlite_store.acquire_lease(h.id, "me", now=NOW, expires=NOW + 10)
    a, b, c, d = make_events(4)
    (first,) = sqlite_store.accept(h.id, [a], lease=lease.token())
    ops = [
        AcceptOp(h.id, encode_messages(events), None, NOW, lease.token())
        for events in ([b, c], [a], [c, d])
    ]
    requests = sqlite_store._committer.submit_many(ops)  # one batch, one insert
    assert [r.outcome() for r in requests] == [
        [Accepted(first.n + 1, False), Accepted(first.n + 2, False)],
        [Accepted(first.n, True)],
        [Accepted(first.n + 2, True), Accepted(first.n + 3, False)],
    ]
    run = (first.n + 1, first.n + 3)  # the statement's new entries, whoever asked
    assert [[a.run for a in r.outcome()] for r in requests] == [[run, run], [None], [None, run]]
    e, f, g = make_events(3)
    joined = [AcceptOp(h.id, encode_messages(x), None, NOW, lease.token()) for x in ([e, f], [g])]
    whole = (first.n + 4, first.n + 6)
    outcomes = [r.outcome() for r in sqlite_store._committer.submit_many(joined)]
    assert [[(a.n, a.run) for a in o] for o in outcomes] == [
        [(first.n + 4, whole), (first.n + 5, whole)],
        [(first.n + 6, whole)],
    ]
    pending = sqlite_store.pending(h.id)
    assert [e.message_id for e in pending] == [e.message_id for e in (a, b, c, d, e, f, g)]
    assert [e.n for e in pending] == list(range(first.n, first.n + 7))  # gapless
    stale = [AcceptOp(h.id, encode_messages([e]), None, NOW, ("me", 99)) for e in make_events(2)]
    for request in sqlite_store._committer.submit_many(stale):
        with pytest.raises(SubagentError) as err:
            request.outcome()
        assert err.value.code == ErrorCode.LEASE_LOST
    assert len(sqlite_store.pending(h.id)) == 7


# -- a bounded inbox (issue 18 point 2) ----------------------------------------------


def test_a_bounded_acceptance_counts_every_pending_message(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """``accept(..., limit=n)``: the messages not yet done (handed to an activation
    or to nobody, waking reports too) and the new ones must fit ``n``, else ``INBOX_FULL``
    and nothing of the call is accepted; repeats of accepted ids take no room and
    are still answered as duplicates; a done message frees its place."""
    h = make_header()
    store.create_session(h)
    first = make_events(2)
    store.accept(h.id, first[:1], epoch=3)  # handed to activation 3
    store.accept(h.id, first[1:])  # taken by nobody
    report = ReportEvent(message_id=new_message_id(), content="r", delivery="waking")
    store.accept(h.id, [report])
    a, b = make_events(2)
    with pytest.raises(SubagentError) as err:
        store.accept(h.id, [a], limit=3)
    assert _code(err) == ErrorCode.INBOX_FULL
    assert err.value.hint["pending"] == 3 and err.value.hint["limit"] == 3
    assert len(store.pending(h.id)) == 3
    # Two new ids where one place is left: neither is accepted.
    with pytest.raises(SubagentError) as err:
        store.accept(h.id, [a, b], limit=4)
    assert _code(err) == ErrorCode.INBOX_FULL
    assert [e.message_id for e in store.pending(h.id)] == [
        first[0].message_id,
        first[1].message_id,
        report.message_id,
    ]
    # Repeats take no room: a full inbox still answers them as duplicates.
    assert store.accept(h.id, first, limit=3) == [Accepted(1, True), Accepted(2, True)]
    assert store.accept(h.id, [a, a], limit=4) == [Accepted(4, False), Accepted(4, True)]
    store.complete(h.id, [first[0].message_id, first[1].message_id])
    assert [x.duplicate for x in store.accept(h.id, [b], limit=3)] == [False]
    for bad in (0, -1, True, 2.0, "3"):
        with pytest.raises(SubagentError) as err:
            store.accept(h.id, make_events(1), limit=bad)
        assert _code(err) == ErrorCode.INVALID_ARGUMENT
    assert len(store.pending(h.id)) == 3


def test_quiet_reports_take_no_place_in_a_bounded_inbox(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """A quiet report waits for a turn that only a message starts: counted, a
    child full of them could never be sent that message. The bound counts
    messages and waking reports, not quiet reports (``pending`` in the refusal
    says the same); a quiet report is still pending and still accepted."""
    h = make_header()
    store.create_session(h)
    quiet = [
        ReportEvent(message_id=new_message_id(), content={"n": i}, delivery="quiet")
        for i in range(3)
    ]
    store.accept(h.id, quiet)
    (first,) = make_events(1)
    assert [x.duplicate for x in store.accept(h.id, [first], limit=1)] == [False]
    waking = ReportEvent(message_id=new_message_id(), content="w", delivery="waking")
    store.accept(h.id, [waking])
    (over,) = make_events(1)
    with pytest.raises(SubagentError) as err:
        store.accept(h.id, [over], limit=2)
    assert _code(err) == ErrorCode.INBOX_FULL
    assert err.value.hint["pending"] == 2
    assert len(store.pending(h.id)) == 5
    store.accept(h.id, [over], limit=3)


def test_racing_bounded_acceptances_never_overfill_the_inbox(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """The bound is decided in the acceptance's own transaction: 8 threads
    released together, each accepting 3 fresh messages one by one with
    ``limit=5`` while 1 is pending, accept exactly 4 between them, every other
    call ``INBOX_FULL``; 20 rounds."""
    for _ in range(20):
        h = make_header()
        store.create_session(h)
        store.accept(h.id, make_events(1))
        outcomes = _race_bounded(store, h.id, [make_events(3) for _ in range(8)])
        assert Counter(outcomes) == {"accepted": 4, ErrorCode.INBOX_FULL: 20}
        assert len(store.pending(h.id)) == 5


def _race_bounded(store: SessionStore, sid: Any, batches: list[list[MessageEvent]]) -> list[str]:
    """One thread per batch, released together, accepting its events one by one
    with ``limit=5``: each call's outcome."""
    outcomes: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(len(batches))

    def worker(events: list[MessageEvent]) -> None:
        barrier.wait()
        for event in events:
            try:
                store.accept(sid, [event], limit=5)
                outcome = "accepted"
            except SubagentError as exc:
                outcome = exc.code
            with lock:
                outcomes.append(outcome)

    threads = [threading.Thread(target=worker, args=(b,)) for b in batches]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return outcomes


def test_a_give_back_after_the_lease_moved_on_gives_it_to_the_new_holder(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """R-DUR-* (L-7, L-8): activation 1 took a message and stalled; its lease expired
    and activation 2 took the session over, reading the message as taken by 1 (a
    redelivery it replays). Activation 1's ``give_back`` of it, late (its agent was
    disposed as it handed a report over), gives it to activation 2, not to nobody:
    untaken, activation 2's mail pickup (or a follow-up's take-ahead) took it a
    second time and queued it again -- a crash soak saw a quiet report twice in
    one parent turn. (An activation 2 that reads the inbox after the give-back
    finds it its own: not a redelivery, and not to be taken.) Given back while
    nobody took the lease since (released, epoch unchanged), it goes back."""
    h = make_header()
    store.create_session(h)
    first = store.acquire_lease(h.id, "a", now=NOW, expires=NOW + 10)
    taken, released = make_events(2)
    store.accept(h.id, [taken], epoch=first.epoch, lease=first.token())
    second = store.acquire_lease(h.id, "b", now=NOW + 20, expires=NOW + 30)
    assert second.epoch == first.epoch + 1
    assert [(e.event, e.epoch) for e in store.pending(h.id)] == [(taken, first.epoch)]
    assert store.give_back(h.id, [taken.message_id], first.epoch) == 0
    assert [(e.event, e.epoch) for e in store.pending(h.id)] == [(taken, second.epoch)]
    assert store.hand_over(h.id, [taken.message_id], second.epoch) == []
    store.accept(h.id, [released], epoch=second.epoch, lease=second.token())
    assert store.release_lease(h.id, second.token())
    assert store.give_back(h.id, [released.message_id], second.epoch) == 1
    assert store.pending(h.id)[-1].epoch is None


def test_a_retraction_after_the_lease_moved_on_leaves_the_message(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """R-DUR-* (L-7, L-8): activation 1 committed a message taken by itself, and its
    delivery failed; before it takes the message back, its lease lapsed and
    activation 2 took the session over, replaying the message (a redelivery). The
    retraction by epoch 1 must leave it (the caller is told it stays accepted): it
    deleted the row, the caller was told nothing was accepted, and activation 2
    ran the message all the same (an untaken one too: the new activation takes it).
    A caller that held no lease, and an epoch nobody took the lease after, still
    take theirs back."""
    h = make_header()
    store.create_session(h)
    first = store.acquire_lease(h.id, "a", now=NOW, expires=NOW + 10)
    taken, untaken, own = make_events(3)
    store.accept(h.id, [taken], epoch=first.epoch, lease=first.token())
    store.accept(h.id, [untaken])
    second = store.acquire_lease(h.id, "b", now=NOW + 20, expires=NOW + 30)
    assert not store.retract(h.id, taken.message_id, epoch=first.epoch)
    assert not store.retract(h.id, untaken.message_id, epoch=first.epoch)
    assert store.retract(h.id, untaken.message_id)
    assert [(e.event, e.epoch) for e in store.pending(h.id)] == [(taken, first.epoch)]
    (accepted,) = store.accept(h.id, [own], epoch=second.epoch, lease=second.token())
    assert store.retract(h.id, own.message_id, epoch=second.epoch, accepted_at=accepted.at)


def test_untaken_lists_what_nobody_took_past_a_place(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """``untaken(session, after)``: the pending messages no activation took, at places
    past ``after``, in order -- not those taken, done, or at ``after`` and before
    (what a live activation's follow-up takes ahead of its own, R-FUP-5). Unknown
    sessions and a bad ``after`` are refused as ``pending`` refuses them."""
    h = make_header()
    store.create_session(h)
    a, b, c, d, e, f = make_events(6)
    store.accept(h.id, [a, b])  # 1, 2
    store.accept(h.id, [c], epoch=1)  # 3: taken at its acceptance
    store.accept(h.id, [d, e, f])  # 4, 5, 6
    store.hand_over(h.id, [e.message_id], 1)  # 5: taken
    store.complete(h.id, [d.message_id])  # 4: done
    assert [(x.n, x.event) for x in store.untaken(h.id)] == [(1, a), (2, b), (6, f)]
    assert [x.n for x in store.untaken(h.id, 1)] == [2, 6]
    assert [x.n for x in store.untaken(h.id, 2)] == [6]
    assert store.untaken(h.id, 6) == []
    assert all(x.epoch is None for x in store.untaken(h.id))
    with pytest.raises(SubagentError) as unknown:
        store.untaken(new_session_id())
    assert unknown.value.code == ErrorCode.SESSION_NOT_FOUND
    for bad in ("1", 1.5, None):
        with pytest.raises(SubagentError) as refused:
            store.untaken(h.id, bad)  # type: ignore[arg-type]
        assert refused.value.code == ErrorCode.INVALID_ARGUMENT


def test_untaken_skips_and_names_a_corrupt_row(tmp_path: Path, make_header: MakeHeader) -> None:
    """As ``pending``: a row that does not decode raises, or with ``damaged=[]`` is
    skipped and its place named; a damaged row already taken is not read at all."""
    path = tmp_path / "c.db"
    h = make_header()
    with SqliteStore(path) as store:
        ids = _four_messages(store, h)
        store.hand_over(h.id, [ids[0]], 1)
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute("UPDATE inbox SET body = x'c1' WHERE n IN (1, 3)")
        conn.close()
        damaged: list[int] = []
        entries = store.untaken(h.id, damaged=damaged)
        assert [(x.n, x.message_id) for x in entries] == [(2, ids[1]), (4, ids[3])]
        assert damaged == [3]
        with pytest.raises(CorruptRecordError):
            store.untaken(h.id)
        assert [x.n for x in store.untaken(h.id, 3)] == [4]
