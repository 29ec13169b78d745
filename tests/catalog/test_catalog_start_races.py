"""A listing meets a one-shot start that is not done yet (R-LIST-7, R-LIST-16: a
running candidate without an identity yet is omitted; R-ONE-4, R-ONE-19, R-ERR-6:
a start rolled back leaves nothing behind).

* A child created after the listing took its live set and before it read the
  store was taken for a settled child with no identity: a ``corrupt`` diagnostic
  for a running child (a one-shot descriptor is logged in its first turn).
* A child live when the listing took its live set, then rolled back (its start
  aborted), was an ``unavailable`` diagnostic of an id that no longer exists.
* A rollback whose child's turn outlived the cancel left the child's session in
  persistence (and ``start`` raised ``TIMEOUT``, not ``CANCELLED``).

Each forced: the listing stops before its store read (a hooked store), the start
at its provider's ``published`` step (the child live, its prompt not delivered).
"""

from __future__ import annotations

from typing import Any

import pytest
from subagents.actors import (
    AbortController,
    AbortSignal,
    LocalProvider,
    Runtime,
    SubagentStartRequest,
)
from subagents.actors._children import _providers
from subagents.actors.testing import Call, Gate, ScriptedBehaviour
from subagents.protocol import ErrorCode, SubagentError

pytestmark = pytest.mark.timeout(60)

WAIT = 20.0


class _Held(LocalProvider):
    """Stops at its ``published`` step (the child created and live, its prompt not
    delivered) until released; then aborts ``abort`` when given."""

    def __init__(self, rt: Runtime, abort: AbortController | None = None) -> None:
        super().__init__(rt, "held")
        self.gate = Gate("published")
        self.abort = abort
        self.child_id: Any = None

    def _step(self, step: str) -> None:
        if step == "published":
            children = [a for a in self._runtime.agents.list() if a.header.origin == "subagent"]
            self.child_id = children[-1].session_id
            self.gate.pass_through(timeout=WAIT)
            if self.abort is not None:
                self.abort.abort("user stop")


def _scan_held(rt: Runtime) -> Gate:
    """The listing's next store scan stops at the gate returned."""
    gate = Gate("scan")
    store: Any = rt.store
    hooked = [False]

    def hold(*_args: Any) -> None:
        if not hooked[0]:
            hooked[0] = True
            gate.pass_through(timeout=WAIT)

    for method in ("scan_children", "scan_headers", "scan_children_with"):
        store.hooks[method] = hold
    return gate


@pytest.mark.parametrize("api", ["list_children", "list_descendants"])
def test_a_child_created_as_a_listing_runs_is_not_called_corrupt(rtp: Runtime, api: str) -> None:
    rt = rtp
    provider = _Held(rt)
    rt.subagents.register_provider(provider)
    parent = rt.spawn("echo")
    scan = _scan_held(rt)
    listed: list[Any] = []
    listing = rt.backend.spawn(lambda: listed.append(getattr(rt.subagents, api)(parent.session_id)))
    assert scan.wait_reached(WAIT)  # its live set taken: no child yet
    runs: list[Any] = []
    request = SubagentStartRequest(parent=parent, prompt="go", signal=AbortSignal.never())
    starting = rt.backend.spawn(lambda: runs.append(rt.subagents.start("held", request)))
    assert provider.gate.wait_reached(WAIT)
    child = provider.child_id
    rt.sessions.flush(child)  # its header in the store
    scan.release()
    assert listing.join(WAIT)
    provider.gate.release()
    assert starting.join(WAIT)
    runs[0].result.get(WAIT)
    runs[0].dispose()
    (found,) = listed
    assert not any(d.id == child for d in found.diagnostics), found.diagnostics


def test_a_start_rolled_back_as_a_listing_runs_leaves_no_diagnostic(rtp: Runtime) -> None:
    rt = rtp
    controller = AbortController()
    provider = _Held(rt, abort=controller)
    rt.subagents.register_provider(provider)
    parent = rt.spawn("echo")
    errors: list[SubagentError] = []

    def start() -> None:
        request = SubagentStartRequest(parent=parent, prompt="go", signal=controller.signal)
        try:
            rt.subagents.start("held", request)
        except SubagentError as exc:
            errors.append(exc)

    starting = rt.backend.spawn(start)
    assert provider.gate.wait_reached(WAIT)  # the child live, its start not returned
    scan = _scan_held(rt)
    listed: list[Any] = []
    listing = rt.backend.spawn(lambda: listed.append(rt.subagents.list_children(parent.session_id)))
    assert scan.wait_reached(WAIT)  # its live set taken: the child in it
    provider.gate.release()  # aborted: rolled back, deleted
    assert starting.join(WAIT)
    assert [e.code for e in errors] == [ErrorCode.CANCELLED]
    scan.release()
    assert listing.join(WAIT)
    (found,) = listed
    assert found.rows == () and found.diagnostics == (), found


class _AbortOnceRunning(LocalProvider):
    """Aborts the start once the child's turn runs (before ``start`` returns)."""

    def __init__(self, rt: Runtime, controller: AbortController, running: Gate) -> None:
        super().__init__(rt, "abort-once-running")
        self.controller, self.running = controller, running
        self.child: Any = None

    def _step(self, step: str) -> None:
        if step == "delivered":
            self.child = [a for a in self._runtime.agents.list() if a.header.origin == "subagent"][
                -1
            ]
            assert self.running.wait_reached(WAIT)
            self.controller.abort("user stop")


def test_a_rollback_whose_turn_outlives_the_cancel_still_deletes_the_child(
    rtp: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = rtp
    monkeypatch.setattr(_providers, "ROLLBACK_TIMEOUT", 0.2)  # the turn surely outlives it
    stubborn = Gate("stubborn")  # waited without the turn's signal
    rt.models.register(
        "stubborn",
        lambda _o: ScriptedBehaviour([Call(lambda turn: stubborn.pass_through(timeout=WAIT))]),
    )
    controller = AbortController()
    provider = _AbortOnceRunning(rt, controller, stubborn)
    rt.subagents.register_provider(provider)
    parent = rt.spawn("echo")
    request = SubagentStartRequest(
        parent=parent, prompt="go", model="stubborn", signal=controller.signal
    )
    with pytest.raises(SubagentError) as info:
        rt.subagents.start("abort-once-running", request)
    assert info.value.code == ErrorCode.CANCELLED
    stubborn.release()  # the turn ends at last
    assert provider.child.wait_disposed(WAIT)
    rt.sessions.flush()
    store: Any = rt.store
    assert store.header(provider.child.session_id) is None
    listing = rt.subagents.list_children(parent.session_id)
    assert listing.rows == () and listing.diagnostics == ()
