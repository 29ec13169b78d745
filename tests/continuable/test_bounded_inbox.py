"""Bounded mailboxes (issue 18 point 2): ``max_inbox`` per child or per runtime.

A follow-up to a continuable child whose inbox holds ``max_inbox`` messages
accepted and not yet done raises ``INBOX_FULL`` and accepts nothing -- or, with
``wait_for_room``, waits for a place. The count is the store's (every pending
row, whoever accepted it) under strict durability, the agent's own in memory
otherwise. Each test runs on both backends and on three runtimes: a memory
store, SQLite strict, SQLite relaxed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from continuable_kit import Kit, left_full, spawn
from subagents.actors import AbortController, ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, InboxFullError, MessageId, SubagentError
from subagents.store import MemoryStore


@pytest.fixture(params=["memory", "strict", "relaxed"])
def bkit(request: pytest.FixtureRequest, backend: Backend, tmp_path: Path) -> Iterator[Kit]:
    """A kit whose runtime bounds its children's inboxes at 3 by default."""
    if request.param == "memory":
        rt = Runtime(MemoryStore(), backend=backend, max_inbox=3)
    else:
        rt = Runtime(str(tmp_path / "b.db"), backend=backend, max_inbox=3, durability=request.param)
    kit = Kit(rt)
    try:
        yield kit
    finally:
        kit.close()
        rt.close()


def _blocked_child(kit: Kit, gate: str = "g", **fields: Any) -> tuple[Any, Any]:
    """A root and its child, whose first turn (its prompt) is running, held."""
    root = kit.root()
    child_id, _ = kit.start(root, [["block", gate]], label="kid", **fields)
    assert kit.gate(gate).wait_reached(10)
    return root, child_id


def _full(kit: Kit, root: Any, child_id: Any, content: Any = "over", **kw: Any) -> InboxFullError:
    with pytest.raises(InboxFullError) as err:
        kit.rt.subagents.followup(root, child_id, content, **kw)
    assert err.value.code == ErrorCode.INBOX_FULL
    return err.value


def test_a_full_inbox_refuses_a_followup_and_accepts_nothing(bkit: Kit) -> None:
    """Issue 18 point 2: the running prompt and two follow-ups fill an inbox of 3;
    the next follow-up is ``INBOX_FULL`` (limit and count in its hint), nothing
    of it runs or is logged, and once the child ran its inbox a follow-up is
    accepted again. The refused id can be used again later (nothing kept it)."""
    kit = bkit
    root, child_id = _blocked_child(kit)
    sub = kit.rt.subagents
    ok = [sub.followup(root, child_id, f"m{i}") for i in range(2)]
    refused = MessageId("ab" * 16)
    err = _full(kit, root, child_id, "refused", message_id=refused)
    assert (err.limit, err.pending) == (3, 3)
    assert err.hint["session_id"] == str(child_id)
    kit.gate("g").release()
    kit.wait_settled("kid")
    assert kit.started_ids("kid")[1:] == ok
    assert "refused" not in kit.contents("kid")
    again = sub.followup(root, child_id, "later", message_id=refused)
    assert again == refused
    kit.wait_settled("kid")
    assert kit.contents("kid")[-1] == "later"


def test_a_childs_own_bound_wins_and_is_kept_in_its_session(bkit: Kit) -> None:
    """Issue 18 point 2: ``ContinuableStartSpec(max_inbox=n)`` overrides the
    runtime's; the bound is recorded in the child's session header, so it holds
    for the child's later activations (a cold resume reads it back)."""
    kit = bkit
    root, child_id = _blocked_child(kit, max_inbox=1)
    assert kit.live("kid").header.max_inbox == 1
    assert kit.rt.subagents.statistics(child_id).max_inbox == 1
    _full(kit, root, child_id)
    kit.gate("g").release()
    kit.wait_settled("kid")
    assert kit.rt.sessions.header(child_id).max_inbox == 1
    sub = kit.rt.subagents
    sub.followup(root, child_id, [["block", "h"]])  # a cold resume, held in its turn
    assert kit.gate("h").wait_reached(10)
    _full(kit, root, child_id)
    kit.gate("h").release()
    kit.wait_settled("kid")


def test_an_idle_child_is_not_full_of_what_it_ran(bkit: Kit) -> None:
    """Race, 10 rounds: a child bounded at one message runs its prompt; once the
    runtime is idle, a follow-up is accepted -- the turn that ran the prompt
    ended, so it is done, even while its end is still on its way to the store
    (write-behind). It was ``INBOX_FULL`` (pending 1) most rounds on gevent."""
    kit = bkit
    root = kit.root()
    sub = kit.rt.subagents
    for i in range(10):
        child_id, _ = kit.start(root, f"p{i}", label=f"one{i}", max_inbox=1)
        assert kit.rt.wait_idle(10)
        sub.followup(root, child_id, f"next{i}")
        assert kit.rt.wait_idle(10)


def test_bad_bounds_are_refused_before_anything_starts(bkit: Kit, backend: Backend) -> None:
    """Issue 18 point 2: a bound is an int >= 1 or None, on the runtime, the start
    spec and ``wait_for_room`` (a number of seconds >= 0, or None); nothing is
    created for a bad one."""
    for bad in (0, -1, True, 2.5, "3"):
        with pytest.raises(SubagentError) as err:
            Runtime(backend=backend, max_inbox=bad)
        assert err.value.code == ErrorCode.INVALID_ARGUMENT
    kit = bkit
    root = kit.root()
    with pytest.raises(SubagentError) as err:
        kit.rt.subagents.start_continuable(
            ContinuableStartSpec(
                parent=root, provider="local", prompt="p", label="bad", model="cmd", max_inbox=0
            )
        )
    assert err.value.code == ErrorCode.INVALID_ARGUMENT
    assert len(kit.rt.subagents.list_children(root.session_id)) == 0
    child_id, _ = kit.start(root, "hello", label="kid")
    for bad_wait in (-1, "1", True, float("nan")):
        with pytest.raises(SubagentError) as err:
            kit.rt.subagents.followup(root, child_id, "x", wait_for_room=bad_wait)
        assert err.value.code == ErrorCode.INVALID_ARGUMENT


def test_a_producer_waits_for_room_when_asked(bkit: Kit) -> None:
    """Issue 18 point 2, the caller's choice: ``wait_for_room`` seconds -- a
    producer facing a full inbox is accepted once the child makes room; with a
    short wait and no room it is ``INBOX_FULL``; its signal ends the wait
    (``CANCELLED``). Nothing of a refused or cancelled follow-up runs."""
    kit = bkit
    root, child_id = _blocked_child(kit, max_inbox=2)
    sub = kit.rt.subagents
    sub.followup(root, child_id, "second")
    _full(kit, root, child_id, "short", wait_for_room=0.02)
    controller = AbortController()
    cancelled = spawn(
        kit.rt,
        lambda: sub.followup(
            root, child_id, "cancelled", signal=controller.signal, wait_for_room=None
        ),
    )
    waiting = spawn(kit.rt, lambda: sub.followup(root, child_id, "waited", wait_for_room=30))
    controller.abort("enough")
    err = cancelled.error()
    assert isinstance(err, SubagentError) and err.code == ErrorCode.CANCELLED
    assert not waiting.done()
    kit.gate("g").release()
    mid = waiting.result(30)
    kit.wait_settled("kid")
    contents = kit.contents("kid")
    assert contents[1:] == ["second", "waited"]
    assert kit.started_ids("kid")[-1] == mid


def test_concurrent_producers_never_overfill_an_inbox(bkit: Kit) -> None:
    """Issue 18 point 2, the race: 6 producers released together, 3 follow-ups
    each, at a child holding its prompt under a bound of 3 -- exactly 2 are
    accepted, 16 refused, and exactly the accepted ones run, in the order they
    were accepted; 5 rounds."""
    kit = bkit
    sub = kit.rt.subagents
    root = kit.root()
    for rnd in range(5):
        label, gate = f"kid{rnd}", f"g{rnd}"
        child_id, _ = kit.start(root, [["block", gate]], label=label)
        assert kit.gate(gate).wait_reached(10)
        start = kit.rt.backend.event()
        outcomes: list[tuple[str, Any]] = []

        def produce(k: int, cid: Any = child_id, go: Any = start, out: Any = outcomes) -> None:
            assert go.wait(10)
            for i in range(3):
                try:
                    out.append(("ok", sub.followup(root, cid, f"p{k}.{i}")))
                except InboxFullError:
                    out.append(("full", None))

        tasks = [spawn(kit.rt, produce, k) for k in range(6)]
        start.set()
        for task in tasks:
            task.result(30)
        assert Counter(kind for kind, _ in outcomes) == {"ok": 2, "full": 16}
        kit.gate(gate).release()
        kit.wait_settled(label)
        accepted = [mid for kind, mid in outcomes if kind == "ok"]
        assert sorted(kit.started_ids(label)[1:]) == sorted(accepted)
        assert len(kit.contents(label)) == 3


def test_the_count_includes_what_another_runtime_accepted(backend: Backend, tmp_path: Path) -> None:
    """Issue 18 point 2: the count includes the durable inbox -- follow-ups another
    runtime on the same store committed (by the parent's id) take places as
    this runtime's own do, and that runtime is refused by what this one
    accepted; nothing refused runs."""
    db = str(tmp_path / "shared.db")
    with Runtime(db, backend=backend) as a, Runtime(db, backend=backend) as b:
        kit = Kit(a)
        Kit(b)  # the same model on b, which never runs the child
        try:
            root, child_id = _blocked_child(kit, max_inbox=3)
            parent_id = str(root.session_id)
            b.subagents.followup(parent_id, child_id, "from b")
            a.subagents.followup(root, child_id, "from a")
            with pytest.raises(InboxFullError):
                b.subagents.followup(parent_id, child_id, "b refused")
            with pytest.raises(InboxFullError):
                a.subagents.followup(root, child_id, "a refused")
            kit.gate("g").release()
            kit.wait_settled("kid")
            assert sorted(kit.contents("kid")[1:]) == ["from a", "from b"]
        finally:
            kit.close()


def test_quiet_reports_take_no_place_in_a_bounded_inbox(bkit: Kit) -> None:
    """A child bounded at one message whose own children report quietly still
    takes follow-ups: a quiet report waits for the child's next turn, which only a
    follow-up starts, so one counted against the bound blocked the inbox for
    good (``INBOX_FULL``, ``wait_for_room`` timing out). Race, 5 rounds: each
    round's grandchild reports quietly, then the follow-up is accepted and its
    turn sees the report. R-REP-5."""
    kit = bkit
    root = kit.root()
    sub = kit.rt.subagents
    child_id, _ = kit.start(root, "p", label="mid", max_inbox=1)
    for i in range(5):
        hire = [["start", f"g{i}", [["report", "quiet", f"fyi{i}"]]]]
        sub.followup(root, child_id, hire, wait_for_room=10)
        assert kit.rt.wait_idle(10)  # the grandchild ran: its report waits for "mid"
        sub.followup(root, child_id, f"next{i}")  # not INBOX_FULL
        assert kit.rt.wait_idle(10)
        assert f"fyi{i}" in [r.content for r in kit.reports("mid")], i


def test_a_quiet_report_waiting_behind_a_running_turn_takes_no_place(bkit: Kit) -> None:
    """Race, 5 rounds: while a child bounded at two messages runs its turn (one
    place), its own child reports quietly -- queued behind the turn, in memory and
    (strict) in the store. A follow-up still finds a place: it was ``INBOX_FULL``
    (2 of 2) until the turn ended. R-REP-5."""
    kit = bkit
    root = kit.root()
    sub = kit.rt.subagents
    for i in range(5):
        prompt = [["start", f"g{i}", [["report", "quiet", f"fyi{i}"]]], ["block", f"b{i}"]]
        child_id, _ = kit.start(root, prompt, label=f"mid{i}", max_inbox=2)
        assert kit.gate(f"b{i}").wait_reached(10)
        assert kit.script.notes.wait_for(
            lambda items, i=i: any(n[:2] == ("reported", f"g{i}") for n in items)
        )
        sub.followup(root, child_id, f"next{i}")  # not INBOX_FULL
        kit.gate(f"b{i}").release()
        kit.wait_settled(f"mid{i}")
        assert f"fyi{i}" in [r.content for r in kit.reports(f"mid{i}")], i


def test_a_full_inbox_nobody_runs_is_woken_by_a_followup_by_id(
    backend: Backend, tmp_path: Path
) -> None:
    """Strict, after a restart: a child bounded at two messages holds its cut
    prompt and a follow-up in its durable inbox, and nothing is live to run
    them. A follow-up by the parent's id with ``wait_for_room`` used to fail
    ``INBOX_FULL`` for good (the refusal woke nothing, so no place opened); now
    the refusal wakes the tree, the waiting messages run, and it is accepted and
    runs after them. R-FUP-1."""
    db = str(tmp_path / "full.db")
    pid, cid, worker = left_full(db, backend)
    # A sweep (every lease_ttl / 3) would wake it too, in time: not within the wait.
    with Runtime(db, backend=backend, lease_ttl=120) as rt:
        rt.models.register("worker", lambda _o: worker)
        assert len(rt.sessions.pending(cid)) == 2
        rt.subagents.followup(pid, cid, "b", wait_for_room=15)
        assert rt.wait_idle(20)
        outputs = [e.output for e in rt.sessions.turn_ends(cid)]
        assert outputs[-3:] == ["did block", "did a", "did b"], outputs


def _steered_child(kit: Kit, behaviour: Any) -> tuple[Any, Any]:
    """A root and its child (``max_inbox`` 3, the kit's) whose turns run ``behaviour``."""
    kit.rt.models.register("steered", lambda _o: behaviour, replace=True)
    root = kit.root()
    child_id, _ = kit.start(root, "p", label="kid", model="steered")
    return root, child_id


def test_steered_messages_take_places_until_the_turn_that_took_them_ends(bkit: Kit) -> None:
    """Steered messages are accepted and not done until the turn that took them
    ends: they count against the bound like queued ones, under every durability
    (strict counts their pending rows). The prompt running and two messages
    steered in fill an inbox of 3 -- a follow-up is ``INBOX_FULL`` (3 of 3) before
    the turn takes them and after, until that turn ends. Relaxed and memory used
    to count the prompt alone, and accept it. R-FUP-1, R-FUP-6."""
    kit = bkit
    took = kit.gate("took")

    def behaviour(turn: Any) -> Any:
        if turn.content == "p":
            kit.gate("steer").pass_through(turn.signal)
            steered = [m.content for m in turn.steering()]
            took.pass_through(turn.signal)
            return steered
        return turn.content

    root, child_id = _steered_child(kit, behaviour)
    assert kit.gate("steer").wait_reached(10)
    sub = kit.rt.subagents
    outcomes = [sub.followup(root, child_id, f"s{i}", steer=True).outcome for i in (0, 1)]
    assert outcomes == ["steered", "steered"]
    err = _full(kit, root, child_id)
    assert (err.limit, err.pending) == (3, 3)
    kit.gate("steer").release()
    assert took.wait_reached(10)  # the turn took both: not done before it ends
    err = _full(kit, root, child_id)
    assert (err.limit, err.pending) == (3, 3)
    took.release()
    assert kit.rt.wait_idle(10)
    sub.followup(root, child_id, "after")
    kit.wait_settled("kid")
    assert [e.output for e in kit.ends("kid")] == [["s0", "s1"], "after"]


def test_steered_messages_a_turn_never_took_keep_their_places(bkit: Kit) -> None:
    """A turn that ends without taking what was steered into it requeues those
    messages as turns of their own: they keep their places until each of their
    own turns ends (as their pending rows do under strict durability). Prompt
    running + two steered = 3 of 3: ``INBOX_FULL``; the prompt ends, the first
    steered message runs (held): 2 of 3, one follow-up is accepted, the next is
    ``INBOX_FULL`` (3 of 3); all of them run once, in acceptance order.
    R-FUP-5, R-FUP-6."""
    kit = bkit

    def behaviour(turn: Any) -> Any:
        if turn.content == "p":
            kit.gate("p").pass_through(turn.signal)  # no safe point: takes nothing
        elif turn.content == "s0":
            kit.gate("s0").pass_through(turn.signal)
        return turn.content

    root, child_id = _steered_child(kit, behaviour)
    assert kit.gate("p").wait_reached(10)
    sub = kit.rt.subagents
    assert [sub.followup(root, child_id, f"s{i}", steer=True).outcome for i in (0, 1)] == [
        "steered",
        "steered",
    ]
    err = _full(kit, root, child_id)
    assert (err.limit, err.pending) == (3, 3)
    kit.gate("p").release()
    assert kit.gate("s0").wait_reached(10)  # "p" ended; "s0" runs, "s1" waits
    sub.followup(root, child_id, "f")
    err = _full(kit, root, child_id)
    assert (err.limit, err.pending) == (3, 3)
    kit.gate("s0").release()
    kit.wait_settled("kid")
    assert [e.output for e in kit.ends("kid")] == ["p", "s0", "s1", "f"]
    sub.followup(root, child_id, "last")
    kit.wait_settled("kid")


@pytest.mark.parametrize("by", ["parent", "parent id"])
def test_a_relaxed_runtime_counts_what_a_strict_one_left_in_the_inbox(
    backend: Backend, tmp_path: Path, by: str
) -> None:
    """A strict runtime closes with a child bounded at two messages holding its cut
    prompt and a follow-up in its durable inbox (2 of 2). A relaxed runtime on the
    same store resumes the parent and follows the child up: the follow-up that
    cold-resumes it is ``INBOX_FULL`` (2 of 2), accepting nothing -- it used to be
    accepted unchecked, three messages against a bound of two (and the next one
    refused, 3 of 2). The waiting messages still run, once, in order, and then a
    follow-up waiting for room (with the refused one's id) is accepted and runs
    after them.
    R-FUP-1, R-FUP-5, R-FUP-8."""
    db = str(tmp_path / "mixed.db")
    pid, cid, worker = left_full(db, backend)
    # A sweep (every lease_ttl / 3) would run them too, in time: not within the test.
    with Runtime(db, backend=backend, durability="relaxed", lease_ttl=120) as rt:
        rt.models.register("worker", lambda _o: worker)
        assert len(rt.sessions.pending(cid)) == 2
        live = rt.agents.resume(pid)
        target = live if by == "parent" else pid
        refused = MessageId("cd" * 16)
        with pytest.raises(InboxFullError) as err:
            rt.subagents.followup(target, cid, "over", message_id=refused)
        assert (err.value.limit, err.value.pending) == (2, 2)
        # Its id stays unused: the same id is a new acceptance, not a duplicate.
        again = rt.subagents.followup(target, cid, "b", message_id=refused, wait_for_room=15)
        assert again == refused
        assert rt.wait_idle(20)
        rt.sessions.flush()
        outputs = [e.output for e in rt.sessions.turn_ends(cid)]
        assert outputs[-3:] == ["did block", "did a", "did b"], outputs
        assert outputs.count("did a") == 1 and "did over" not in outputs, outputs
        assert rt.sessions.pending(cid) == []
