"""Epochs nobody listens to (R-EVT-1, R-EVT-2, R-EVT-4, R-EVT-6).

An epoch started with no lifecycle listener and no tracing announces neither
event; its ``released`` latch is still set by the dispatcher, behind what was
posted to it before (a drain that returns saw it all run). A listener hears the
whole pairs of the epochs started after it subscribed. Everything here runs
without the kit's probe (which listens).
"""

from __future__ import annotations

from typing import Any

import pytest
from continuable_kit import spawn
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._children._announce import Announcer
from subagents.actors._kernel._gate import Latch
from subagents.actors.testing import Gate, LifecycleProbe, Reply, ScriptedBehaviour


def _watch_releases(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[Latch]]:
    """The epochs the registry releases, noted as it hands each to the announcer;
    each release sets the last latch of the list returned second."""
    hooks = rt.continuation._hooks
    post_end = hooks._announce  # the announcer's, bound when the runtime was made
    released: list[Any] = []
    seen = [Latch()]

    def noted(act: Any) -> None:
        post_end(act)
        released.append(act)
        seen[-1].set()

    monkeypatch.setattr(hooks, "_announce", noted)
    return released, seen


def _hold_starts(monkeypatch: pytest.MonkeyPatch) -> list[Gate]:
    """Each publisher stops before it announces its epoch's start, at the last gate
    of the list returned (the test appends one per epoch)."""
    start = Announcer.start
    held: list[Gate] = []

    def start_late(self: Any, act: Any) -> None:
        held[-1].pass_through(None)  # the publisher, preempted before it announces
        start(self, act)

    monkeypatch.setattr(Announcer, "start", start_late)
    return held


def _start(rt: Runtime, root: Any, label: str) -> Any:
    return rt.subagents.start_continuable(
        ContinuableStartSpec(parent=root, provider="local", prompt="x", label=label, model="done")
    )


def test_an_epoch_nobody_hears_is_released_at_once_and_a_later_one_is_heard_whole(
    rtp: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The quiet epoch's latch is set behind what the dispatcher was given before;
    a listener subscribed after it hears the next epoch's pair, whole, with a run
    id of its own."""
    rt = rtp
    announcer = rt.continuation._hooks._announce.__self__
    released, seen = _watch_releases(rt, monkeypatch)
    rt.models.register("done", lambda _o: ScriptedBehaviour([Reply("ok")]))
    busy = Gate("dispatcher")
    announcer._dispatch.call(busy.pass_through, None)  # the dispatcher is held
    assert busy.wait_reached(10)
    root = rt.spawn("echo")
    child = _start(rt, root, "quiet")
    assert seen[-1].wait(10)
    (first,) = released
    assert not first.released.is_set()  # behind the dispatcher, as an announced end
    busy.release()
    assert first.released.wait(10)
    probe = LifecycleProbe(rt)
    rt.subagents.followup(root, child.child_id, "again")  # a cold resume: epoch 2
    assert probe.wait_for(lambda evs: any(e.type == "subagent/end" for e in evs))
    assert [(e.type, e.child_id) for e in probe.events] == [
        ("subagent/start", str(child.child_id)),
        ("subagent/end", str(child.child_id)),
    ]
    assert probe.events[0].run_id == probe.events[1].run_id != first.run_id
    rt.subagents.drain_continuable_descendants([root], timeout=10)


def test_an_epoch_that_ended_before_its_quiet_start_is_still_released(
    rtp: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced interleaving, many times: the child runs and settles (its end queued
    in the dispatcher) before its publisher reaches the start, with nobody
    listening. The start must not go quiet then -- the queued end waits for it --
    and the epoch's latch is set: a follow-up resumes it, a drain returns."""
    rt = rtp
    released, seen = _watch_releases(rt, monkeypatch)
    rt.models.register("done", lambda _o: ScriptedBehaviour([Reply("ok")]))
    held = _hold_starts(monkeypatch)
    root = rt.spawn("echo")
    for i in range(20):
        late = Gate(f"late-{i}")
        held.append(late)
        seen.append(Latch())
        task = spawn(rt, _start, rt, root, f"kid{i}")
        assert late.wait_reached(10)
        assert seen[-1].wait(10)  # it ran and settled: its end went to the dispatcher
        late.release()
        child = task.result(10)
        assert released[-1].released.wait(10)
    monkeypatch.undo()
    rt.subagents.followup(root, child.child_id, "again")  # waits for that latch
    rt.subagents.drain_continuable_descendants([root], timeout=10)


def test_a_listener_hears_no_lone_end_of_an_epoch_nobody_heard_start(
    rtp: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced interleaving, many times: nobody listens, the dispatcher is held, the
    child settles (its end queued) before its publisher reaches the start, so the
    start keeps the announced path's order; a listener subscribing before the
    dispatcher runs the end hears nothing of that epoch (no lone end), and the
    epoch's latch is still set."""
    rt = rtp
    announcer = rt.continuation._hooks._announce.__self__
    released, seen = _watch_releases(rt, monkeypatch)
    rt.models.register("done", lambda _o: ScriptedBehaviour([Reply("ok")]))
    held = _hold_starts(monkeypatch)
    root = rt.spawn("echo")
    for i in range(10):
        busy = Gate(f"dispatcher-{i}")
        announcer._dispatch.call(busy.pass_through, None)  # the dispatcher is held
        assert busy.wait_reached(10)
        late = Gate(f"late-{i}")
        held.append(late)
        seen.append(Latch())
        task = spawn(rt, _start, rt, root, f"kid{i}")
        assert late.wait_reached(10)
        assert seen[-1].wait(10)  # it settled: its end is queued behind the dispatcher
        late.release()
        task.result(10)  # start returned, nobody listening
        probe = LifecycleProbe(rt)  # subscribes mid-epoch
        busy.release()
        assert released[-1].released.wait(10)
        heard = [(e.type, e.child_id) for e in probe.events]
        probe.close()
        assert heard == []
    monkeypatch.undo()
    rt.subagents.drain_continuable_descendants([root], timeout=10)
