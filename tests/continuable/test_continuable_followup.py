"""``followup``: authority, FIFO delivery, routing by residency, cold resume.

R-FUP-1..16, R-EVT-2, R-EVT-9, R-RES-1.
"""

from __future__ import annotations

from typing import Any

import pytest
from continuable_kit import Kit, spawn
from subagents.actors import (
    AbortController,
    AbortSignal,
    Agent,
    AgentOptions,
    ContinuableStartSpec,
    LocalProvider,
    Runtime,
)
from subagents.actors._children._admission import Registry
from subagents.protocol import (
    ErrorCode,
    MessageEvent,
    MessageSource,
    SessionHeader,
    SubagentDescriptorEvent,
    SubagentError,
    new_session_id,
)
from subagents.supervision import residency


class CountingProvider(LocalProvider):
    def __init__(self, runtime: Runtime, name: str) -> None:
        super().__init__(runtime, name)
        self.calls: list[str] = []

    def prepare_continuable(self, request: Any) -> Any:
        self.calls.append("prepare_continuable")
        return super().prepare_continuable(request)

    def start(self, request: Any, descriptor: Any) -> Any:
        self.calls.append("start")
        return super().start(request, descriptor)


def _refused(rt: Runtime, caller: Any, child_id: Any, content: Any = "intruder", **kw: Any) -> str:
    with pytest.raises(SubagentError) as err:
        rt.subagents.followup(caller, child_id, content, **kw)
    return err.value.code


def _resume_top_level(rt: Runtime, agent: Agent) -> Agent:
    """Replace a disposed top-level agent by a new Agent for the same session."""
    return rt.agents.resume(agent.session_id, options=AgentOptions(model="cmd"))


# -- acceptance and FIFO ---------------------------------------------------------------


def test_followups_are_accepted_in_fifo_order_as_later_turns(kit: Kit) -> None:
    """R-FUP-1, R-FUP-5, R-FUP-6: each follow-up returns its accepted id and becomes
    exactly one later turn of the running child, in acceptance order; a message
    accepted during the open turn is not visible within it."""
    root = kit.root()
    child_id, first = kit.start(root, [["block", "g"]], label="kid")
    assert kit.gate("g").wait_reached(10)
    ids = [kit.rt.subagents.followup(root, child_id, f"m{i}") for i in range(5)]
    assert len(set(ids)) == 5
    kit.gate("g").release()
    kit.wait_settled("kid", epochs=1)  # all in the same residency epoch
    assert kit.started_ids("kid") == [first, *ids]
    turns = kit.script.turns_of("kid")
    assert [t.content for t in turns] == [[["block", "g"]], "m0", "m1", "m2", "m3", "m4"]
    assert len({id(t.agent) for t in turns}) == 1
    assert [e.stop_reason for e in kit.ends("kid")] == ["completed"] * 6


# -- authority -----------------------------------------------------------------------


def _family(kit: Kit) -> dict[str, Agent]:
    """root -> A -> {B1 -> C, B2}; B1, B2, C and A blocked at gates of their names."""
    root = kit.root()
    root.followup(
        [
            [
                "start",
                "A",
                [
                    ["start", "B1", [["start", "C", [["block", "c"]]], ["block", "b1"]]],
                    ["start", "B2", [["block", "b2"]]],
                    ["block", "a"],
                ],
            ]
        ]
    )
    for g in ("a", "b1", "b2", "c"):
        assert kit.gate(g).wait_reached(10)
    agents = {label: kit.live(label) for label in ("A", "B1", "B2", "C")}
    agents["root"] = root
    agents["stranger"] = kit.root("stranger")
    return agents


def test_only_the_exact_live_direct_parent_may_follow_up(kit: Kit) -> None:
    """R-FUP-2: a sibling, a grandparent, the child itself, its own child or an
    unrelated agent is refused (UNAUTHORIZED), whether the child is resident or
    absent, and nothing is delivered."""
    rt = kit.rt
    fam = _family(kit)
    b1 = kit.sid("B1")
    callers = ["B2", "root", "B1", "C", "stranger"]
    for label in callers:
        assert _refused(rt, fam[label], b1) == ErrorCode.UNAUTHORIZED, label
    # Absent: let C and then B1 settle (A stays, blocked, owning B2).
    kit.gate("c").release()
    kit.gate("b1").release()
    kit.wait_settled("B1", epochs=1)
    for label in callers:
        if label in ("B1", "C"):  # their agents are gone now: stale callers
            assert fam[label].disposed
        assert _refused(rt, fam[label], b1) == ErrorCode.UNAUTHORIZED, label
    assert kit.epochs("B1") == 1
    assert "intruder" not in kit.contents("B1")
    rt.subagents.followup(fam["A"], b1, "from A")  # the direct parent is accepted
    kit.wait_settled("B1", epochs=2)
    assert kit.contents("B1")[-1] == "from A"
    assert "intruder" not in kit.contents("B1")


@pytest.mark.parametrize("staleness", ["disposed", "unregistered", "replaced"])
@pytest.mark.parametrize("resident", [True, False], ids=["resident", "absent"])
def test_stale_parent_is_refused(kit: Kit, staleness: str, resident: bool) -> None:
    """R-FUP-3: a disposed, unregistered or replaced parent is refused; an Agent that
    replaced it for the same session is the exact live parent."""
    rt = kit.rt
    root = kit.root()
    prompt = [["block", "g"]] if resident else "hi"
    child_id, _ = kit.start(root, prompt, label="kid")
    if resident:
        assert kit.gate("g").wait_reached(10)
    else:
        kit.wait_settled("kid", epochs=1)
    replacement = None
    if staleness == "unregistered":
        rt.agents._unregister(root)
    else:
        root.dispose()
        if staleness == "replaced":
            replacement = _resume_top_level(rt, root)
    assert _refused(rt, root, child_id) == ErrorCode.UNAUTHORIZED
    if resident:
        kit.gate("g").release()
    kit.wait_settled("kid", epochs=1)
    assert "intruder" not in kit.contents("kid")
    if replacement is not None:
        rt.subagents.followup(replacement, child_id, "from the replacement")
        kit.wait_settled("kid", epochs=2)
        assert kit.contents("kid")[-1] == "from the replacement"
    if staleness == "unregistered":
        root.dispose()


def test_source_is_recorded_and_grants_nothing(kit: Kit) -> None:
    """R-FUP-4: ``source`` is stored with the message; naming the parent as source
    does not let another agent follow up."""
    rt = kit.rt
    root, stranger = kit.root(), kit.root("stranger")
    child_id, _ = kit.start(root, [["block", "g"]], label="kid")
    assert kit.gate("g").wait_reached(10)
    posing = MessageSource(kind="parent", session_id=root.session_id)
    assert _refused(rt, stranger, child_id, source=posing) == ErrorCode.UNAUTHORIZED
    human = MessageSource(kind="user", session_id=None)
    rt.subagents.followup(root, child_id, "typed by a human", source=human)
    rt.subagents.followup(root, child_id, "default source")
    kit.gate("g").release()
    kit.wait_settled("kid", epochs=1)
    messages = [e for e in kit.log("kid") if isinstance(e, MessageEvent)]
    assert [(m.content, m.source) for m in messages[1:]] == [
        ("typed by a human", human),
        ("default source", MessageSource(kind="parent", session_id=root.session_id)),
    ]


# -- routing by residency ----------------------------------------------------------------


def test_waiting_activation_wakes_the_same_agent(kit: Kit) -> None:
    """R-FUP-7, R-EVT-2, R-RES-2: a follow-up to a waiting child wakes the same Agent
    in the same Activation; no new Activation and no new ``subagent/start``."""
    rt = kit.rt
    root = kit.root()
    root.followup([["start", "A", [["start", "B", [["block", "b"]]]]]])
    assert kit.gate("b").wait_reached(10)
    a_id = kit.sid("A")
    act = kit.act("A")
    assert act is not None and act.agent.wait_idle(10)
    kit.barrier()
    assert residency(act) == "waiting" and rt.agents.is_live(act.agent)
    rt.subagents.followup(root, a_id, "wake up")
    assert kit.script.notes.has("turn", "A", "wake up")
    assert kit.act("A") is act
    assert [t.agent for t in kit.script.turns_of("A")] == [act.agent, act.agent]
    assert kit.epochs("A") == 1
    kit.gate("b").release()
    kit.wait_settled("A", epochs=1)


def test_absent_child_cold_resumes_with_its_history(kitp: Kit) -> None:
    """R-FUP-8, R-EVT-2: a follow-up to an absent child materializes a new Activation
    with a newly rebuilt Agent; the message runs as its next turn and the earlier
    turns are in its history."""
    kit = kitp
    rt = kit.rt
    histories: list[list[Any]] = []
    kit.script.on_turn = lambda turn: histories.append(
        [e.content for e in turn.history if isinstance(e, MessageEvent)]
    )
    root = kit.root()
    child_id, _ = kit.start(root, "one", label="kid")
    kit.wait_settled("kid", epochs=1)
    rt.subagents.followup(root, child_id, "two")
    kit.wait_settled("kid", epochs=2)
    rt.subagents.followup(root, child_id, "three")
    kit.wait_settled("kid", epochs=3)
    turns = kit.script.turns_of("kid")
    assert [t.index for t in turns] == [0, 1, 2]
    assert len({id(t.agent) for t in turns}) == 3  # a new Agent per epoch
    assert histories == [[], ["one"], ["one", "two"]]
    run_ids = [e.run_id for e in kit.events_of("kid", "subagent/start")]
    assert len(set(run_ids)) == 3
    assert len(kit.script.created) == 4  # root + one behaviour per epoch


def test_cold_resume_rebuilds_from_the_descriptor_without_the_provider(kitp: Kit) -> None:
    """R-FUP-9, R-FUP-10, R-EVT-9: cold resume calls no provider method and works after
    the provider's registration is disposed; the behaviour is rebuilt from the
    recorded model, the recorded persona and tool filter apply again, and the epoch's
    events name the provider recorded at creation."""
    kit = kitp
    rt = kit.rt
    provider = CountingProvider(rt, "custom")
    registration = rt.subagents.register_provider(provider)
    built: list[AgentOptions] = []

    def persona_model(options: AgentOptions) -> Any:
        built.append(options)
        return lambda turn: {"persona": turn.persona, "tools": list(turn.tools)}

    rt.models.register("persona-model", persona_model)
    for name in ("t1", "t2"):
        rt.tools.register(name, lambda turn: None)
    root = kit.root()
    spec = ContinuableStartSpec(
        parent=root,
        provider="custom",
        prompt="first",
        label="kid",
        model="persona-model",
        persona="stern",
        tool_filter=("t1",),
    )
    child_id, _ = rt.subagents.start_continuable(spec)
    kit.wait_settled(child_id, epochs=1)
    registration.dispose()
    assert rt.subagents.get_provider("custom") is None
    rt.subagents.followup(root, child_id, "second")
    kit.wait_settled(child_id, epochs=2)
    assert provider.calls == ["prepare_continuable"]  # from the start only
    assert [(o.model, o.persona, o.tool_filter) for o in built] == [
        ("persona-model", "stern", ("t1",))
    ] * 2
    outputs = [e.output for e in kit.ends(child_id)]
    assert outputs == [{"persona": "stern", "tools": ["t1"]}] * 2
    assert [e.provider for e in kit.events_of(child_id)] == ["custom"] * 4


def test_cold_resume_needs_persistence(kit: Kit) -> None:
    """R-FUP-11: with no persistence for this operation, a follow-up to an absent
    child raises and creates no Activation."""
    rt = kit.rt
    root = kit.root()
    child_id, _ = kit.start(root, "hi", label="kid")
    kit.wait_settled("kid", epochs=1)
    store = rt.sessions.persistence
    rt.sessions.persistence = None
    try:
        assert _refused(rt, root, child_id) == ErrorCode.PERSISTENCE_UNAVAILABLE
    finally:
        rt.sessions.persistence = store
    assert kit.act("kid") is None and kit.agent("kid") is None
    assert kit.epochs("kid") == 1
    rt.subagents.followup(root, child_id, "with persistence again")
    kit.wait_settled("kid", epochs=2)


def test_a_followup_to_an_unknown_child_without_a_store_names_it(backend: Any) -> None:
    """R-FUP-11, R-ERR-1: on a runtime with no store, a follow-up to an id no live
    child has is ``PERSISTENCE_UNAVAILABLE`` (a cold resume would need a store)
    and says which id it looked for (it said only that a resume needs a store)."""
    with Runtime(None, backend=backend) as rt:
        root = rt.spawn("echo")
        with pytest.raises(SubagentError) as err:
            rt.subagents.followup(root, "ab" * 16, "hello")
        assert err.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
        assert "ab" * 16 in str(err.value) and "no store" in str(err.value)


def test_unauthorized_followup_to_an_absent_child_loads_nothing(kit: Kit) -> None:
    """R-FUP-12: authority is checked before reconstruction: no log or checkpoint is
    read, no behaviour built, no Activation, no event."""
    rt = kit.rt
    store = kit.store
    root, stranger = kit.root(), kit.root("stranger")
    child_id, _ = kit.start(root, "hi", label="kid")
    kit.wait_settled("kid", epochs=1)
    built = len(kit.script.created)
    events = len(kit.probe.events)
    store.reset_counts()
    for caller in (stranger, kit.agent("kid") or stranger):
        assert _refused(rt, caller, child_id) == ErrorCode.UNAUTHORIZED
    assert store.reads == [] and store.checkpoint_reads == 0
    assert len(kit.script.created) == built
    assert len(kit.probe.events) == events
    assert kit.act("kid") is None and kit.agent("kid") is None


@pytest.mark.parametrize("how", ["disposed", "replaced"])
@pytest.mark.parametrize("where", ["model-factory", "setup"])
def test_parent_gone_during_cold_resume_is_refused(kitp: Kit, where: str, how: str) -> None:
    """R-FUP-13, R-EVT-5: the parent is disposed or replaced while the child is being
    materialized (forced: reconstruction blocks at a gate in the model factory or in
    a setup contribution); the final admission re-checks authority, so the follow-up
    raises UNAUTHORIZED, nothing is delivered and no Activation remains."""
    kit = kitp
    rt = kit.rt
    root = kit.root()
    child_id, _ = kit.start(root, "hi", label="kid")
    kit.wait_settled("kid", epochs=1)
    log_before = kit.log("kid")
    mat = kit.gate("materializing")
    armed = [True]

    def block(*_: Any) -> None:
        if armed[0]:
            armed[0] = False
            mat.pass_through(None)

    if where == "model-factory":
        kit.script.on_create = block
    else:
        rt.subagents.register_continuable_setup(lambda scope: block())
    task = spawn(rt, rt.subagents.followup, root, child_id, "too late")
    assert mat.wait_reached(10)
    root.dispose()
    replacement = _resume_top_level(rt, root) if how == "replaced" else None
    mat.release()
    error = task.error(10)
    assert isinstance(error, SubagentError) and error.code == ErrorCode.UNAUTHORIZED
    assert kit.act("kid") is None and kit.agent("kid") is None
    assert kit.epochs("kid") == 1  # no subagent/start for the rolled-back epoch
    assert kit.log("kid") == log_before
    assert "too late" not in [t.content for t in kit.script.turns]
    if replacement is not None:
        rt.subagents.followup(replacement, child_id, "from the replacement")
        kit.wait_settled("kid", epochs=2)
        assert kit.contents("kid") == ["hi", "from the replacement"]


def test_signal_covers_lookup_materialization_and_admission_only(kitp: Kit) -> None:
    """R-FUP-14, R-ERR-6: an abort before acceptance raises CANCELLED and delivers
    nothing (resident child, and mid-materialization of an absent one); an abort
    after acceptance neither cancels the turn nor disposes the child."""
    kit = kitp
    rt = kit.rt
    root = kit.root()
    child_id, _ = kit.start(root, [["block", "g"]], label="kid")
    assert kit.gate("g").wait_reached(10)
    aborted = AbortSignal.aborted_with("no")
    assert _refused(rt, root, child_id, signal=aborted) == ErrorCode.CANCELLED
    # Abort after acceptance: the accepted turn still runs and completes.
    controller = AbortController()
    rt.subagents.followup(root, child_id, "accepted", signal=controller.signal)
    controller.abort("caller left")
    kit.gate("g").release()
    kit.wait_settled("kid", epochs=1)
    assert [
        (t.content, e.stop_reason) for t, e in zip(kit.script.turns_of("kid"), kit.ends("kid"))
    ] == [
        ([["block", "g"]], "completed"),
        ("accepted", "completed"),
    ]
    # Abort during the materialization of a cold resume.
    mat = kit.gate("materializing")
    controller = AbortController()
    kit.script.on_create = lambda options: mat.pass_through(None)
    task = spawn(
        rt, lambda: rt.subagents.followup(root, child_id, "never", signal=controller.signal)
    )
    assert mat.wait_reached(10)
    controller.abort("caller left")
    mat.release()
    error = task.error(10)
    assert isinstance(error, SubagentError) and error.code == ErrorCode.CANCELLED
    kit.script.on_create = None
    assert kit.act("kid") is None and kit.agent("kid") is None and kit.epochs("kid") == 1
    assert "never" not in kit.contents("kid")
    rt.subagents.followup(root, child_id, "after")
    kit.wait_settled("kid", epochs=2)
    assert kit.contents("kid") == [[["block", "g"]], "accepted", "after"]


def test_cold_resumed_child_is_owned_again_before_it_runs(kit: Kit) -> None:
    """R-FUP-15, R-RES-1, R-RES-4: a continuable parent re-owns its cold-resumed child
    before the child's turn runs, and the admission in flight keeps the parent
    resident even when its last other child settles meanwhile."""
    rt = kit.rt
    root = kit.root()
    root.followup([["start", "A", [["start", "B1", [["block", "b1"]]], ["start", "B2", "hi"]]]])
    assert kit.gate("b1").wait_reached(10)
    assert kit.script.notes.has("started", "A", "B2")
    kit.wait_settled("B2", epochs=1)
    a = kit.agent("A")
    act_a = kit.act("A")
    assert a is not None and act_a is not None
    owned_when_running: list[bool] = []

    def on_turn(turn: Any) -> None:
        if turn.agent.label == "B2":
            parent_act = rt.continuation.activation(turn.agent.parent_session)
            owned_when_running.append(
                parent_act is act_a and turn.agent.session_id in parent_act.owned
            )

    kit.script.on_turn = on_turn
    mat = kit.gate("materializing")
    kit.script.on_create = lambda options: mat.pass_through(None)
    task = spawn(rt, rt.subagents.followup, a, kit.sid("B2"), "again")
    assert mat.wait_reached(10)
    kit.script.on_create = None
    kit.gate("b1").release()  # A's only resident child settles during the admission
    kit.wait_settled("B1", epochs=1)
    kit.barrier()
    assert kit.act("A") is act_a and rt.agents.is_live(a)  # still resident
    mat.release()
    task.result(10)
    kit.wait_settled("B2", epochs=2)
    assert owned_when_running == [True]
    kit.wait_settled("A", epochs=1)
    assert a.disposed


@pytest.mark.parametrize("variant", ["corrupt", "unsupported", "missing"])
def test_child_without_descriptor_identity_is_not_resumed(kitp: Kit, variant: str) -> None:
    """R-FUP-16, R-EVT-5: a persisted child whose descriptor folds to no identity
    (malformed, unsupported version, or missing) raises on cold resume without
    creating an Activation or emitting events."""
    kit = kitp
    rt = kit.rt
    store = rt.store
    assert store is not None
    root = kit.root()
    if variant == "missing":
        child_id = new_session_id()
        store.create_session(
            SessionHeader(
                id=child_id,
                parent_session=root.session_id,
                origin="subagent",
                delegation_depth=1,
                created_at=rt.clock(),
                label="kid",
            ),
            [],
        )
    else:
        child_id, _ = kit.start(root, "hi", label="kid")
        kit.wait_settled("kid", epochs=1)
        payload: dict[str, Any] = (
            {"v": 1, "mode": "continuable", "provider": "local"}  # no agent_options
            if variant == "corrupt"
            else {"v": 999, "mode": "continuable"}
        )
        store.append(child_id, [SubagentDescriptorEvent(payload=payload)])
    events = len(kit.probe.events)
    built = len(kit.script.created)
    with pytest.raises(SubagentError):
        rt.subagents.followup(root, child_id, "x")
    assert rt.continuation.activation(child_id) is None and rt.agents.get(child_id) is None
    assert len(kit.probe.events) == events
    assert len(kit.script.created) == built
    assert child_id not in rt.sessions.live_ids()


def test_abort_while_waiting_for_another_materialization(
    kit: Kit, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-FUP-14, R-ERR-6: a follow-up queued behind another materialization of the
    same child raises CANCELLED as soon as its signal aborts, while that other
    materialization is still blocked; it delivers nothing."""
    rt = kit.rt
    root = kit.root()
    child_id, _ = kit.start(root, "hi", label="kid")
    kit.wait_settled("kid", epochs=1)
    mat = kit.gate("materializing")
    armed = [True]

    def block(options: Any) -> None:
        if armed[0]:
            armed[0] = False
            mat.pass_through(None)

    kit.script.on_create = block
    wait_behind = Registry._wait_behind

    def noted(self: Registry, act: Any, request: Any) -> None:
        wait_behind(self, act, request)  # queued behind the materialization in flight
        kit.script.notes.add("reserve-wait")

    monkeypatch.setattr(Registry, "_wait_behind", noted)
    first = spawn(rt, rt.subagents.followup, root, child_id, "first")
    assert mat.wait_reached(10)
    controller = AbortController()
    second = spawn(
        rt, lambda: rt.subagents.followup(root, child_id, "second", signal=controller.signal)
    )
    assert kit.script.notes.has("reserve-wait")  # queued behind the first materialization
    controller.abort("caller left")
    error = second.error(5)
    assert isinstance(error, SubagentError) and error.code == ErrorCode.CANCELLED
    assert not first.done()  # ... while the first is still blocked
    mat.release()
    first.result(10)
    kit.wait_settled("kid", epochs=2)
    assert kit.contents("kid") == ["hi", "first"]
