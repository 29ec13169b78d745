"""What comes by a parent's id while that continuable parent is cold-resumed here
(R-SETUP-1: setup before the first turn; R-CONT-6: FIFO turns; R-RES-4/R-RES-5:
a parent is released after its children).

During a cold resume the parent's agent is live already (found by its id), its
Activation not yet published, its setup contributions not yet all installed. A
report by the child's id ran there as a turn at once -- before the setup, ahead
of the follow-up that woke the parent -- and a child started by the parent's id
was owned by no Activation, so the parent settled and was released under it.
Now both wait for the publication. Forced: the resume is held in a setup
contribution until the call by id has reached the parent (returned, or waits).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import pytest
from continuable_kit import Kit, spawn
from subagents.actors import ContinuableStartSpec
from subagents.actors._children._continuation import ContinuationManager
from subagents.protocol import MessageEvent, ReportEvent

pytestmark = pytest.mark.timeout(120)


def _hold_resume(kit: Kit, label: str) -> Any:
    """``label``'s next cold resume waits in a setup contribution at the gate returned."""
    gate = kit.gate(f"materializing-{label}")

    def contribution(scope: Any) -> None:
        if scope.agent.label == label:
            gate.pass_through(None)

    kit.rt.subagents.register_continuable_setup(contribution)
    return gate


def _watch(kit: Kit, monkeypatch: pytest.MonkeyPatch, session_id: Any) -> Any:
    """An event set when a call waits for ``session_id``'s publication (patched in
    before the call is made)."""
    waiting = kit.rt.backend.event()
    real = getattr(ContinuationManager, "published", None)

    def published(self: Any, sid: Any, signal: Any = None) -> bool:
        if sid == session_id:
            waiting.set()
        return bool(real(self, sid, signal)) if real is not None else False

    monkeypatch.setattr(ContinuationManager, "published", published, raising=False)
    return waiting


def _reached(waiting: Any, task: Any) -> None:
    """Return once ``task`` finished, or waits for the publication (``waiting``)."""
    while not (task.done() or waiting.is_set()):  # a deadline poll for the task's progress
        waiting.wait(0.005)


def test_a_report_by_id_waits_for_its_parents_publication(
    kitp: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit, rt = kitp, kitp.rt
    root = kit.root()
    kit.start(root, [["start", "C", "hi"]], label="P")
    kit.wait_settled("C")
    kit.wait_settled("P")
    p_id, c_id = kit.sid("P"), kit.sid("C")
    held = _hold_resume(kit, "P")
    wake = [["block", "p"]]  # P stays resident in that turn (relaxed: a report needs it live)
    woke = spawn(rt, rt.subagents.followup, root, p_id, wake)  # P's cold resume
    assert held.wait_reached(30)
    assert rt.continuation.activation(p_id) is None and rt.agents.get(p_id) is not None
    waiting = _watch(kit, monkeypatch, p_id)
    report = spawn(rt, partial(rt.subagents.report_from, delivery="waking"), c_id, "news")
    _reached(waiting, report)
    held.release()
    woke_id = woke.result(30)
    assert kit.gate("p").wait_reached(30)
    mid = report.result(30)
    kit.gate("p").release()
    assert kit.script.notes.has("turn", "P", "news", timeout=30)
    order = [
        r.event.message_id
        for r in rt.sessions.read(p_id)
        if isinstance(r.event, (MessageEvent, ReportEvent)) and r.event.message_id in (mid, woke_id)
    ]
    assert order == [woke_id, mid]  # after what woke it, in its own turn


def test_a_child_started_by_its_parents_id_during_the_resume_is_owned(
    kitp: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    kit, rt = kitp, kitp.rt
    root = kit.root()
    kit.start(root, "hi", label="P")
    kit.wait_settled("P")
    p_id = kit.sid("P")
    held = _hold_resume(kit, "P")
    woke = spawn(rt, rt.subagents.followup, root, p_id, "wake up")
    assert held.wait_reached(30)
    spec = ContinuableStartSpec(
        parent=str(p_id), provider="local", prompt=[["block", "x"]], label="X", model="cmd"
    )
    waiting = _watch(kit, monkeypatch, p_id)
    start = spawn(rt, rt.subagents.start_continuable, spec)
    _reached(waiting, start)
    held.release()
    woke.result(30)
    x_id = start.result(30).child_id
    assert kit.gate("x").wait_reached(30)
    p_act = rt.continuation.activation(p_id)
    x_act = rt.continuation.activation(x_id)
    assert p_act is not None and x_act is not None
    assert x_act.parent_activation is p_act  # owned: P stays while X runs
    kit.gate("x").release()
    kit.wait_settled("P")  # after X
