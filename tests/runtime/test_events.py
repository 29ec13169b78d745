"""Lifecycle events and listener containment (R-EVT)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
from typing import Any

from subagents.actors import (
    AbortSignal,
    LocalProvider,
    RunResult,
    Runtime,
    SubagentRun,
    SubagentStartRequest,
)
from subagents.actors._kernel._future import ResultFuture
from subagents.actors.testing import Block, Gate, LifecycleProbe, ScriptedBehaviour


def _req(parent, prompt="task", **kw) -> SubagentStartRequest:
    return SubagentStartRequest(parent=parent, prompt=prompt, signal=AbortSignal.never(), **kw)


class SettledProvider(LocalProvider):
    """Returns a run whose result is already settled when start returns."""

    def start(self, request, descriptor):
        run = super().start(request, descriptor)
        run.result.wait(10)
        return run


class RemoteProvider:
    """An out-of-process-style provider: no local agent, a provider-minted id."""

    name = "remote"
    capabilities = frozenset()
    inherits_parent_context = False

    def start(self, request, descriptor):
        result: ResultFuture[RunResult] = ResultFuture()
        result.set_result(RunResult("remote says hi", None, "completed"))
        return SubagentRun(
            id=f"remote:{request.parent.session_id}:1",
            local_agent=None,
            result=result,
            dispose=lambda t: None,
        )


def test_start_then_end_once_per_run(rt: Runtime) -> None:
    """R-EVT-1, R-EVT-6, R-EVT-7, R-EVT-3: one start and one end per run, same
    service-minted run_id, local flag from the local agent."""
    probe = LifecycleProbe(rt)
    parent = rt.spawn("echo")
    runs = [rt.subagents.start("local", _req(parent, i)) for i in range(5)]
    for run in runs:
        run.result.get(10)
        run.dispose()
    assert probe.wait_for(lambda evs: sum(e.type == "subagent/end" for e in evs) == 5)
    by_run: dict = {}
    for e in probe.events:
        by_run.setdefault(e.run_id, []).append(e)
    assert len(by_run) == 5
    for run, (rid, pair) in zip(runs, by_run.items()):
        assert [e.type for e in pair] == ["subagent/start", "subagent/end"]
        assert all(e.local is True and e.provider == "local" and e.mode == "one-shot" for e in pair)
        assert pair[0].child_id == str(run.id) and rid not in {str(run.id), "local"}
        assert set(vars(type(pair[0]))["__slots__"]) == set(vars(type(pair[1]))["__slots__"])
    assert [e.stop_reason for rid in by_run for e in by_run[rid] if e.type == "subagent/end"] == [
        "completed"
    ] * 5


def test_already_settled_run_still_starts_first(rt: Runtime) -> None:
    """R-EVT-4: start precedes end even when the child settled before start returned."""
    rt.subagents.register_provider(SettledProvider(rt, "settled"))
    probe = LifecycleProbe(rt)
    parent = rt.spawn("echo")
    for _ in range(20):
        run = rt.subagents.start("settled", _req(parent))
        assert run.result.done()
        assert probe.types()[-2:] == ["subagent/start", "subagent/end"]
        run.dispose()


def test_remote_run_is_not_local(rt: Runtime) -> None:
    """R-ONE-18, R-EVT-7: a remote run has local_agent None, a provider-minted id, local False."""
    rt.subagents.register_provider(RemoteProvider())
    probe = LifecycleProbe(rt)
    parent = rt.spawn("echo")
    run = rt.subagents.start("remote", _req(parent))
    assert run.local_agent is None and str(run.id).startswith("remote:")
    assert run.result.get(1).output == "remote says hi"
    run.dispose()
    assert [(e.type, e.local) for e in probe.events] == [
        ("subagent/start", False),
        ("subagent/end", False),
    ]


def test_events_are_scoped_to_the_delegating_parent(rt: Runtime) -> None:
    """R-EVT-10: a listener scoped to one parent sees only its children's runs."""
    p1, p2 = rt.spawn("echo"), rt.spawn("echo")
    probe1, probe2 = LifecycleProbe(rt, scope=p1), LifecycleProbe(rt, scope=p2.session_id)
    run = rt.subagents.start("local", _req(p1))
    run.result.get(10)
    run.dispose()
    assert probe1.wait_for(lambda evs: len(evs) == 2)
    assert probe1.types() == ["subagent/start", "subagent/end"]
    assert probe2.events == []


def test_disposing_a_subscription_twice_keeps_the_other_one(rt: Runtime) -> None:
    """``Subscription.dispose()`` is idempotent: a listener subscribed twice, one of
    its subscriptions disposed twice -- the other still hears every event (the
    second dispose removed it: the two entries were equal)."""
    heard: list[str] = []

    def listen(event: Any) -> None:
        heard.append(event.type)

    first = rt.subagents.subscribe(listen)
    rt.subagents.subscribe(listen)
    first.dispose()
    first.dispose()
    probe = LifecycleProbe(rt)
    run = rt.subagents.start("local", _req(rt.spawn("echo")))
    run.result.get(10)
    run.dispose()
    assert probe.wait_for(lambda evs: len(evs) == 2)
    assert heard == ["subagent/start", "subagent/end"]


def test_raising_listener_is_contained(rt: Runtime, caplog) -> None:
    """R-EVT-11: a raising listener is logged; peers still receive; the run is unchanged."""

    def bad(event):
        raise ValueError("listener bug")

    rt.subagents.subscribe(bad)
    probe = LifecycleProbe(rt)
    with caplog.at_level(logging.ERROR, logger="subagents"):
        run = rt.subagents.start("local", _req(rt.spawn("echo"), "x"))
        assert run.result.get(10) == RunResult("x", None, "completed")
        run.dispose()
        assert probe.wait_for(lambda evs: len(evs) == 2)
    assert probe.types() == ["subagent/start", "subagent/end"]
    assert sum("listener" in r.getMessage() for r in caplog.records) >= 2


def test_listener_future_failing_later_is_logged(rt: Runtime, caplog) -> None:
    """R-EVT-12: a listener's returned future that later fails is logged, peers unaffected."""
    futures: list[concurrent.futures.Future] = []

    def returns_future(event):
        f: concurrent.futures.Future = concurrent.futures.Future()
        futures.append(f)
        return f

    rt.subagents.subscribe(returns_future)
    probe = LifecycleProbe(rt)
    with caplog.at_level(logging.ERROR, logger="subagents"):
        run = rt.subagents.start("local", _req(rt.spawn("echo")))
        run.result.get(10)
        run.dispose()
        assert probe.wait_for(lambda evs: len(evs) == 2)
        for f in futures:
            f.set_exception(RuntimeError("async listener failed"))
    assert len(futures) == 2
    assert sum("failed later" in r.getMessage() for r in caplog.records) == 2
    assert probe.types() == ["subagent/start", "subagent/end"]


def test_provider_added_and_removed_events(rt: Runtime) -> None:
    """R-EVT-13: events after the registry changed, so listeners see the new state."""
    seen = []
    rt.subagents.subscribe(lambda e: seen.append((e.type, e.provider, rt.subagents.list())))
    reg = rt.subagents.register_provider(LocalProvider(rt, "extra"))
    reg.dispose()
    assert seen == [
        ("subagent/provider-added", "extra", ["local", "fork", "extra"]),
        ("subagent/provider-removed", "extra", ["local", "fork"]),
    ]


def test_failed_start_emits_nothing(rt: Runtime) -> None:
    """R-EVT-5: a start that raises emits neither event."""
    probe = LifecycleProbe(rt)
    parent = rt.spawn("echo")
    with contextlib.suppress(Exception):
        rt.subagents.start("local", _req(parent, model="missing"))
    assert probe.events == []


def test_end_after_start_under_race(rt: Runtime) -> None:
    """R-EVT-4 race: runs settling concurrently with start never reorder the pair."""
    gate = Gate()
    rt.models.register("g", lambda _o: ScriptedBehaviour([Block(gate)]))
    gate.release()
    probe = LifecycleProbe(rt)
    parent = rt.spawn("echo")
    runs = [rt.subagents.start("local", _req(parent, model="g")) for _ in range(30)]
    for run in runs:
        run.dispose()
    assert probe.wait_for(lambda evs: len(evs) == 60)
    first_seen: dict = {}
    for e in probe.events:
        first_seen.setdefault(e.run_id, e.type)
    assert set(first_seen.values()) == {"subagent/start"}


def test_a_listener_hears_whole_pairs_of_the_runs_after_it(rt: Runtime) -> None:
    """R-EVT-1, R-EVT-4: a run started before any listener subscribed emits
    nothing, its end included (a listener subscribing while it runs sees no lone
    ``subagent/end``); the next run's pair is heard whole."""
    gate = Gate()
    rt.models.register("held", lambda _o: ScriptedBehaviour([Block(gate)]))
    parent = rt.spawn("echo")
    before = rt.subagents.start("local", _req(parent, model="held"))
    assert gate.wait_reached(10)
    probe = LifecycleProbe(rt)  # subscribes while the first run is under way
    gate.release()
    before.result.get(10)
    before.dispose()
    after = rt.subagents.start("local", _req(parent, "again"))
    after.result.get(10)
    after.dispose()
    assert probe.wait_for(lambda evs: any(e.type == "subagent/end" for e in evs))
    assert [(e.type, e.child_id) for e in probe.events] == [
        ("subagent/start", str(after.id)),
        ("subagent/end", str(after.id)),
    ]
