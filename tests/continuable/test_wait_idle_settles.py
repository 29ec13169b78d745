"""``Runtime.wait_idle`` returns once what idleness set off is done: a child that
settles on going idle has settled.

R-RES-3, R-RES-5, R-LIST-7, R-DUR-3. Idle came first, the settling after it (the
supervisor retires the child, the registry closes it, the supervisor disposes
it): a script that listed the tree after ``wait_idle`` saw the child ``running``,
and one that closed the runtime then disposed it without its checkpoint.
"""

from __future__ import annotations

from typing import Any

import pytest
from continuable_kit import CountingStore, Kit
from subagents.actors import Runtime
from subagents.actors._kernel import Gate
from subagents.actors._kernel._backend import Backend
from subagents.protocol import SessionId


def _activity(rt: Runtime, parent: Any, child: SessionId) -> str:
    rows = [row for row in rt.subagents.list_children(parent.session_id) if row.id == child]
    assert len(rows) == 1, rows
    return str(rows[0].activity)


def test_a_child_whose_retirement_is_held_is_waited_for(
    kitp: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The supervisor's retirement of the idle child waits at a gate: ``wait_idle``
    does not return before it is let through, and once it has, the child is gone
    from the registry, listed ``inactive`` and its checkpoint stored. What the
    waiter saw is taken the moment ``wait_idle`` returned, in the waiter."""
    rt = kitp.rt
    root = kitp.root()
    child = kitp.start(root, "hi", label="kid").child_id
    assert rt.wait_idle(10)  # settled once: the next follow-up resumes it
    hooks = rt.continuation._hooks
    gate, retire = Gate("retire"), hooks.retire

    def held(activation: Any) -> None:
        if activation.child_id == child:
            gate.pass_through()
        retire(activation)

    monkeypatch.setattr(hooks, "retire", held)
    rt.subagents.followup(root, child, "again")
    seen: dict[str, Any] = {}

    def waiter() -> None:
        seen["ok"] = rt.wait_idle(30)
        seen["live"] = rt.agents.get(child)
        seen["activity"] = _activity(rt, root, child)

    task = rt.backend.spawn(waiter, name="waiter")
    assert gate.wait_reached(30)
    gate.release()
    assert task.join(30) is not False
    assert seen == {"ok": True, "live": None, "activity": "inactive"}
    rt.sessions.flush()
    assert rt.store is not None and rt.store.get_checkpoint(child) is not None


def test_many_children_are_settled_each_time_wait_idle_returns(kitp: Kit) -> None:
    """A race loop: follow-ups to three children, ``wait_idle``, and each child is
    released and listed ``inactive`` -- twenty rounds."""
    rt = kitp.rt
    root = kitp.root()
    kids = [kitp.start(root, "hi", label=f"kid{i}").child_id for i in range(3)]
    for round_ in range(20):
        for kid in kids:
            rt.subagents.followup(root, kid, f"round {round_}")
        assert rt.wait_idle(30)
        for kid in kids:
            assert rt.agents.get(kid) is None, round_
            assert _activity(rt, root, kid) == "inactive", round_


def test_a_waiting_parent_settles_after_its_last_child(kitp: Kit) -> None:
    """A child that started a grandchild waits while it is resident; once the
    grandchild settled, the child settles too: ``wait_idle`` returns after both."""
    rt = kitp.rt
    root = kitp.root()
    kitp.start(root, [["start", "grandkid", "hello"]], label="kid")
    assert rt.wait_idle(30)
    for label in ("kid", "grandkid"):
        assert rt.agents.get(kitp.sid(label)) is None, label
        assert kitp.act(label) is None, label


def test_a_child_kept_warm_is_not_waited_for(backend: Backend) -> None:
    """``keep_warm`` holds a settled child resident: ``wait_idle`` returns with it
    live (it does not wait out the warmth)."""
    with Runtime(CountingStore(), backend=backend, keep_warm=3600) as rt:
        kit = Kit(rt)
        try:
            root = kit.root()
            child = kit.start(root, "hi", label="kid").child_id
            assert rt.wait_idle(10)
            live = rt.agents.get(child)
            assert live is not None and live.idle
        finally:
            kit.close()
