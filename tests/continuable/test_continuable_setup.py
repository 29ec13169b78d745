"""``register_continuable_setup``: contributions to continuable child scopes.

R-SETUP-1..7.
"""

from __future__ import annotations

from typing import Any

import greenlet
import pytest
from continuable_kit import Kit, spawn
from subagents.actors import AbortSignal, SubagentStartRequest
from subagents.protocol import ErrorCode, SubagentError


class Contribution:
    """Adds one tool; records installs (with where they ran) and releases."""

    def __init__(self, kit: Kit, tool: str) -> None:
        self.kit = kit
        self.tool = tool
        self.installs: list[dict[str, Any]] = []
        self.releases: list[str] = []
        self.fail_next = False
        self.caller: Any = None  # the greenlet materializing now (set by the test)

    def __call__(self, scope: Any) -> Any:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError(f"{self.tool} failed")
        self.installs.append(
            {
                "child": scope.child_id,
                "published": self.kit.rt.continuation.activation(scope.child_id) is not None,
                # Compared, never kept: a greenlet must not outlive its thread.
                "in-caller": greenlet.getcurrent() is self.caller,
            }
        )
        remove = scope.add_tool(self.tool, lambda turn: self.tool)

        def release() -> None:
            self.releases.append(str(scope.child_id))
            remove()

        return release


def _tools_of(kit: Kit, label: str) -> list[tuple[str, ...]]:
    return [t.tools for t in kit.script.turns_of(label)]


def test_contributions_install_synchronously_before_publication(kitp: Kit) -> None:
    """R-SETUP-1, R-SETUP-2, R-SETUP-4: several independent contributions install in
    every new and every cold-resumed Activation, in the materializing caller's own
    task, before publication and the first turn; each epoch's release follows it."""
    kit = kitp
    rt = kit.rt
    one, two = Contribution(kit, "alpha"), Contribution(kit, "beta")
    rt.subagents.register_continuable_setup(one)
    rt.subagents.register_continuable_setup(two)
    root = kit.root()
    one.caller = two.caller = greenlet.getcurrent()
    child_id, _ = kit.start(root, "hi", label="kid")
    kit.wait_settled("kid", epochs=1)

    def follow_up_here() -> Any:
        one.caller = two.caller = greenlet.getcurrent()
        try:
            return rt.subagents.followup(root, child_id, "again")
        finally:
            one.caller = two.caller = None

    spawn(rt, follow_up_here).result(10)
    kit.wait_settled("kid", epochs=2)
    for c in (one, two):
        assert [i["published"] for i in c.installs] == [False, False]
        assert [i["child"] for i in c.installs] == [child_id, child_id]
        assert [i["in-caller"] for i in c.installs] == [True, True]  # synchronously
        assert c.releases == [str(child_id)] * 2  # released with each epoch's scope
    assert all({"alpha", "beta"} <= set(tools) for tools in _tools_of(kit, "kid"))


def test_failed_contribution_on_cold_resume_rolls_back(kit: Kit) -> None:
    """R-SETUP-3, R-EVT-5: a contribution that raises during a cold resume fails the
    follow-up; the contribution installed before it is released, no Activation
    remains, and the child resumes normally later."""
    rt = kit.rt
    one, two = Contribution(kit, "alpha"), Contribution(kit, "beta")
    rt.subagents.register_continuable_setup(one)
    rt.subagents.register_continuable_setup(two)
    root = kit.root()
    child_id, _ = kit.start(root, "hi", label="kid")
    kit.wait_settled("kid", epochs=1)
    two.fail_next = True
    with pytest.raises(RuntimeError):
        rt.subagents.followup(root, child_id, "never")
    assert len(one.installs) == 2 and one.releases == [str(child_id)] * 2
    assert len(two.installs) == 1 and two.releases == [str(child_id)]
    assert kit.act("kid") is None and kit.agent("kid") is None and kit.epochs("kid") == 1
    rt.subagents.followup(root, child_id, "later")
    kit.wait_settled("kid", epochs=2)
    assert kit.contents("kid") == ["hi", "later"]


def test_contribution_is_released_when_the_forest_is_drained(kit: Kit) -> None:
    """R-SETUP-4: a drained child's contributions are released with its scope."""
    rt = kit.rt
    one = Contribution(kit, "alpha")
    rt.subagents.register_continuable_setup(one)
    root = kit.root()
    child_id, _ = kit.start(root, [["block", "g"]], label="kid")
    assert kit.gate("g").wait_reached(10)
    assert one.releases == []
    rt.subagents.drain_continuable_descendants([root])
    assert one.releases == [str(child_id)]


def test_late_registration_waits_for_the_next_activation(kit: Kit) -> None:
    """R-SETUP-5: a contribution registered while a child is resident does not reach
    that Activation; the child's next Activation gets it."""
    rt = kit.rt
    root = kit.root()
    child_id, _ = kit.start(root, [["block", "g"]], label="kid")
    assert kit.gate("g").wait_reached(10)
    late = Contribution(kit, "late")
    rt.subagents.register_continuable_setup(late)
    rt.subagents.followup(root, child_id, "same epoch")
    kit.gate("g").release()
    kit.wait_settled("kid", epochs=1)
    assert late.installs == []
    rt.subagents.followup(root, child_id, "next epoch")
    kit.wait_settled("kid", epochs=2)
    assert ["late" in tools for tools in _tools_of(kit, "kid")] == [False, False, True]


def test_disposing_a_registration_revokes_it_from_resident_children_at_once(kit: Kit) -> None:
    """R-SETUP-6: disposing the registration releases the contribution from every
    resident child before ``dispose()`` returns; later Activations lack it."""
    rt = kit.rt
    one = Contribution(kit, "alpha")
    registration = rt.subagents.register_continuable_setup(one)
    root = kit.root()
    ids = [kit.start(root, [["block", f"g{i}"]], label=f"kid{i}").child_id for i in range(2)]
    for i in range(2):
        assert kit.gate(f"g{i}").wait_reached(10)
    assert all("alpha" in kit.live(f"kid{i}")._extra_tools for i in range(2))
    registration.dispose()
    assert sorted(one.releases) == sorted(str(i) for i in ids)
    assert not any("alpha" in kit.live(f"kid{i}")._extra_tools for i in range(2))
    rt.subagents.followup(root, ids[0], "same epoch, after revocation")
    for i in range(2):
        kit.gate(f"g{i}").release()
        kit.wait_settled(f"kid{i}", epochs=1)
    rt.subagents.followup(root, ids[0], "next epoch")
    kit.wait_settled("kid0", epochs=2)
    assert ["alpha" in tools for tools in _tools_of(kit, "kid0")] == [True, False, False]
    assert sorted(one.releases) == sorted(str(i) for i in ids)  # no second release
    assert len(one.installs) == 2


def test_contributions_reach_only_continuable_children(kit: Kit) -> None:
    """R-SETUP-7: neither a top-level agent nor a one-shot child receives a
    contribution, and reporting is only available to continuable children."""
    rt = kit.rt
    one = Contribution(kit, "report_tool")
    rt.subagents.register_continuable_setup(one)
    root = kit.root()
    root.followup("top-level turn")
    assert root.wait_idle(10)
    run = rt.subagents.start(
        "local",
        SubagentStartRequest(
            parent=root,
            prompt=[["report", "waking", "from a one-shot"]],
            signal=AbortSignal.never(),
            model="cmd",
            label="oneshot",
        ),
    )
    run.result.get(10)
    run.dispose()
    child_id, _ = kit.start(root, "hi", label="kid")
    kit.wait_settled("kid", epochs=1)
    assert [i["child"] for i in one.installs] == [child_id]
    assert "report_tool" not in kit.script.turns_of("root")[0].tools
    assert "report_tool" not in kit.script.turns_of("oneshot")[0].tools
    assert "report_tool" in kit.script.turns_of("kid")[0].tools
    assert ("report-refused", "oneshot", ErrorCode.UNAUTHORIZED) in kit.script.notes.items()
    with pytest.raises(SubagentError) as err:
        rt.subagents.report_from(root, "top-level cannot report")
    assert err.value.code == ErrorCode.UNAUTHORIZED


def test_revocation_reaches_a_child_materializing_at_the_time(kit: Kit) -> None:
    """R-SETUP-6: a registration disposed while a child is being materialized (the
    contribution already installed, publication pending) does not survive into the
    published Activation: it is released and its tool is gone."""
    rt = kit.rt
    one = Contribution(kit, "alpha")
    registration = rt.subagents.register_continuable_setup(one)
    mat = kit.gate("materializing")
    rt.subagents.register_continuable_setup(lambda scope: mat.pass_through(None))
    root = kit.root()
    task = spawn(rt, kit.start, root, [["block", "g"]], "kid")
    assert mat.wait_reached(10)
    assert len(one.installs) == 1  # installed, not yet published
    registration.dispose()
    mat.release()
    child_id, _ = task.result(10)
    assert kit.gate("g").wait_reached(10)
    assert one.releases == [str(child_id)]
    assert "alpha" not in kit.live("kid")._extra_tools
    assert "alpha" not in kit.script.turns_of("kid")[0].tools
    kit.gate("g").release()
    kit.wait_settled("kid", epochs=1)
    assert one.releases == [str(child_id)]  # released once
