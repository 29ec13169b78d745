"""Residency (running, waiting, settled), child-first release, lifecycle epochs.

R-RES-1..9, R-EVT-2, R-EVT-3, R-EVT-7, R-EVT-9.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest
from continuable_kit import Kit, spawn
from subagents.actors import AbortSignal, Agent, SubagentStartRequest
from subagents.protocol import SubagentError, TurnEnd
from subagents.supervision import residency


def test_running_activation_does_not_settle_between_queued_turns(kit: Kit) -> None:
    """R-RES-1: while a turn is open or work is queued the Activation is running and
    never settles; every queued message runs in the same epoch."""
    rt = kit.rt
    root = kit.root()
    child_id, first = kit.start(root, [["block", "g"]], label="kid")
    assert kit.gate("g").wait_reached(10)
    act = kit.act("kid")
    assert residency(act) == "running"
    ids = [rt.subagents.followup(root, child_id, [["block", f"g{i}"]]) for i in range(3)]
    for name in ("g", "g0", "g1"):
        kit.gate(name).release()
        kit.barrier()
        assert kit.act("kid") is act and residency(act) == "running"
    kit.gate("g2").release()
    kit.wait_settled("kid", epochs=1)
    assert kit.started_ids("kid") == [first, *ids]


def test_waiting_then_settled_child_first(kit: Kit) -> None:
    """R-RES-2, R-RES-3, R-RES-5, R-EVT-2: a quiescent Activation owning a live child
    waits (resident, registered, no ``subagent/end``); once every owned child is
    disposed it settles, children strictly before parents; a waking report makes a
    waiting parent run in the same epoch; the next follow-up cold-resumes."""
    rt = kit.rt
    root = kit.root()
    root.followup(
        [
            [
                "start",
                "A",
                [["start", "B", [["start", "C", [["block", "c"], ["report", "waking", "done"]]]]]],
            ]
        ]
    )
    assert kit.gate("c").wait_reached(10)
    acts = {x: kit.act(x) for x in "ABC"}
    for x in "AB":
        assert acts[x].agent.wait_idle(10)
    kit.barrier()
    assert [residency(acts[x]) for x in "ABC"] == ["waiting", "waiting", "running"]
    assert all(rt.agents.is_live(acts[x].agent) for x in "ABC")
    assert not [e for e in kit.probe.events if e.type == "subagent/end"]
    kit.gate("c").release()
    kit.wait_settled("A", epochs=1)
    assert [t.content for t in kit.script.turns_of("B")][-1] == "done"  # woken by C
    assert [len(kit.events_of(x, "subagent/start")) for x in "ABC"] == [1, 1, 1]
    ends = [e.child_id for e in kit.probe.events if e.type == "subagent/end"]
    assert ends == [str(kit.sid(x)) for x in "CBA"]
    notes = kit.script.notes.items()
    order = [notes.index(("disposed", x)) for x in "CBA"]
    assert order == sorted(order)
    rt.subagents.followup(root, kit.sid("A"), "again")
    kit.wait_settled("A", epochs=2)
    agents = {id(t.agent) for t in kit.script.turns_of("A")}
    assert len(agents) == 2  # cold resume: a new Agent


def test_leaf_settles_even_when_its_turn_ends_before_the_manager_watches_it(
    kit: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-RES-3: forced interleaving: the child's first turn completes before the
    manager subscribes to the child's quiescence (the registry task was preempted
    right after delivery); the Activation must still settle."""
    original = Agent.add_idle_listener

    def late_subscription(self: Agent, fn: Any) -> Any:
        self.wait_idle(10)  # the turn has finished before we subscribe
        return original(self, fn)

    monkeypatch.setattr(Agent, "add_idle_listener", late_subscription)
    root = kit.root()
    child_id, _ = kit.start(root, "quick", label="kid")
    kit.wait_settled("kid", epochs=1)
    kit.rt.subagents.followup(root, child_id, "quick again")
    kit.wait_settled("kid", epochs=2)


def test_agents_outside_continuation_have_no_activation(kit: Kit) -> None:
    """R-RES-7: top-level agents and one-shot children have no Activation, are never
    owned, and are never disposed by the continuation machinery."""
    rt = kit.rt
    root = kit.root()
    root.followup("a top-level turn")
    kit.start(root, [["block", "a"]], label="A")
    assert kit.gate("a").wait_reached(10)
    a = kit.live("A")
    run = rt.subagents.start(
        "local",
        SubagentStartRequest(parent=a, prompt="one-shot work", signal=AbortSignal.never()),
    )
    assert run.result.get(10).stop_reason == "completed"
    one_shot = run.local_agent
    assert one_shot is not None and one_shot.wait_idle(10) and root.wait_idle(10)
    kit.barrier()
    assert rt.continuation.activation(root.session_id) is None
    assert rt.continuation.activation(run.id) is None
    assert all(str(run.id) not in act.owned for act in rt.continuation.activations())
    kit.gate("a").release()
    kit.wait_settled("A", epochs=1)  # A does not wait for its one-shot child
    kit.barrier()
    assert rt.agents.is_live(root) and rt.agents.is_live(one_shot)
    run.dispose()


def test_settlement_flushes_before_releasing_the_handle(kit: Kit) -> None:
    """R-RES-8: the child's session reaches persistence before its handle is disposed
    (the end of the epoch waits for a blocked store)."""
    rt = kit.rt
    store = kit.store
    parked = kit.gate("store")
    root = kit.root()
    child_id, _ = kit.start(root, [["block", "g"]], label="kid")
    assert kit.gate("g").wait_reached(10)
    at_end: list[bool] = []

    def on_end(event: Any) -> None:
        if event.type == "subagent/end" and event.child_id == str(child_id):
            at_end.append(any(isinstance(r.event, TurnEnd) for r in store.read(child_id)))

    rt.subagents.subscribe(on_end)
    store.before_append = lambda sid, events: parked.pass_through(None) if sid == child_id else None
    kit.gate("g").release()
    assert parked.wait_reached(10)
    sid = str(child_id)
    assert not kit.probe.wait_for(
        lambda evs: any(e.type == "subagent/end" and e.child_id == sid for e in evs), timeout=0.3
    )
    parked.release()
    kit.wait_settled("kid", epochs=1)
    assert at_end == [True]


def test_failing_flush_is_logged_and_settlement_completes(
    kit: Kit, caplog: pytest.LogCaptureFixture
) -> None:
    """R-RES-9: a write that fails is logged; the Activation still settles and its
    handle is disposed; the failure is listed in ``statistics()`` (issue 19 point 2)."""
    store = kit.store
    root = kit.root()
    failing: set[Any] = set()

    def before_append(sid: Any, events: Any) -> None:
        if sid in failing:
            raise SubagentError("disk on fire")

    store.before_append = before_append
    child_id, _ = kit.start(root, [["block", "g"]], label="kid")
    assert kit.gate("g").wait_reached(10)
    failing.add(child_id)
    child = kit.agent("kid")
    with caplog.at_level(logging.ERROR, logger="subagents"):
        kit.gate("g").release()
        kit.wait_settled("kid", epochs=1)
    assert child is not None and child.disposed and kit.agent("kid") is None
    assert [e.stop_reason for e in kit.events_of("kid", "subagent/end")] == ["completed"]
    assert any("disk on fire" in r.getMessage() for r in caplog.records)
    failures = kit.rt.sessions.statistics().persistence_failures
    assert [f.session_id for f in failures] == [child_id]


def test_epoch_events_have_one_shape_for_every_kind_of_epoch(kitp: Kit) -> None:
    """R-EVT-2, R-EVT-3, R-EVT-7, R-EVT-9: one start/end pair per resident epoch
    (materialized or cold-resumed; waking opens none), payloads shaped like a
    one-shot run's with no field telling how the epoch began, ``local`` always true,
    and the provider recorded at creation."""
    kit = kitp
    rt = kit.rt
    root = kit.root()
    root.followup([["start", "A", [["start", "B", [["block", "b"]]]]]])
    assert kit.gate("b").wait_reached(10)
    a_id = kit.sid("A")
    assert kit.act("A").agent.wait_idle(10)
    rt.subagents.followup(root, a_id, "wake")  # wakes the waiting Activation
    assert kit.script.notes.has("turn", "A", "wake")
    kit.gate("b").release()
    kit.wait_settled("A", epochs=1)
    rt.subagents.followup(root, a_id, "cold")
    kit.wait_settled("A", epochs=2)
    run = rt.subagents.start(
        "local", SubagentStartRequest(parent=root, prompt="x", signal=AbortSignal.never())
    )
    run.result.get(10)
    run.dispose()
    assert kit.probe.wait_for(lambda evs: sum(e.child_id == str(run.id) for e in evs) == 2)
    events = kit.events_of("A")
    assert [e.type for e in events] == ["subagent/start", "subagent/end"] * 2
    assert len({e.run_id for e in events}) == 2
    assert {(e.local, e.provider, e.mode) for e in events} == {(True, "local", "continuable")}

    def shape(e: Any) -> set[str]:
        return {k for k, v in dataclasses.asdict(e).items() if v is not None}

    one_shot = [e for e in kit.probe.events if e.child_id == str(run.id)]
    for kind in ("subagent/start", "subagent/end"):
        shapes = [shape(e) for e in events + one_shot if e.type == kind]
        assert all(s == shapes[0] for s in shapes), shapes


def test_runtime_close_cancels_every_level_then_releases_child_first(kit: Kit) -> None:
    """R-RES-5, R-RES-6: closing the runtime (teardown) cancels every level of a
    three-level continuable chain before it waits for the slow middle level, and
    disposes children strictly before parents."""
    rt = kit.rt
    root = kit.root()
    root.followup(
        [
            [
                "start",
                "A",
                [
                    [
                        "start",
                        "B",
                        [["start", "C", [["block", "c"]]], ["block_slow", "b", "hold"]],
                    ],
                    ["block", "a"],
                ],
            ]
        ]
    )
    for g in ("a", "b", "c"):
        assert kit.gate(g).wait_reached(10)
    closing = spawn(rt, rt.close)
    notes = kit.script.notes
    assert notes.wait_for(lambda n: all(("cancelled", x) in n for x in "ABC")), notes.items()
    assert ("slow-done", "B") not in notes.items() and not closing.done()
    kit.gate("hold").release()
    closing.result(30)
    items = notes.items()
    disposed = [items.index(("disposed", x)) for x in ("C", "B", "A", "root")]
    assert disposed == sorted(disposed)


def test_a_resident_child_disposed_by_its_holder_leaves_residency(
    kit: Kit, caplog: pytest.LogCaptureFixture
) -> None:
    """R-RES-7, R-RES-8: a continuable child whose agent is disposed directly, while
    resident and waiting (not retired by the supervisor), still ends its epoch: its
    Activation is released, ``subagent/end`` announced, its parent no longer owns
    it, and the next follow-up cold-resumes it. No owner fails on the way."""
    rt = kit.rt
    root = kit.root()
    child_id, _ = kit.start(root, [["start", "grandkid", [["block", "g"]]]], label="kid")
    assert kit.gate("g").wait_reached(10)
    kid = kit.live("kid")
    assert kid.wait_idle(10) and kit.act("kid") is not None  # waiting for its child
    with caplog.at_level(logging.ERROR, logger="subagents"):
        kid.dispose()
        assert kit.probe.wait_for(
            lambda evs: any(e.type == "subagent/end" and e.child_id == str(child_id) for e in evs)
        )
        kit.barrier()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    assert kit.act("kid") is None
    kit.gate("g").release()
    kit.wait_settled("grandkid", epochs=1)
    rt.subagents.followup(root, child_id, "again")
    kit.wait_settled("kid", epochs=2)
    assert kit.contents("kid")[-1] == "again"


def test_whoever_sees_the_end_finds_the_child_gone(kit: Kit) -> None:
    """R-EVT-2, a race: ``subagent/end`` is announced after the registry dropped the
    epoch -- also when its agent was disposed without retiring (a failed write, a
    lost lease): a listener looking the child up on its end never finds it
    resident. (The end was posted before the registry heard of the release, and a
    listener could see the child still resident; run many times.)"""
    rt = kit.rt
    root = kit.root()
    seen: list[Any] = []

    def on_event(event: Any) -> None:
        if event.type == "subagent/end":
            seen.append(rt.continuation.activation(event.child_id))

    subscription = rt.subagents.subscribe(on_event)
    try:
        for i in range(30):
            label = f"kid{i}"
            kit.start(root, [["block", label]], label=label)
            assert kit.gate(label).wait_reached(10)
            kit.live(label).dispose(wait=False)  # released without retiring
            kit.gate(label).release()
            kit.wait_settled(label, epochs=1)
    finally:
        subscription.dispose()
    assert len(seen) == 30
    assert seen == [None] * 30
