"""``interrupt``: authority, synchronous admission, asynchronous effect; the wake latch.

R-INT-1..14, L-6.
"""

from __future__ import annotations

from typing import Any

import pytest
from continuable_kit import Kit, spawn
from subagents.actors import Agent, AgentOptions, AncestorAuthority, UserAuthority
from subagents.protocol import (
    ErrorCode,
    InterruptEvent,
    MessageEvent,
    SubagentError,
    new_session_id,
)


def _chain(kit: Kit) -> Agent:
    """root -> A -> B -> C, each blocked at the gate named after it (lower case)."""
    root = kit.root()
    root.followup(
        [
            [
                "start",
                "A",
                [
                    ["start", "B", [["start", "C", [["block", "c"]]], ["block", "b"]]],
                    ["block", "a"],
                ],
            ]
        ]
    )
    for g in ("a", "b", "c"):
        assert kit.gate(g).wait_reached(10)
    return root


def _refused(kit: Kit, target: Any, authority: Any) -> str:
    with pytest.raises(SubagentError) as err:
        kit.rt.subagents.interrupt(target, authority)
    return err.value.code


def test_user_authority_works_while_the_parent_is_offline(kit: Kit) -> None:
    """R-INT-1, R-INT-8, R-INT-11: the durable direct-parent address interrupts a live
    child even when no parent Agent is live; the child is neither disposed nor
    removed from residency by it."""
    rt = kit.rt
    root = kit.root()
    child_id, _ = kit.start(root, [["block", "g"]], label="kid")
    assert kit.gate("g").wait_reached(10)
    act = kit.act("kid")
    root.dispose()
    rt.subagents.interrupt(child_id, UserAuthority(root.session_id))
    assert kit.script.notes.has("cancelled", "kid")
    assert kit.act("kid") is act or kit.epochs("kid") == 1  # settles only by the usual rule
    kit.wait_settled("kid", epochs=1)
    assert [e.stop_reason for e in kit.ends("kid")] == ["cancelled"]
    assert [e.stop_reason for e in kit.events_of("kid", "subagent/end")] == ["completed"]
    interrupts = [e for e in kit.log("kid") if isinstance(e, InterruptEvent)]
    assert [(e.authority, e.by_session) for e in interrupts] == [("user", root.session_id)]


@pytest.mark.parametrize("ancestor", ["B", "A", "root"])
def test_any_live_ancestor_may_interrupt(kit: Kit, ancestor: str) -> None:
    """R-INT-2, R-INT-12: the direct parent or any higher live ancestor in the
    materialization lineage may interrupt; descendants of the target are kept."""
    root = _chain(kit)
    agent = root if ancestor == "root" else kit.live(ancestor)
    target = "B" if ancestor == "A" or ancestor == "root" else "C"
    kit.rt.subagents.interrupt(kit.sid(target), AncestorAuthority(agent))
    assert kit.script.notes.has("cancelled", target)
    below = "C" if target == "B" else None
    if below is not None:  # B's published child keeps running, resident
        c_act = kit.act("C")
        assert c_act is not None and not c_act.agent.disposed
        assert ("cancelled", "C") not in kit.script.notes.items()
        kit.gate("c").release()
        kit.wait_settled("C", epochs=1)
        assert [e.stop_reason for e in kit.ends("C")] == ["completed"]
    kit.script.release_all()
    kit.wait_settled("A", epochs=1)


def test_wrong_or_stale_authority_is_refused(kit: Kit) -> None:
    """R-INT-3, R-INT-4, R-INT-5, R-INT-6, R-INT-7: a wrong parent address, a stale
    (disposed, unregistered or replaced) ancestor, the target itself, a sibling, a
    descendant or an unrelated agent raise UNAUTHORIZED from the call itself."""
    rt = kit.rt
    root = _chain(kit)
    stranger = kit.root("stranger")
    b_id = kit.sid("B")
    a, b, c = kit.live("A"), kit.live("B"), kit.live("C")
    # A sibling of B: start one under A from outside (A is the exact live parent).
    kit.start(a, [["block", "s"]], label="S")
    assert kit.gate("s").wait_reached(10)
    sibling = kit.live("S")
    wrong_addresses = [root.session_id, b_id, new_session_id(), "not-a-session-id"]
    for address in wrong_addresses:
        assert _refused(kit, b_id, UserAuthority(address)) == ErrorCode.UNAUTHORIZED, address
    for label, agent in (
        ("self", b),
        ("sibling", sibling),
        ("descendant", c),
        ("stranger", stranger),
    ):
        assert _refused(kit, b_id, AncestorAuthority(agent)) == ErrorCode.UNAUTHORIZED, label
    # Stale ancestors: the root unregistered, then disposed, then replaced.
    rt.agents._unregister(root)
    assert _refused(kit, b_id, AncestorAuthority(root)) == ErrorCode.UNAUTHORIZED
    root.dispose()
    assert _refused(kit, b_id, AncestorAuthority(root)) == ErrorCode.UNAUTHORIZED
    replacement = rt.agents.resume(root.session_id, options=AgentOptions(model="cmd"))
    assert rt.agents.is_live(replacement)
    assert _refused(kit, b_id, AncestorAuthority(root)) == ErrorCode.UNAUTHORIZED
    assert not [n for n in kit.script.notes.items() if n[0] == "cancelled"]
    assert not [e for e in kit.log("B") if isinstance(e, InterruptEvent)]
    for g in ("s", "c", "b", "a"):
        kit.gate(g).release()
    kit.wait_settled("A", epochs=1)


def test_admission_is_synchronous_and_does_not_wait_for_the_target(kit: Kit) -> None:
    """R-INT-7, R-INT-8: an admitted interrupt returns while the target's behaviour
    still ignores its signal; the abort is observed when the behaviour looks."""
    rt = kit.rt
    seen: list[bool] = []
    root = kit.root()
    child_id, _ = kit.start(root, [["hold", "g"], ["note", "after-hold"]], label="kid")
    assert kit.gate("g").wait_reached(10)
    child = kit.agent("kid")
    assert child is not None
    task = spawn(rt, rt.subagents.interrupt, child_id, UserAuthority(root.session_id))
    task.result(10)  # returned although the turn is still held
    assert not child.idle
    current = child._turns.current
    seen.append(current is not None and current.cancelled)
    kit.gate("g").release()
    kit.wait_settled("kid", epochs=1)
    assert seen == [True]
    assert [e.stop_reason for e in kit.ends("kid")] == ["cancelled"]


def test_interrupt_keeps_pending_work_and_never_requeues_claimed_work(kit: Kit) -> None:
    """R-INT-8, R-INT-9, R-INT-10, R-INT-11, R-INT-14: the interrupted turn ends
    cancelled; unclaimed messages run later in order on the same Agent and Activation;
    the interrupted message does not run again; repeating the interrupt is accepted
    and adds nothing to the inbox."""
    rt = kit.rt
    root = kit.root()
    child_id, first = kit.start(root, [["block", "g"]], label="kid")
    assert kit.gate("g").wait_reached(10)
    act = kit.act("kid")
    ids = [rt.subagents.followup(root, child_id, f"m{i}") for i in range(3)]
    for _ in range(3):
        rt.subagents.interrupt(child_id, UserAuthority(root.session_id))
    assert kit.script.notes.has("turn", "kid", "m2")
    assert kit.act("kid") is act or kit.epochs("kid") == 1
    kit.wait_settled("kid", epochs=1)
    assert kit.started_ids("kid") == [first, *ids]
    assert [e.stop_reason for e in kit.ends("kid")] == ["cancelled"] + ["completed"] * 3
    assert [t.content for t in kit.script.turns_of("kid")] == [[["block", "g"]], "m0", "m1", "m2"]
    assert len({id(t.agent) for t in kit.script.turns_of("kid")}) == 1
    assert sum(isinstance(e, MessageEvent) for e in kit.log("kid")) == 4
    rt.subagents.followup(root, child_id, "still accepts")
    kit.wait_settled("kid", epochs=2)


def test_interrupt_of_an_absent_target_is_an_accepted_no_op(kit: Kit) -> None:
    """R-INT-13: a settled, unknown or never-started target is accepted whatever the
    authority, loads and resumes nothing, and emits nothing."""
    rt = kit.rt
    store = kit.store
    root, stranger = kit.root(), kit.root("stranger")
    child_id, _ = kit.start(root, "hi", label="kid")
    kit.wait_settled("kid", epochs=1)
    events = len(kit.probe.events)
    log = kit.log("kid")
    store.reset_counts()
    for target in (child_id, new_session_id()):
        for authority in (
            UserAuthority(root.session_id),
            UserAuthority(stranger.session_id),
            AncestorAuthority(root),
            AncestorAuthority(stranger),
        ):
            rt.subagents.interrupt(target, authority)
    assert store.reads == [] and store.checkpoint_reads == 0
    assert len(kit.probe.events) == events
    assert kit.act("kid") is None and kit.agent("kid") is None
    assert kit.log("kid") == log


def test_interrupt_adds_no_message_to_an_idle_waiting_target(kit: Kit) -> None:
    """R-INT-11, R-INT-14: interrupting a waiting child (no open turn) delivers no
    content and starts no turn; it stays resident and waiting."""
    rt = kit.rt
    root = kit.root()
    root.followup([["start", "A", [["start", "B", [["block", "b"]]]]]])
    assert kit.gate("b").wait_reached(10)
    act = kit.act("A")
    assert act is not None and act.agent.wait_idle(10)
    for _ in range(2):
        rt.subagents.interrupt(kit.sid("A"), AncestorAuthority(root))
    kit.barrier()
    assert act.agent.idle and kit.act("A") is act
    assert len(kit.script.turns_of("A")) == 1
    kit.gate("b").release()
    kit.wait_settled("A", epochs=1)
    assert sum(isinstance(e, MessageEvent) for e in kit.log("A")) == 1


# -- the wake latch (L-6) ----------------------------------------------------------------


def test_waking_followup_during_cancellation_convergence_starts_its_turn(kit: Kit) -> None:
    """L-6: a follow-up accepted after the interrupt was issued but before the
    interrupted driver is idle starts its turn without another send."""
    rt = kit.rt
    root = kit.root()
    child_id, _ = kit.start(root, [["hold", "g"]], label="kid")  # ignores the signal
    assert kit.gate("g").wait_reached(10)
    rt.subagents.interrupt(child_id, UserAuthority(root.session_id))
    child = kit.agent("kid")
    assert child is not None and not child.idle  # the driver has not converged yet
    mid = rt.subagents.followup(root, child_id, "after the interrupt")
    kit.gate("g").release()
    assert kit.script.notes.has("turn", "kid", "after the interrupt")
    kit.wait_settled("kid", epochs=1)
    assert kit.started_ids("kid")[-1] == mid
    assert kit.ends("kid")[-1].stop_reason == "completed"


def test_top_level_message_during_cancellation_starts_its_turn(kit: Kit) -> None:
    """L-6 (ordinary session cancellation): a message a top-level agent accepts while
    its cancellation settles starts a turn without another send."""
    agent = kit.root()
    agent.followup([["hold", "g"]])
    assert kit.gate("g").wait_reached(10)
    agent.cancel("stop", keep_inbox=True)
    agent.followup("next")
    kit.gate("g").release()
    assert kit.script.notes.has("turn", "root", "next")
    assert agent.wait_idle(10)
