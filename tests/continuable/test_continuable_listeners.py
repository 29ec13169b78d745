"""User code runs outside admission and release (R-EVT-5, R-EVT-6, R-SETUP-1).

Lifecycle listeners, setup contributions and their releases are user code. None
of them runs inside the registry or the supervisor actor or under a lock of the
runtime, so one that blocks or raises cannot stall the admission of other
children: here each blocks (on a gate) or raises, and meanwhile other children are
started, followed up, cold-resumed and settled.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from continuable_kit import Kit, spawn
from subagents.actors import SubagentEvent
from subagents.protocol import SessionId


def _busy_elsewhere(kit: Kit, label: str) -> None:
    """Admission of an unrelated child goes on: start, settle, cold-resume, settle."""
    rt = kit.rt
    other = kit.root(f"other-{label}")
    cid, _ = kit.start(other, "hi", label=label)
    kit.wait_settled(label, epochs=1)
    rt.subagents.followup(other, cid, "again")
    kit.wait_settled(label, epochs=2)
    assert kit.contents(label) == ["hi", "again"]


def test_a_blocking_end_listener_stalls_no_admission(kit: Kit) -> None:
    """A ``subagent/end`` listener that blocks holds up later announcements only:
    children keep being admitted, resumed and settled (their ends are announced
    once it returns, in order)."""
    rt = kit.rt
    stuck = kit.gate("listener")
    blocked = threading.Event()

    def listener(event: SubagentEvent) -> None:
        if event.type == "subagent/end" and not blocked.is_set():
            blocked.set()
            stuck.pass_through(None)

    rt.subagents.subscribe(listener)
    root = kit.root()
    # Started and announced before it may settle: its end goes to the dispatcher.
    kit.start(root, [["block", "first"]], label="first")
    kit.gate("first").release()
    assert stuck.wait_reached(10)  # the dispatcher is inside our listener
    other = kit.root("other")
    cid, _ = kit.start(other, [["note", "ran"]], label="second")
    assert kit.script.notes.has("note", "second", "ran")
    assert rt.wait_idle(10)
    kit.barrier_without_dispatcher()
    assert rt.continuation.activation(cid) is None  # settled, its end not yet announced
    rt.subagents.followup(other, cid, "again")  # cold resume while the listener blocks
    assert kit.script.notes.has("turn", "second", "again")
    stuck.release()
    kit.wait_settled("first", epochs=1)
    kit.wait_settled("second", epochs=2)
    # The resumed epoch's start waited for the previous epoch's end (R-EVT-2).
    assert [e.type for e in kit.events_of("second")] == ["subagent/start", "subagent/end"] * 2


@pytest.mark.parametrize("rounds", [8])
def test_an_end_listener_that_resumes_its_child_hears_the_next_start_after(
    kit: Kit, rounds: int
) -> None:
    """R-EVT-2, L-11: a ``subagent/end`` listener follows its child up, which
    cold-resumes it while that very end is still being announced. The next epoch's
    start is announced after the end (not inside it, and without waiting on it),
    every round; the listener's own call returns."""
    rt = kit.rt
    root = kit.root()
    order: list[tuple[str, str]] = []
    sent: list[str] = []
    lock = threading.Lock()

    def listener(event: SubagentEvent) -> None:
        with lock:
            order.append((event.type, event.run_id))
            again = event.type == "subagent/end" and len(sent) < rounds
            if again:
                sent.append(f"again-{len(sent)}")
                text = sent[-1]
        if again:
            rt.subagents.followup(root, SessionId(event.child_id), text)
            with lock:
                order.append(("followup-returned", text))

    rt.subagents.subscribe(listener, scope=root)
    kit.start(root, "hi", label="kid")
    kit.wait_settled("kid", epochs=rounds + 1)
    kinds = [kind for kind, _ in order if kind.startswith("subagent/")]
    assert kinds == ["subagent/start", "subagent/end"] * (rounds + 1)
    # Each start comes only once the end that resumed it, and its listeners, returned.
    for i, (kind, _) in enumerate(order):
        if kind == "subagent/start" and i > 0:
            assert order[i - 1][0] == "followup-returned", order
    assert kit.contents("kid") == ["hi", *sent]


def test_a_start_behind_an_end_still_announced_waits_though_its_own_epoch_ended(
    kit: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-EVT-2, forced interleaving: an end listener follows its child up (a cold
    resume, published from inside the listener); the new epoch runs and settles
    -- its own end queued -- before the listener's call announces its start. The
    start still waits for the end being announced (posted behind it): the new
    epoch's end must not hide the old one's. (Under load the new epoch may settle
    before its publisher reaches the start at all: its end was then posted first.)"""
    from subagents.actors._children._announce import Announcer
    from subagents.actors._kernel._gate import Latch

    rt = kit.rt
    root = kit.root()
    late = kit.gate("late-start")
    ended = Latch()
    order: list[str] = []
    published: list[Any] = []
    start = Announcer.start
    hooks = rt.continuation._hooks
    post_end = hooks._announce

    posted: list[Any] = []

    def start_late(self: Any, act: Any) -> None:
        if order and not published:  # the resumed epoch's, from inside the listener
            published.append(act)
            if any(a is act for a in posted):  # it settled before its publisher got here
                ended.set()
            late.pass_through(None)
        start(self, act)

    def post_end_seen(act: Any) -> None:
        post_end(act)
        posted.append(act)
        if published and act is published[0]:
            ended.set()

    def listener(event: SubagentEvent) -> None:
        order.append(event.type)
        if event.type == "subagent/end" and order.count("subagent/end") == 1:
            spawn(rt, lambda: (late.wait_reached(10), ended.wait(10), late.release()))
            rt.subagents.followup(root, SessionId(event.child_id), "again")
            order.append("followup-returned")

    monkeypatch.setattr(Announcer, "start", start_late)
    monkeypatch.setattr(hooks, "_announce", post_end_seen)
    rt.subagents.subscribe(listener, scope=root)
    kit.start(root, "hi", label="kid")
    kit.wait_settled("kid", epochs=2)
    assert ended.is_set()
    assert order == [
        "subagent/start",
        "subagent/end",
        "followup-returned",
        "subagent/start",
        "subagent/end",
    ]


def test_a_raising_listener_changes_nothing(kit: Kit) -> None:
    """Listeners that raise on every event are logged; the epochs and their events
    are the same as without them."""
    rt = kit.rt

    def boom(event: SubagentEvent) -> None:
        raise RuntimeError(f"listener failed on {event.type}")

    rt.subagents.subscribe(boom)
    _busy_elsewhere(kit, "kid")
    assert [e.type for e in kit.events_of("kid")] == ["subagent/start", "subagent/end"] * 2


def test_a_blocking_start_listener_stalls_only_its_own_publisher(kit: Kit) -> None:
    """``subagent/start`` runs in the thread that published the epoch: a listener
    that blocks there holds up that caller (after its child was accepted), and no
    one else."""
    rt = kit.rt
    stuck = kit.gate("start-listener")
    root = kit.root()

    def listener(event: SubagentEvent) -> None:
        if event.type == "subagent/start":
            stuck.pass_through(None)

    rt.subagents.subscribe(listener, scope=root)
    task = spawn(rt, kit.start, root, [["note", "ran"]], "slow-start")
    assert stuck.wait_reached(10)
    assert kit.script.notes.has("note", "slow-start", "ran")  # accepted and running
    _busy_elsewhere(kit, "elsewhere")
    assert not task.done()
    stuck.release()
    task.result(10)
    kit.wait_settled("slow-start", epochs=1)


def test_a_start_announced_after_its_own_settle_stays_with_its_publisher(
    kit: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-EVT-5, forced interleaving: the child runs and settles (its end queued in
    the dispatcher) before its publisher announces its start. The start is still
    the publisher's to announce -- it was posted to the dispatcher as if behind a
    previous epoch's end, so a start listener that blocks blocked the dispatcher,
    and no other child's end was announced ("elsewhere did not settle", now and
    then under load)."""
    from subagents.actors._children._announce import Announcer
    from subagents.actors._kernel._gate import Latch

    rt = kit.rt
    stuck = kit.gate("start-listener")
    late = kit.gate("late-start")
    ended = Latch()
    posted: list[Any] = []
    held: list[Any] = []
    root = kit.root()
    start = Announcer.start
    hooks = rt.continuation._hooks
    post_end = hooks._announce  # the announcer's, bound when the runtime was made

    def start_late(self: Any, act: Any) -> None:
        if not held:
            held.append(act)
            late.pass_through(None)  # the publisher, preempted before it announces
        start(self, act)

    def post_end_seen(act: Any) -> None:
        post_end(act)
        # Noted whether or not the start is held yet: under load the child settles
        # before its publisher even reaches the start (the end came first).
        posted.append(act)
        ended.set()

    def listener(event: SubagentEvent) -> None:
        if event.type == "subagent/start":
            stuck.pass_through(None)

    monkeypatch.setattr(Announcer, "start", start_late)
    monkeypatch.setattr(hooks, "_announce", post_end_seen)
    rt.subagents.subscribe(listener, scope=root)
    task = spawn(rt, kit.start, root, [["note", "ran"]], "slow-start")
    assert late.wait_reached(10)
    assert ended.wait(10)  # it ran and settled: its end is queued
    assert posted == held  # (the only child yet)
    late.release()
    assert stuck.wait_reached(10)
    _busy_elsewhere(kit, "elsewhere")
    assert not task.done()
    stuck.release()
    task.result(10)
    kit.wait_settled("slow-start", epochs=1)


def test_blocking_setup_contributions_and_releases_stall_no_admission(kit: Kit) -> None:
    """A setup contribution that blocks holds up its own materialization; a release
    that blocks holds up its own child's disposal. Other children are admitted,
    resumed and settled meanwhile."""
    rt = kit.rt
    installing = kit.gate("installing")
    releasing = kit.gate("releasing")

    def contribution(scope: Any) -> Any:
        if scope.agent.label == "slow-setup":
            installing.pass_through(None)
        if scope.agent.label == "slow-release":
            return lambda: releasing.pass_through(None)
        return None

    rt.subagents.register_continuable_setup(contribution)
    root = kit.root()
    installer = spawn(rt, kit.start, root, "hi", "slow-setup")
    assert installing.wait_reached(10)
    kit.start(root, "hi", label="slow-release")
    assert releasing.wait_reached(10)  # its release blocks its settlement
    _busy_elsewhere(kit, "elsewhere")
    installing.release()
    releasing.release()
    installer.result(10)
    kit.wait_settled("slow-setup", epochs=1)
    kit.wait_settled("slow-release", epochs=1)


def test_every_start_heard_is_ended_when_the_runtime_closes_as_children_settle(
    backend: Any, tmp_path: Any
) -> None:
    """R-EVT-2, R-EVT-3: a runtime closed while its continuable child settles
    announces that child's ``subagent/end`` -- its release travelled supervisor ->
    registry -> dispatcher, and the registry used to be stopped first, dropping it
    (about one close in four on threads). Run many times: it is a race."""
    from subagents.actors import Runtime

    def lead(turn: Any) -> Any:
        turn.subagents.start_continuable("local", "hello", label="w", model="echo")

    for i in range(30):
        events: list[str] = []
        rt = Runtime(str(tmp_path / f"l{i}.db"), backend=backend)
        try:
            rt.subagents.subscribe(lambda e, seen=events: seen.append(e.type))
            rt.models.register("lead", lambda _o: lead)
            root = rt.spawn("lead")
            root.followup("go")
            assert root.wait_idle(30)
        finally:
            rt.close()
        assert events.count("subagent/start") == 1, (i, events)
        assert events.count("subagent/end") == 1, (i, events)
