"""``report_from``: child-to-parent delivery, quiet and waking.

R-REP-1..8.
"""

from __future__ import annotations

import inspect
from typing import Any

import pytest
from continuable_kit import Kit
from subagents.actors import AbortController, AbortSignal, AgentOptions, SubagentStartRequest
from subagents.protocol import ErrorCode, MessageSource, SubagentError, TurnStart


def _refused(kit: Kit, child: Any, content: Any = "r", **kw: Any) -> str:
    with pytest.raises(SubagentError) as err:
        kit.rt.subagents.report_from(child, content, **kw)
    return err.value.code


def test_waking_report_is_one_later_parent_turn(kit: Kit) -> None:
    """R-REP-1, R-REP-3, R-REP-6, R-REP-7: a waking report returns a stable id and
    submits exactly one later turn of the durable direct parent carrying it (never
    the open turn), sourced from the child; the caller cannot pick a recipient."""
    assert "recipient" not in inspect.signature(kit.rt.subagents.report_from).parameters
    root = kit.root()
    root.followup([["start", "kid", [["report", "waking", "progress"]]], ["block", "root"]])
    assert kit.gate("root").wait_reached(10)  # the parent's turn is open
    assert kit.script.notes.wait_for(lambda n: any(x[0] == "reported" for x in n))
    (mid,) = [n[2] for n in kit.script.notes.items() if n[0] == "reported"]
    open_turn = kit.script.turns_of("root")[0]
    kit.gate("root").release()
    assert kit.script.notes.has("turn", "root", "progress")
    assert root.wait_idle(10)
    turns = kit.script.turns_of("root")
    assert [(t.content, t.kind) for t in turns] == [
        (open_turn.content, "message"),
        ("progress", "report"),
    ]
    assert "progress" not in open_turn.context
    starts = [e for e in kit.log(root.session_id) if isinstance(e, TurnStart)]
    assert [s.message_ids for s in starts][1] == (mid,)
    (report,) = kit.reports(root.session_id)
    child_id = kit.sid("kid")
    assert report.message_id == mid and report.delivery == "waking"
    assert report.source == MessageSource(kind="child", session_id=child_id)
    assert kit.reports(child_id) == []


def test_quiet_report_is_context_for_the_next_turn(kit: Kit) -> None:
    """R-REP-5: a quiet report starts no parent turn; the parent's next turn sees it."""
    root = kit.root()
    root.followup([["start", "kid", [["report", "quiet", "fyi"]]]])
    assert kit.script.notes.wait_for(lambda n: any(x[0] == "reported" for x in n))
    kit.wait_settled("kid", epochs=1)
    assert root.wait_idle(10)
    assert len(kit.script.turns_of("root")) == 1  # no turn of its own
    root.followup("next")
    assert kit.script.notes.has("turn", "root", "next")
    assert root.wait_idle(10)
    assert kit.script.turns_of("root")[-1].context == ("fyi",)
    (report,) = kit.reports(root.session_id)
    assert report.delivery == "quiet" and report.content == "fyi"


def test_quiet_report_reaches_a_continuable_parent_next_turn_across_epochs(kit: Kit) -> None:
    """R-REP-5: the quiet report is kept for the parent's next turn even when the
    (continuable) parent leaves residency before that turn and is cold-resumed."""
    rt = kit.rt
    root = kit.root()
    root.followup([["start", "P", [["start", "kid", [["report", "quiet", "fyi"]]]]]])
    assert kit.script.notes.wait_for(lambda n: any(x[0] == "reported" for x in n))
    kit.wait_settled("kid", epochs=1)
    kit.wait_settled("P", epochs=1)
    rt.subagents.followup(root, kit.sid("P"), "next")
    kit.wait_settled("P", epochs=2)
    assert [t.context for t in kit.script.turns_of("P")][-1] == ("fyi",)


def test_only_the_exact_live_continuable_child_may_report(kit: Kit) -> None:
    """R-REP-2, R-REP-7: a stale child Agent from an earlier epoch, a one-shot child
    and a top-level agent are refused; reporting grants the child no authority."""
    rt = kit.rt
    root = kit.root()
    child_id, _ = kit.start(root, "hi", label="kid")
    kit.wait_settled("kid", epochs=1)
    stale = kit.script.turns_of("kid")[0].agent
    rt.subagents.followup(root, child_id, [["block", "g"]])
    assert kit.gate("g").wait_reached(10)
    live = kit.agent("kid")
    assert live is not None and live is not stale
    assert _refused(kit, stale) == ErrorCode.UNAUTHORIZED
    run = rt.subagents.start(
        "local",
        SubagentStartRequest(
            parent=root, prompt=[["block", "one"]], signal=AbortSignal.never(), model="cmd"
        ),
    )
    assert kit.gate("one").wait_reached(10)
    assert _refused(kit, run.local_agent) == ErrorCode.UNAUTHORIZED
    assert _refused(kit, root) == ErrorCode.UNAUTHORIZED
    mid = rt.subagents.report_from(live, "from the live child")
    # Having reported, the child still cannot follow up its parent.
    with pytest.raises(SubagentError) as err:
        rt.subagents.followup(live, root.session_id, "orders")
    assert err.value.code == ErrorCode.UNAUTHORIZED
    kit.gate("one").release()
    run.result.get(10)
    run.dispose()
    kit.gate("g").release()
    kit.wait_settled("kid", epochs=2)
    root.followup("see")
    assert root.wait_idle(10)
    assert [r.message_id for r in kit.reports(root.session_id)] == [mid]


@pytest.mark.parametrize("parent_state", ["disposed", "unregistered", "replaced"])
def test_report_needs_a_live_direct_parent_and_is_not_kept(kit: Kit, parent_state: str) -> None:
    """R-REP-4: when the direct parent is not live the report raises and nothing is
    kept for later delivery (a replacement parent never receives it)."""
    rt = kit.rt
    root = kit.root()
    kit.start(root, [["block", "g"]], label="kid")
    assert kit.gate("g").wait_reached(10)
    child = kit.agent("kid")
    if parent_state == "unregistered":
        rt.agents._unregister(root)
    else:
        root.dispose()
    assert _refused(kit, child, "lost", delivery="waking") == ErrorCode.UNAUTHORIZED
    assert _refused(kit, child, "lost too", delivery="quiet") == ErrorCode.UNAUTHORIZED
    if parent_state == "unregistered":
        root.dispose()
    replacement = rt.agents.resume(root.session_id, options=AgentOptions(model="cmd"))
    replacement.followup("hello")
    assert replacement.wait_idle(10)
    assert kit.reports(root.session_id) == []
    assert [t.context for t in kit.script.turns_of("root") if t.agent is replacement] == [()]
    kit.gate("g").release()
    kit.wait_settled("kid", epochs=1)


def test_report_signal_covers_admission_only(kit: Kit) -> None:
    """R-REP-8, R-ERR-6: an aborted signal raises CANCELLED and delivers nothing; one
    aborted after acceptance changes nothing."""
    root = kit.root()
    kit.start(root, [["block", "g"]], label="kid")
    assert kit.gate("g").wait_reached(10)
    child = kit.live("kid")
    for delivery in ("quiet", "waking"):
        code = _refused(kit, child, "nope", delivery=delivery, signal=AbortSignal.aborted_with("x"))
        assert code == ErrorCode.CANCELLED
    controller = AbortController()
    mid = kit.rt.subagents.report_from(child, "yes", delivery="waking", signal=controller.signal)
    controller.abort("too late")
    assert kit.script.notes.has("turn", "root", "yes")
    assert root.wait_idle(10)
    assert [r.message_id for r in kit.reports(root.session_id)] == [mid]
    kit.gate("g").release()
    kit.wait_settled("kid", epochs=1)
