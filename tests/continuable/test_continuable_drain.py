"""``drain_continuable_descendants``: cutoff, top-down cancel, child-first release.

R-DRAIN-1..9, R-RES-5, R-RES-6.
"""

from __future__ import annotations

from typing import Any

import pytest
from continuable_kit import Kit, spawn
from subagents.actors import AbortSignal, AgentOptions, ContinuableStartSpec, SubagentStartRequest
from subagents.actors._children._admission import Registry
from subagents.protocol import ErrorCode, SubagentDescriptorEvent, SubagentError, TurnEnd


def _chain(kit: Kit, slow: str | None = None, root_label: str = "root") -> Any:
    """root -> A -> B -> C blocked at gates a, b, c (``slow`` holds after its cancel)."""

    def block(label: str) -> list[Any]:
        gate = label.lower()
        return ["block_slow", gate, "hold"] if label == slow else ["block", gate]

    root = kit.root(root_label)
    root.followup(
        [
            [
                "start",
                "A",
                [["start", "B", [["start", "C", [block("C")]], block("B")]], block("A")],
            ]
        ]
    )
    for g in ("a", "b", "c"):
        assert kit.gate(g).wait_reached(10)
    return root


def _refused_start(kit: Kit, parent: Any, label: str = "late") -> str:
    with pytest.raises(SubagentError) as err:
        kit.rt.subagents.start_continuable(
            ContinuableStartSpec(
                parent=parent, provider="local", prompt="x", label=label, model="cmd"
            )
        )
    return err.value.code


@pytest.mark.parametrize("slow", ["A", "B", "C"])
def test_drain_cancels_top_down_then_releases_child_first(kit: Kit, slow: str) -> None:
    """R-RES-5, R-RES-6, R-DRAIN-1, R-DRAIN-4, R-DRAIN-5: cancellation reaches every
    level of a three-level continuable forest while one slow level (at the top, the
    middle or the bottom) still ignores it; admission below the root is closed at
    once; each child is released strictly before its parent, and the drain returns
    only after the whole forest is released."""
    rt = kit.rt
    root = _chain(kit, slow=slow)
    ids = {label: kit.sid(label) for label in "ABC"}
    agents = {label: kit.agent(label) for label in "ABC"}
    drain = spawn(rt, rt.subagents.drain_continuable_descendants, [root])
    notes = kit.script.notes
    # Every level sees the cancellation although the slow one has not finished.
    assert notes.wait_for(lambda n: all(("cancelled", x) in n for x in "ABC")), notes.items()
    assert ("slow-done", slow) not in notes.items()
    assert not drain.done()
    assert _refused_start(kit, root) == ErrorCode.ADMISSION_CLOSED  # closed at once
    released_before = [e.child_id for e in kit.probe.events if e.type == "subagent/end"]
    assert str(ids[slow]) not in released_before
    kit.gate("hold").release()
    drain.result(20)
    ends = [e for e in kit.probe.events if e.type == "subagent/end"]
    assert [e.child_id for e in ends] == [str(ids[x]) for x in "CBA"]  # child-first
    assert {e.stop_reason for e in ends} == {"cancelled"}
    items = notes.items()
    disposed = [items.index(("disposed", x)) for x in "CBA"]
    assert disposed == sorted(disposed)
    assert items.index(("slow-done", slow)) < items.index(("disposed", slow))
    assert all(rt.continuation.activation(i) is None for i in ids.values())
    assert all(a is not None and a.disposed for a in agents.values())


@pytest.mark.parametrize("outcome", ["publishes", "rolls-back"])
def test_drain_awaits_materializations_admitted_before_the_cutoff(
    kit: Kit, outcome: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-DRAIN-3, R-DRAIN-5: a materialization admitted below the root before the
    cutoff is awaited until it publishes (then it is released with the rest) or
    rolls back; the drain returns only afterwards."""
    rt = kit.rt
    root = kit.root()
    mat = kit.gate("materializing")

    def contribution(scope: Any) -> None:
        if scope.agent.label == "late-comer":
            mat.pass_through(None)
            if outcome == "rolls-back":
                raise RuntimeError("materialization failed")

    rt.subagents.register_continuable_setup(contribution)
    start = spawn(rt, kit.start, root, "never runs", "late-comer")
    assert mat.wait_reached(10)
    on_cutoff = Registry._cutoff

    def noted(self: Registry, parents: Any, *more: Any) -> Any:
        result = on_cutoff(self, parents, *more)
        kit.script.notes.add("cutoff")
        return result

    monkeypatch.setattr(Registry, "_cutoff", noted)
    drain = spawn(rt, rt.subagents.drain_continuable_descendants, [root])
    assert kit.script.notes.has("cutoff")
    assert _refused_start(kit, root) == ErrorCode.ADMISSION_CLOSED
    assert not drain.join(0.3)  # still awaiting the admitted materialization
    mat.release()
    if outcome == "publishes":
        child_id, _ = start.result(10)
    else:
        assert isinstance(start.error(10), RuntimeError)
    drain.result(20)
    if outcome == "publishes":
        assert [e.type for e in kit.events_of(child_id)] == ["subagent/start", "subagent/end"]
        assert rt.continuation.activation(child_id) is None and rt.agents.get(child_id) is None
        # Accepted, then discarded by the drain: logged as a turn that never ran,
        # beside the descriptor that gives the child its identity.
        assert len(kit.started_ids(child_id)) == 1
        ends = [(e.stop_reason, e.error) for e in kit.log(child_id) if isinstance(e, TurnEnd)]
        assert ends == [("cancelled", "discarded unrun")]
        assert any(isinstance(e, SubagentDescriptorEvent) for e in kit.log(child_id))
    assert rt.continuation.activations() == []
    assert not [t for t in kit.script.turns if t.content == "never runs"]


def test_drain_awaits_the_end_of_a_materialization_released_before_it_looked_again(
    kit: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-DRAIN-3, R-DRAIN-5, forced interleaving: the materialization the drain
    awaited publishes below the cutoff, is drained at once and released -- gone
    from the registry's index -- before the drain looks again. The drain still
    returns only once the child's ``subagent/end`` was announced; it returned at
    once (found failing now and then in CI: the end announced after the drain)."""
    from subagents.actors._children._continuation import ContinuationManager
    from subagents.actors._children._requests import Cutoff

    rt = kit.rt
    root = kit.root()
    mat = kit.gate("materializing")
    ending = kit.gate("end-listener")

    def contribution(scope: Any) -> None:
        if scope.agent.label == "late-comer":
            mat.pass_through(None)

    def listener(event: Any) -> None:
        if event.type == "subagent/end":
            ending.pass_through(None)  # released: the end is being announced

    rt.subagents.register_continuable_setup(contribution)
    rt.subagents.subscribe(listener, scope=root)
    start = spawn(rt, kit.start, root, "never runs", "late-comer")
    assert mat.wait_reached(10)
    cutoffs: list[Any] = []
    real_ask = ContinuationManager._ask

    def ask(self: Any, message: Any) -> Any:
        if isinstance(message, Cutoff):
            cutoffs.append(message)
            if len(cutoffs) == 2:  # the drain's second look, once the child is gone
                assert ending.wait_reached(10)
            kit.script.notes.add("cutoff")
        return real_ask(self, message)

    monkeypatch.setattr(ContinuationManager, "_ask", ask)
    drain = spawn(rt, rt.subagents.drain_continuable_descendants, [root])
    assert kit.script.notes.has("cutoff")
    mat.release()
    assert ending.wait_reached(10)
    assert not drain.join(0.3)  # its end is not announced yet: the drain waits for it
    ending.release()
    drain.result(20)
    child_id, _ = start.result(10)
    assert [e.type for e in kit.events_of(child_id)] == ["subagent/start", "subagent/end"]
    assert len(cutoffs) == 2


def test_drain_spares_one_shot_runs_and_other_forests(kit: Kit) -> None:
    """R-DRAIN-2, R-DRAIN-8: a drained parent's one-shot runs are not cancelled; a
    forest under a parent not passed to the drain keeps running, and that parent (and
    any other) can still start and follow up continuable children."""
    rt = kit.rt
    drained, spared = kit.root("drained"), kit.root("spared")
    kit.start(drained, [["block", "d"]], label="D")
    kit.start(spared, [["block", "s"]], label="S")
    run = rt.subagents.start(
        "local",
        SubagentStartRequest(
            parent=drained,
            prompt=[["block", "one-shot"]],
            signal=AbortSignal.never(),
            model="cmd",
            label="O",
        ),
    )
    for g in ("d", "s", "one-shot"):
        assert kit.gate(g).wait_reached(10)
    rt.subagents.drain_continuable_descendants([drained])
    assert kit.act("D") is None and kit.act("S") is not None
    assert ("cancelled", "S") not in kit.script.notes.items()
    assert ("cancelled", "O") not in kit.script.notes.items()
    rt.subagents.followup(spared, kit.sid("S"), "still open")
    kit.start(spared, "hi", label="S2")
    kit.wait_settled("S2", epochs=1)
    kit.start(kit.root("other"), "hi", label="X")
    kit.wait_settled("X", epochs=1)
    kit.gate("one-shot").release()
    assert run.result.get(10).stop_reason == "completed"
    run.dispose()
    kit.gate("s").release()
    kit.wait_settled("S", epochs=1)
    assert kit.contents("S")[-1] == "still open"


def test_cutoff_lasts_while_the_exact_parent_is_registered(kit: Kit) -> None:
    """R-DRAIN-1, R-DRAIN-6, R-DRAIN-7, R-DRAIN-9: after the drain returned, starts
    and follow-ups below the root (and starts by a draining descendant) are refused;
    the durable sessions stay; once the exact root leaves the registry the cutoff
    ends, and a new Agent for the same session starts and resumes children."""
    rt = kit.rt
    root = kit.root()
    root.followup([["start", "A", [["block_try", "a", "grandchild"]]]])
    assert kit.gate("a").wait_reached(10)
    a_id = kit.sid("A")
    rt.subagents.drain_continuable_descendants([root])
    assert ("start-refused", "A", ErrorCode.ADMISSION_CLOSED) in kit.script.notes.items()
    assert "grandchild" not in kit.ids
    events = len(kit.probe.events)
    assert _refused_start(kit, root) == ErrorCode.ADMISSION_CLOSED
    with pytest.raises(SubagentError) as err:
        rt.subagents.followup(root, a_id, "refused")
    assert err.value.code == ErrorCode.ADMISSION_CLOSED
    assert len(kit.probe.events) == events and kit.act("A") is None
    assert kit.persisted("A")  # only residency was released
    root.dispose()
    replacement = rt.agents.resume(root.session_id, options=AgentOptions(model="cmd"))
    kit.start(replacement, "hi", label="fresh")
    kit.wait_settled("fresh", epochs=1)
    rt.subagents.followup(replacement, a_id, "resumed after the drain")
    kit.wait_settled("A", epochs=2)
    assert kit.contents("A") == [[["block_try", "a", "grandchild"]], "resumed after the drain"]


def test_drain_takes_exact_live_host_owned_parents(kit: Kit) -> None:
    """R-DRAIN-1: a continuable (not host-owned) parent or a stale parent is refused."""
    rt = kit.rt
    root = kit.root()
    kit.start(root, [["block", "g"]], label="kid")
    assert kit.gate("g").wait_reached(10)
    with pytest.raises(SubagentError) as err:
        rt.subagents.drain_continuable_descendants([kit.agent("kid")])
    assert err.value.code == ErrorCode.INVALID_ARGUMENT
    gone = kit.root("gone")
    gone.dispose()
    with pytest.raises(SubagentError) as err:
        rt.subagents.drain_continuable_descendants([gone])
    assert err.value.code == ErrorCode.UNAUTHORIZED
    assert ("cancelled", "kid") not in kit.script.notes.items()
    kit.gate("g").release()
    kit.wait_settled("kid", epochs=1)


def test_drain_reaches_running_descendants_through_waiting_parents(kit: Kit) -> None:
    """R-DRAIN-4, R-RES-6: cancellation reaches a running grandchild below a waiting
    (idle) child, and the forest is still released child-first."""
    rt = kit.rt
    root = kit.root()
    root.followup([["start", "A", [["start", "B", [["block", "b"]]]]]])
    assert kit.gate("b").wait_reached(10)
    a = kit.act("A")
    assert a is not None and a.agent.wait_idle(10)  # A waits; B runs
    rt.subagents.drain_continuable_descendants([root])
    assert ("cancelled", "B") in kit.script.notes.items()
    ends = [e.child_id for e in kit.probe.events if e.type == "subagent/end"]
    assert ends == [str(kit.sid("B")), str(kit.sid("A"))]


def test_drain_covers_continuable_descendants_below_a_one_shot_child(kit: Kit) -> None:
    """R-DRAIN-1, R-DRAIN-2 (interpretation: a one-shot child of a drained parent is
    one of its descendants): a continuable child that a one-shot child started is
    drained, the one-shot run itself is not cancelled, and it may not start another
    continuable child below the drained parent afterwards."""
    rt = kit.rt
    root = kit.root()
    run = rt.subagents.start(
        "local",
        SubagentStartRequest(
            parent=root,
            prompt=[["start", "G", [["block", "g"]]], ["block", "o"], ["try_start", "G2", "hi"]],
            signal=AbortSignal.never(),
            model="cmd",
            label="O",
        ),
    )
    assert kit.gate("g").wait_reached(10) and kit.gate("o").wait_reached(10)
    rt.subagents.drain_continuable_descendants([root])
    assert ("cancelled", "G") in kit.script.notes.items()
    assert kit.act("G") is None
    assert ("cancelled", "O") not in kit.script.notes.items()
    kit.gate("o").release()
    assert run.result.get(10).stop_reason == "completed"
    run.dispose()
    assert ("start-refused", "O", ErrorCode.ADMISSION_CLOSED) in kit.script.notes.items()
    assert "G2" not in kit.ids


def test_drain_timeout_bounds_the_whole_drain(kit: Kit) -> None:
    """R-DRAIN-5: ``timeout`` bounds the drain as a whole, not each wait in it. Two
    children ignore the cancel; the first is released after half the timeout, the
    second after the timeout has passed: the drain raises ``TIMEOUT`` (it used to
    wait the full timeout again for the second, and return)."""
    rt = kit.rt
    root = kit.root()
    for label, gate in (("A", "ha"), ("B", "hb")):
        kit.start(root, [["hold", gate]], label)
        assert kit.gate(gate).wait_reached(10)
    drain = spawn(rt, lambda: rt.subagents.drain_continuable_descendants([root], timeout=2.0))
    try:
        assert not drain.join(1.0)  # A and B still hold
        kit.gate("ha").release()
        drain.join(1.5)  # the deadline passes here
    finally:
        kit.gate("hb").release()
    err = drain.error(20)
    assert isinstance(err, SubagentError) and err.code == ErrorCode.TIMEOUT, err
    assert kit.sid("B") in str(err)
