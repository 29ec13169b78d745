"""``start_continuable``: acceptance, rollback, prerequisites, the provider capability.

R-CONT-1..11, R-CAP-7..10, R-EVT-5, R-EVT-7.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
from continuable_kit import Kit, spawn
from subagents.actors import (
    AbortController,
    AbortSignal,
    ContinuableCreateSpec,
    ContinuableHandle,
    ContinuableStartSpec,
    LocalProvider,
    RunResult,
    Runtime,
    SubagentRun,
    SubagentStartRequest,
)
from subagents.protocol import (
    ErrorCode,
    MessageEvent,
    MessageSource,
    SessionId,
    SubagentDescriptorEvent,
    SubagentError,
    TurnEnd,
    TurnStart,
    new_message_id,
)


class RecordingProvider(LocalProvider):
    """A local provider that records every call and can return a seed."""

    def __init__(self, runtime: Runtime, name: str = "rec", seed: tuple[Any, ...] = ()) -> None:
        super().__init__(runtime, name)
        self.calls: list[str] = []
        self.seed = seed
        self.fail_prepare = False

    def prepare_continuable(self, request: ContinuableStartSpec) -> ContinuableCreateSpec:
        self.calls.append("prepare_continuable")
        if self.fail_prepare:
            raise RuntimeError("prepare failed")
        if self.seed:
            return ContinuableCreateSpec(seed=self.seed)
        return super().prepare_continuable(request)

    def start(self, request: Any, descriptor: Any) -> SubagentRun:
        self.calls.append("start")
        return super().start(request, descriptor)


class OneShotOnly:
    """A provider without ``prepare_continuable`` (one-shot only)."""

    name = "oneshot-only"
    capabilities: frozenset[str] = frozenset()
    inherits_parent_context = False

    def __init__(self, runtime: Runtime) -> None:
        self.inner = LocalProvider(runtime, "oneshot-only")
        self.calls: list[str] = []

    def start(self, request: Any, descriptor: Any) -> SubagentRun:
        self.calls.append("start")
        return self.inner.start(request, descriptor)


def _snapshot(kit: Kit) -> dict[str, Any]:
    """Everything a failed start must leave unchanged."""
    rt = kit.rt
    rt.sessions.flush()
    assert rt.store is not None
    return {
        "live": sorted(rt.sessions.live_ids()),
        "persisted": sorted(h.id for h in rt.store.all_headers()),
        "agents": sorted(a.session_id for a in rt.agents.list()),
        "activations": sorted(a.child_id for a in rt.continuation.activations()),
        "owned": sorted(
            (a.child_id, tuple(sorted(a.owned))) for a in rt.continuation.activations()
        ),
        "events": len(kit.probe.events),
    }


# -- acceptance ----------------------------------------------------------------------


def test_start_returns_ids_on_acceptance_without_waiting_for_the_turn(
    kit: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-CONT-1, R-CONT-2, R-CONT-7, R-CONT-8, R-EVT-7: the call returns the
    ``(child_id, message_id)`` NamedTuple while the child's behaviour is blocked;
    the message id is the one its first turn claims; no SubagentRun is made."""
    runs: list[Any] = []
    original = SubagentRun.__init__

    def counting_init(self: SubagentRun, **kw: Any) -> None:
        runs.append(kw)
        original(self, **kw)

    monkeypatch.setattr(SubagentRun, "__init__", counting_init)
    root = kit.root()
    handle = kit.start(root, [["block", "g"]], label="kid")
    assert isinstance(handle, ContinuableHandle) and isinstance(handle, tuple)
    assert handle._fields == ("child_id", "message_id")
    child_id, message_id = handle
    assert isinstance(child_id, SessionId)
    assert kit.gate("g").wait_reached(10)  # the turn runs after start returned
    child = kit.agent("kid")
    assert child is not None and not child.idle
    header = child.header
    assert header.parent_session == root.session_id and header.origin == "subagent"
    kit.gate("g").release()
    kit.wait_settled("kid", epochs=1)
    assert kit.started_ids("kid") == [message_id]
    assert runs == []  # no SubagentRun, no Task, no result wrapper
    starts = kit.events_of("kid", "subagent/start")
    assert [e.local for e in starts] == [True]
    assert [e.mode for e in starts] == ["continuable"]


def test_start_does_not_wait_for_the_session_log(kit: Kit) -> None:
    """R-CONT-2: acceptance does not wait for the prompt to reach persistence."""
    store = kit.store
    parked = kit.gate("store")

    def before_create(header: Any, events: Any) -> None:
        if header.origin == "subagent":
            parked.pass_through(None)

    store.before_create = before_create
    root = kit.root()
    task = spawn(kit.rt, kit.start, root, "hi", "kid")
    child_id, _ = task.result(10)
    assert parked.wait_reached(10)
    assert store.header(child_id) is None  # not persisted yet
    parked.release()
    kit.wait_settled(child_id, epochs=1)
    assert kit.persisted(child_id)


# -- rollback ------------------------------------------------------------------------


FAULTS = ["prepare", "model", "setup", "abort", "parent-gone"]


@pytest.mark.parametrize("fault", FAULTS)
def test_failure_before_acceptance_rolls_back_entirely(kit: Kit, fault: str) -> None:
    """R-CONT-3, R-CONT-10, R-SETUP-3, R-EVT-5, R-ERR-6: a failure before inbox
    acceptance raises, yields no ids, and leaves no session (live or persisted), no
    agent, no Activation, no owned entry, no installed contribution, no event."""
    rt = kit.rt
    provider = RecordingProvider(rt)
    rt.subagents.register_provider(provider)
    root = kit.root()
    parent = root
    if fault != "parent-gone":
        # A continuable parent, so an owned entry could leak.
        kit.start(root, [["block", "parent"]], label="P")
        assert kit.gate("parent").wait_reached(10)
        parent = kit.live("P")
    controller = AbortController()
    installed: list[str] = []
    released: list[str] = []

    def first(scope: Any) -> Any:
        if scope.child_id != kit.ids.get("P"):
            installed.append(str(scope.child_id))
        return lambda: released.append(str(scope.child_id))

    def second(scope: Any) -> Any:
        if fault == "setup":
            raise RuntimeError("contribution failed")
        if fault == "abort":
            controller.abort("caller gave up")
        if fault == "parent-gone":
            parent.dispose()
        return None

    if fault == "prepare":
        provider.fail_prepare = True
    if fault == "model":

        def broken(options: Any) -> Any:
            raise RuntimeError("model factory failed")

        rt.models.register("broken", broken)
    before = _snapshot(kit)
    rt.subagents.register_continuable_setup(first)
    rt.subagents.register_continuable_setup(second)
    spec = ContinuableStartSpec(
        parent=parent,
        provider="rec",
        prompt="never runs",
        label="doomed",
        model="broken" if fault == "model" else "cmd",
        signal=controller.signal,
    )
    with pytest.raises(Exception) as err:
        rt.subagents.start_continuable(spec)
    if fault == "abort":
        assert isinstance(err.value, SubagentError) and err.value.code == ErrorCode.CANCELLED
    if fault == "parent-gone":
        assert isinstance(err.value, SubagentError) and err.value.code == ErrorCode.UNAUTHORIZED
    after = _snapshot(kit)
    if fault == "parent-gone":
        before["live"].remove(root.session_id)
        before["agents"].remove(root.session_id)
    assert after == before
    assert sorted(released) == sorted(installed)  # every installed contribution released
    if fault in ("setup", "abort", "parent-gone"):
        assert len(installed) == 1
    assert not [t for t in kit.script.turns if t.content == "never runs"]


def test_pre_aborted_signal_raises_cancelled_before_any_work(kit: Kit) -> None:
    """R-CONT-10, R-ERR-6: an already aborted signal raises CANCELLED, no provider work."""
    provider = RecordingProvider(kit.rt)
    kit.rt.subagents.register_provider(provider)
    root = kit.root()
    before = _snapshot(kit)
    spec = ContinuableStartSpec(
        parent=root, provider="rec", prompt="x", label="kid", signal=AbortSignal.aborted_with("no")
    )
    with pytest.raises(SubagentError) as err:
        kit.rt.subagents.start_continuable(spec)
    assert err.value.code == ErrorCode.CANCELLED
    assert provider.calls == []
    assert _snapshot(kit) == before


def test_caller_abort_after_acceptance_changes_nothing(kit: Kit) -> None:
    """R-CONT-9: after acceptance the caller's signal neither cancels the accepted
    turn nor disposes the child; it still accepts follow-ups."""
    controller = AbortController()
    root = kit.root()
    child_id, _ = kit.start(root, [["block", "g"]], label="kid", signal=controller.signal)
    assert kit.gate("g").wait_reached(10)
    child = kit.agent("kid")
    controller.abort("caller went away")
    kit.gate("g").release()
    kit.wait_settled("kid", epochs=1)
    assert child is not None and child.disposed  # settled normally (leaf), not cancelled
    assert [e.stop_reason for e in kit.ends("kid")] == ["completed"]
    assert [e.stop_reason for e in kit.events_of("kid", "subagent/end")] == ["completed"]
    kit.rt.subagents.followup(root, child_id, "later")
    kit.wait_settled("kid", epochs=2)
    assert kit.contents("kid")[-1] == "later"


# -- prerequisites -------------------------------------------------------------------


def test_start_requires_persistence(rt: Runtime) -> None:
    """R-CONT-4: without session persistence start_continuable raises before any child."""
    provider = RecordingProvider(rt)
    rt.subagents.register_provider(provider)
    root = rt.spawn("echo")
    with pytest.raises(SubagentError) as err:
        rt.subagents.start_continuable(
            ContinuableStartSpec(parent=root, provider="rec", prompt="x", label="kid")
        )
    assert err.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
    assert provider.calls == []
    assert rt.sessions.live_ids() == [root.session_id]
    assert rt.agents.list() == [root]
    assert rt.continuation.activations() == []


def test_start_and_followup_require_the_agent_registry(kit: Kit) -> None:
    """R-CONT-5: without the agent registry both raise before any child is touched."""
    rt = kit.rt
    provider = RecordingProvider(rt)
    rt.subagents.register_provider(provider)
    root = kit.root()
    child_id, _ = kit.start(root, "hi", label="kid")
    kit.wait_settled("kid", epochs=1)
    before = _snapshot(kit)
    agents = rt.agents
    rt.agents = None  # type: ignore[assignment]
    try:
        with pytest.raises(SubagentError) as err:
            rt.subagents.start_continuable(
                ContinuableStartSpec(parent=root, provider="rec", prompt="x", label="k2")
            )
        assert err.value.code == ErrorCode.AGENT_REGISTRY_UNAVAILABLE
        with pytest.raises(SubagentError) as err:
            rt.subagents.followup(root, child_id, "again")
        assert err.value.code == ErrorCode.AGENT_REGISTRY_UNAVAILABLE
    finally:
        rt.agents = agents
    assert provider.calls == []
    assert _snapshot(kit) == before
    assert kit.contents("kid") == ["hi"]


# -- ordering of materialization ---------------------------------------------------------


def test_prompt_is_submitted_only_after_the_activation_is_complete(kit: Kit) -> None:
    """R-CONT-6, R-RES-4, R-SETUP-1: when the first turn runs, the child's Activation
    holds its agent, the continuable parent already owns it, the descriptor is in the
    log, and setup contributions are installed."""
    rt = kit.rt
    seen: dict[str, Any] = {}

    def contribution(scope: Any) -> Any:
        seen.setdefault("published-at-install", []).append(
            rt.continuation.activation(scope.child_id) is not None
        )
        return scope.add_tool("probe_tool", lambda turn: "ok")

    rt.subagents.register_continuable_setup(contribution)

    def on_turn(turn: Any) -> None:
        if turn.agent.label != "B" or "B" in seen:
            return
        sid = turn.agent.session_id
        act = rt.continuation.activation(sid)
        parent_act = rt.continuation.activation(turn.agent.parent_session)
        log = [r.event for r in rt.sessions.read(sid)]
        seen["B"] = {
            "activation-holds-agent": act is not None and act.agent is turn.agent,
            "owned-by-parent": parent_act is not None and sid in parent_act.owned,
            "descriptor-first": isinstance(log[0], SubagentDescriptorEvent)
            and isinstance(log[1], TurnStart),
            "tool": "probe_tool" in turn.tools,
        }

    kit.script.on_turn = on_turn
    root = kit.root()
    root.followup([["start", "A", [["start", "B", [["note", "b"]]], ["block", "a"]]]])
    assert kit.script.notes.has("note", "B", "b")
    assert seen["B"] == {
        "activation-holds-agent": True,
        "owned-by-parent": True,
        "descriptor-first": True,
        "tool": True,
    }
    assert seen["published-at-install"] == [False, False]  # installed before publication
    kit.gate("a").release()
    kit.wait_settled("A", epochs=1)


# -- one Activation per child -----------------------------------------------------------


@pytest.mark.parametrize("rounds", [6])
def test_concurrent_admissions_never_make_two_activations(kitp: Kit, rounds: int) -> None:
    """R-CONT-11, R-FUP-5: many tasks following up one absent child at once never
    produce two Activations or two resident agents; every follow-up is delivered
    exactly once."""
    kit = kitp
    rt = kit.rt
    root = kit.root()
    child_id, first = kit.start(root, "hi", label="kid")
    kit.wait_settled("kid", epochs=1)
    resident: list[Any] = []
    overlap: list[str] = []
    registry = rt.agents
    original_register = registry._register

    def register(agent: Any) -> None:
        if agent.session_id == child_id:
            if any(not a.disposed for a in resident):
                overlap.append(f"second agent registered while {resident} resident")
            resident.append(agent)
        original_register(agent)

    registry._register = register  # type: ignore[method-assign]
    open_epochs: list[int] = [0]

    counting = threading.Lock()  # a start and an end may be heard on two threads

    def count(event: Any) -> None:
        if event.child_id != str(child_id):
            return
        with counting:
            open_epochs[0] += 1 if event.type == "subagent/start" else -1
            if open_epochs[0] > 1:
                overlap.append("two epochs open")

    rt.subagents.subscribe(count)
    accepted: list[Any] = [first]
    tasks_per_round = 12
    for r in range(rounds):
        go = kit.gate(f"go{r}")

        def follow(i: int, go: Any = go, r: int = r) -> Any:
            go.pass_through(None)
            return rt.subagents.followup(root, child_id, f"r{r}-{i}")

        tasks = [spawn(rt, follow, i) for i in range(tasks_per_round)]
        go.release()
        accepted.extend(t.result(30) for t in tasks)
        if r % 2:
            kit.wait_settled("kid")  # alternate: some rounds race settlement too
    kit.wait_settled("kid")
    registry._register = original_register  # type: ignore[method-assign]
    assert overlap == []
    ids = kit.started_ids("kid")
    assert sorted(ids) == sorted(accepted) and len(set(ids)) == len(ids)
    assert len(accepted) == 1 + rounds * tasks_per_round
    assert sum(isinstance(e, MessageEvent) for e in kit.log("kid")) == len(accepted)


# -- the continuable capability ---------------------------------------------------------


def test_provider_without_prepare_continuable_is_refused(kit: Kit) -> None:
    """R-CAP-7: naming a provider without ``prepare_continuable`` raises before any
    session, agent or Activation exists."""
    provider = OneShotOnly(kit.rt)
    kit.rt.subagents.register_provider(provider)
    root = kit.root()
    before = _snapshot(kit)
    with pytest.raises(SubagentError) as err:
        kit.rt.subagents.start_continuable(
            ContinuableStartSpec(parent=root, provider="oneshot-only", prompt="x", label="k")
        )
    assert err.value.code == ErrorCode.CONTINUABLE_UNSUPPORTED
    assert provider.calls == []
    assert _snapshot(kit) == before


def test_continuable_provider_still_serves_one_shot(kit: Kit) -> None:
    """R-CAP-8, R-CAP-9: a provider with ``prepare_continuable`` serves ``start``; a
    continuable start calls only ``prepare_continuable`` (never ``start``) and gets
    back data only."""
    rt = kit.rt
    provider = RecordingProvider(rt)
    rt.subagents.register_provider(provider)
    root = kit.root()
    run = rt.subagents.start(
        "rec", SubagentStartRequest(parent=root, prompt="one", signal=AbortSignal.never())
    )
    assert run.result.get(10) == RunResult("one", None, "completed")
    run.dispose()
    assert provider.calls == ["start"]
    provider.calls.clear()
    child_id, _ = kit.start(root, "hi", label="kid", provider="rec")
    kit.wait_settled("kid", epochs=1)
    rt.subagents.followup(root, child_id, "again")
    kit.wait_settled("kid", epochs=2)
    assert provider.calls == ["prepare_continuable"]
    assert [f.name for f in dataclasses.fields(ContinuableCreateSpec)] == ["seed"]
    spec = provider.prepare_continuable(
        ContinuableStartSpec(parent=root, provider="rec", prompt="x", label="k")
    )
    assert isinstance(spec, ContinuableCreateSpec) and spec.seed is None
    assert not any(callable(getattr(spec, f.name)) for f in dataclasses.fields(spec))


def test_seed_is_the_first_part_of_the_child_log(kitp: Kit) -> None:
    """R-CAP-10: a provider's seed precedes the child's own descriptor, survives
    cold resume, and the child's turns are numbered after it."""
    kit = kitp
    rt = kit.rt
    at = rt.clock()
    mid = new_message_id()
    seed = (
        TurnStart(turn=0, at=at, message_ids=(mid,)),
        MessageEvent(message_id=mid, content="ancestor work", source=MessageSource(kind="user")),
        TurnEnd(turn=0, at=at, stop_reason="completed", output="ancestor output"),
    )
    rt.subagents.register_provider(RecordingProvider(rt, seed=seed))
    root = kit.root()
    child_id, _ = kit.start(root, "first", label="kid", provider="rec")
    kit.wait_settled("kid", epochs=1)
    rt.subagents.followup(root, child_id, "second")
    kit.wait_settled("kid", epochs=2)
    log = kit.log("kid")
    assert log[:3] == list(seed)
    assert isinstance(log[3], SubagentDescriptorEvent)
    assert [e.turn for e in log if isinstance(e, TurnStart)] == [0, 1, 2]
    assert [t.index for t in kit.script.turns_of("kid")] == [1, 2]
