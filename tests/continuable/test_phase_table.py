"""The lifecycle table (``subagents.supervision._phase``), checked two ways.

First the table itself: every transition it lists, every one it does not, and the
predicates derived from it. Then the runtime against the table: a real child is
brought into each phase and a follow-up, an interrupt and a report are tried on
it; what happens must be what the phase's row says (R-FUP-1, R-FUP-2, R-FUP-3,
R-INT-1, R-INT-5, R-REP-1, R-DRAIN-1, R-RES-3).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from continuable_kit import Kit, spawn
from subagents.actors import AbortController, UserAuthority
from subagents.protocol import ErrorCode, InterruptEvent, SubagentError
from subagents.supervision import (
    FOLLOW_UP,
    INTERRUPTIBLE,
    MAY_REPORT,
    MAY_SETTLE,
    TRANSITIONS,
    VISIBLE,
    Phase,
    Route,
    Trigger,
    advance,
)

# -- the table -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("phase", "trigger"), list(itertools.product(Phase, Trigger)), ids=lambda v: v.name
)
def test_advance_follows_the_table_and_refuses_the_rest(phase: Phase, trigger: Trigger) -> None:
    """Every listed transition is taken; any other is an ``INTERNAL`` error (a bug,
    never a user error) and changes nothing."""
    after = TRANSITIONS.get((phase, trigger))
    if after is not None:
        assert advance(phase, trigger) is after
    else:
        with pytest.raises(SubagentError) as err:
            advance(phase, trigger)
        assert err.value.code == ErrorCode.INTERNAL


def test_every_phase_is_reachable_and_released_is_final() -> None:
    reached = {Phase.RESERVED}
    frontier = [Phase.RESERVED]
    while frontier:
        here = frontier.pop()
        for (src, _), dst in TRANSITIONS.items():
            if src is here and dst not in reached:
                reached.add(dst)
                frontier.append(dst)
    assert reached == set(Phase)
    assert not [t for (src, t) in TRANSITIONS if src is Phase.RELEASED]


def test_the_predicates_derive_from_one_row_per_phase() -> None:
    """Each phase routes a follow-up one way; a phase that admits follow-ups (or is
    closed by a drain) is visible, interruptible, may report and may settle; the
    phases in flight (reserved, settling) make a follow-up wait."""
    assert set(FOLLOW_UP) == set(Phase)
    resident = {p for p, r in FOLLOW_UP.items() if r in (Route.ENQUEUE, Route.CLOSED)}
    assert resident == VISIBLE == INTERRUPTIBLE == MAY_REPORT == MAY_SETTLE
    assert {p for p, r in FOLLOW_UP.items() if r is Route.WAIT} == {
        Phase.RESERVED,
        Phase.SETTLING,
    }
    assert FOLLOW_UP[Phase.RELEASED] is Route.RESUME


# -- the runtime against the table ----------------------------------------------------


@dataclass
class Staged:
    """A child held in one phase; ``leave()`` lets it go on."""

    child_id: Any
    agent: Any
    leave: Callable[[], None]


def _phase_of(kit: Kit, child_id: Any) -> Phase:
    act = kit.rt.continuation._index.get(child_id)
    return Phase.RELEASED if act is None else act.phase


def _resident(kit: Kit, root: Any) -> Staged:
    child_id, _ = kit.start(root, [["block", "busy"]], label="kid")
    assert kit.gate("busy").wait_reached(10)
    return Staged(child_id, kit.live("kid"), kit.gate("busy").release)


def _released(kit: Kit, root: Any) -> Staged:
    child_id, _ = kit.start(root, "hi", label="kid")
    kit.wait_settled("kid", epochs=1)
    return Staged(child_id, None, lambda: None)


def _reserved(kit: Kit, root: Any) -> Staged:
    staged = _released(kit, root)
    mat = kit.gate("materializing")
    armed = [True]

    def block(_options: Any) -> None:
        if armed[0]:
            armed[0] = False
            mat.pass_through(None)

    kit.script.on_create = block
    first = spawn(kit.rt, kit.rt.subagents.followup, root, staged.child_id, "first")
    assert mat.wait_reached(10)

    def leave() -> None:
        mat.release()
        first.result(10)

    return Staged(staged.child_id, None, leave)


def _draining(kit: Kit, root: Any) -> Staged:
    child_id, _ = kit.start(root, [["block_slow", "busy", "hold"]], label="kid")
    assert kit.gate("busy").wait_reached(10)
    agent = kit.live("kid")
    drain = spawn(kit.rt, kit.rt.subagents.drain_continuable_descendants, [root])
    assert kit.script.notes.has("cancelled", "kid")

    def leave() -> None:
        kit.gate("hold").release()
        drain.result(20)

    return Staged(child_id, agent, leave)


def _settling(kit: Kit, root: Any) -> Staged:
    store = kit.store
    parked = kit.gate("store")
    child_id, _ = kit.start(root, [["block", "busy"]], label="kid")
    assert kit.gate("busy").wait_reached(10)
    agent = kit.live("kid")
    store.before_append = lambda sid, _e: parked.pass_through(None) if sid == child_id else None
    kit.gate("busy").release()
    assert parked.wait_reached(10)  # its final flush waits for the store: still settling

    def leave() -> None:
        store.before_append = None
        parked.release()

    return Staged(child_id, agent, leave)


STAGES: dict[Phase, Callable[[Kit, Any], Staged]] = {
    Phase.RESERVED: _reserved,
    Phase.RESIDENT: _resident,
    Phase.DRAINING: _draining,
    Phase.SETTLING: _settling,
    Phase.RELEASED: _released,
}


@pytest.fixture
def staged(kit: Kit, request: pytest.FixtureRequest) -> Iterator[tuple[Phase, Staged, Any]]:
    phase: Phase = request.param
    root = kit.root()
    stage = STAGES[phase](kit, root)
    kit.barrier()
    if phase is Phase.SETTLING:
        assert kit.script.notes.wait_for(lambda _n: _phase_of(kit, stage.child_id) is phase)
    assert _phase_of(kit, stage.child_id) is phase
    try:
        yield phase, stage, root
    finally:
        stage.leave()


@pytest.mark.parametrize("staged", list(Phase), ids=lambda p: p.name, indirect=True)
def test_a_followup_goes_where_the_phase_routes_it(kit: Kit, staged: Any) -> None:
    """R-FUP-1, R-FUP-2, R-FUP-3, R-DRAIN-1: enqueue into the resident inbox, wait
    behind a materialization or a settlement, refuse below a cutoff, or resume."""
    phase, stage, root = staged
    route = FOLLOW_UP[phase]
    rt = kit.rt
    if route is Route.CLOSED:
        with pytest.raises(SubagentError) as err:
            rt.subagents.followup(root, stage.child_id, "late")
        assert err.value.code == ErrorCode.ADMISSION_CLOSED
        return
    if route is Route.WAIT:
        controller = AbortController()
        waiting = spawn(
            rt,
            lambda: rt.subagents.followup(root, stage.child_id, "queued", signal=controller.signal),
        )
        assert not waiting.join(0.3), "a follow-up overtook the phase in flight"
        stage.leave()
        stage.leave = lambda: None
        waiting.result(10)
        kit.wait_settled("kid")
        assert "queued" in kit.contents("kid")
        return
    epochs = kit.epochs("kid")
    rt.subagents.followup(root, stage.child_id, "next")
    stage.leave()
    stage.leave = lambda: None
    kit.wait_settled("kid")
    assert kit.contents("kid")[-1] == "next"
    new_epoch = kit.epochs("kid") > epochs
    assert new_epoch is (route is Route.RESUME)


@pytest.mark.parametrize("staged", list(Phase), ids=lambda p: p.name, indirect=True)
def test_an_interrupt_reaches_the_agent_only_where_the_phase_allows(kit: Kit, staged: Any) -> None:
    """R-INT-1, R-INT-5: a resident (or draining) child's turn is interrupted and the
    interrupt recorded in its log; in any other phase the target is absent and the
    interrupt an accepted no-op that records nothing."""
    phase, stage, root = staged
    kit.rt.subagents.interrupt(stage.child_id, UserAuthority(root.session_id))
    logged = [
        r.event for r in kit.rt.sessions.read(stage.child_id) if isinstance(r.event, InterruptEvent)
    ]
    if phase in INTERRUPTIBLE:
        assert [e.authority for e in logged] == ["user"]
        current = stage.agent._turns.current
        assert current is not None and current.cancelled
    else:
        assert logged == []


@pytest.mark.parametrize("staged", list(Phase), ids=lambda p: p.name, indirect=True)
def test_a_report_is_accepted_only_where_the_phase_allows(kit: Kit, staged: Any) -> None:
    """R-REP-1: the exact live child reports while resident (or draining); a child
    on its way out (settling) may not, and a reserved or released one has no agent."""
    phase, stage, _root = staged
    if stage.agent is None:
        assert phase not in MAY_REPORT
        return
    if phase in MAY_REPORT:
        assert kit.rt.subagents.report_from(stage.agent, "note")
    else:
        with pytest.raises(SubagentError) as err:
            kit.rt.subagents.report_from(stage.agent, "note")
        assert err.value.code == ErrorCode.UNAUTHORIZED
