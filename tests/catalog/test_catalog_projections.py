"""Projection units ``subagent`` and ``subagent_timing`` (R-PROJ-1..9).

Pure folds use hand-made logs with exact times (``catalog_kit.turn``); the runtime
tests inject a :class:`~catalog_kit.StepClock`, so every duration is exact too.
"""

from __future__ import annotations

import datetime as _dt
import gc
import json
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import pytest
from catalog_kit import (
    StepClock,
    at,
    continuable,
    future_descriptor,
    one_shot,
    turn,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from subagents.actors import (
    AbortSignal,
    ContinuableStartSpec,
    Runtime,
    SubagentStartRequest,
)
from subagents.actors._catalog._projections import (
    ProjectionRegistry,
    subagent_timing_unit,
    subagent_unit,
)
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Block, Gate, LifecycleProbe, ScriptedBehaviour
from subagents.protocol import (
    Event,
    InterruptEvent,
    MessageEvent,
    SessionId,
    SubagentDescriptorEvent,
    TurnEnd,
    TurnStart,
    UnknownEvent,
    new_message_id,
    parse_descriptor_payload,
)
from subagents.store import MemoryStore


class _Marked:
    """A live session as the registry keeps a watermark on it."""

    projection_mark: Any = None


@pytest.fixture
def registry() -> ProjectionRegistry:
    reg = ProjectionRegistry()
    reg.register(subagent_unit)
    reg.register(subagent_timing_unit)
    return reg


def fold(registry: ProjectionRegistry, events: Sequence[Event]) -> dict[str, Any]:
    return registry.values(registry.fold(enumerate(events)))


def seconds(total: _dt.timedelta) -> float:
    return total.total_seconds()


# -- R-PROJ-1 ----------------------------------------------------------------------------


def test_units_registered_when_projections_are_mounted(backend: Backend) -> None:
    """R-PROJ-1: a mounted registry gets ``subagent`` and ``subagent_timing``; none otherwise."""
    with Runtime(backend=backend) as rt:
        assert rt.session_projections is not None
        assert set(rt.session_projections.units()) == {"subagent", "subagent_timing"}
    with Runtime(backend=backend, projections=False) as rt:
        assert rt.session_projections is None


# -- subagent_timing -------------------------------------------------------------------


def test_timing_resets_at_each_descriptor(registry: ProjectionRegistry) -> None:
    """R-PROJ-2: a fork seed's turns (before the child's descriptor) add nothing."""
    seed = [one_shot("ancestor"), *turn(0, 0, 10), *turn(1, 20, 25)]
    own = [continuable("kid"), *turn(2, 100, 103)]
    with_seed = fold(registry, [*seed, *own])["subagent_timing"]
    assert with_seed == {"active_seconds": 3.0, "active": None}
    assert with_seed == fold(registry, own)["subagent_timing"]
    # Each descriptor resets again: only the turns after the last one count.
    again = fold(registry, [*own, one_shot("later"), *turn(3, 200, 200.5)])
    assert again["subagent_timing"] == {"active_seconds": 0.5, "active": None}


def test_timing_sums_turn_intervals(registry: ProjectionRegistry) -> None:
    """R-PROJ-3: active time is the sum of the turn/start -> turn/end intervals."""
    events = [
        continuable("kid"),
        *turn(0, 1, 2),
        *turn(1, 5, 7.5),
        MessageEvent(message_id=new_message_id(), content="between turns"),
        *turn(2, 10, 10.25),
    ]
    assert fold(registry, events)["subagent_timing"] == {"active_seconds": 3.75, "active": None}


def test_timing_counts_the_turn_a_one_shot_descriptor_is_appended_in(
    registry: ProjectionRegistry,
) -> None:
    """R-PROJ-2, R-PROJ-3, R-ONE-16: a one-shot child appends its descriptor inside its
    initial turn; that turn is the child's own work and counts, a seed's turns do not."""
    mid = new_message_id()
    own = [
        TurnStart(turn=2, at=at(50), message_ids=(mid,)),
        one_shot("helper"),
        MessageEvent(message_id=mid, content="task"),
        TurnEnd(turn=2, at=at(54), stop_reason="completed", output="done"),
    ]
    seed = [*turn(0, 0, 10), *turn(1, 20, 30)]
    assert fold(registry, [*seed, *own])["subagent_timing"] == {
        "active_seconds": 4.0,
        "active": None,
    }
    open_now = fold(registry, [*seed, *own[:3]])["subagent_timing"]
    assert open_now["active"] == {"since": at(50).isoformat(), "through": at(50).isoformat()}


def test_timing_open_turn_bounds_follow_the_latest_timed_event(
    registry: ProjectionRegistry,
) -> None:
    """R-PROJ-4, R-PROJ-5: an open turn keeps ``active.since``/``active.through`` from one
    cut; ``through`` follows the latest folded event with a time, and events without a
    time (messages, reports, unknown events) do not move it."""
    events: list[Event] = [continuable("kid"), *turn(0, 0, 2), *turn(1, 10, None)]
    timing = fold(registry, events)["subagent_timing"]
    assert timing == {
        "active_seconds": 2.0,
        "active": {"since": at(10).isoformat(), "through": at(10).isoformat()},
    }
    events.append(InterruptEvent(at=at(12), cause="stop", authority="user"))
    events.append(MessageEvent(message_id=new_message_id(), content="no time"))
    events.append(UnknownEvent(type_name="x/metadata", data={"at": "2099-01-01"}))
    timing = fold(registry, events)["subagent_timing"]
    assert timing["active"] == {"since": at(10).isoformat(), "through": at(12).isoformat()}
    assert timing["active_seconds"] == 2.0
    events.append(TurnEnd(turn=1, at=at(15), stop_reason="cancelled"))
    assert fold(registry, events)["subagent_timing"] == {"active_seconds": 7.0, "active": None}
    # An interrupt outside a turn opens nothing.
    events.append(InterruptEvent(at=at(20)))
    assert fold(registry, events)["subagent_timing"] == {"active_seconds": 7.0, "active": None}


# -- subagent identity -----------------------------------------------------------------


def test_identity_last_descriptor_wins(registry: ProjectionRegistry) -> None:
    """R-PROJ-6: mode plus creation label, from the last descriptor."""
    assert fold(registry, [*turn(0, 0, 1)])["subagent"] is None
    assert fold(registry, [one_shot(None)])["subagent"] == {"mode": "one-shot", "label": None}
    events = [one_shot("first"), *turn(0, 0, 1), continuable("second")]
    assert fold(registry, events)["subagent"] == {"mode": "continuable", "label": "second"}


def test_ancestor_descriptor_stands_until_the_childs_own(registry: ProjectionRegistry) -> None:
    """R-PROJ-7: a fork seed's ancestor descriptor is the identity only until the child's
    own descriptor is folded."""
    seed = [continuable("ancestor"), *turn(0, 0, 1)]
    assert fold(registry, seed)["subagent"] == {"mode": "continuable", "label": "ancestor"}
    assert fold(registry, [*seed, one_shot("own")])["subagent"] == {
        "mode": "one-shot",
        "label": "own",
    }


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param(future_descriptor(), id="future-version"),
        pytest.param(SubagentDescriptorEvent(payload={"v": 1, "mode": "bogus"}), id="bad-mode"),
        pytest.param(
            SubagentDescriptorEvent(payload={"v": 1, "mode": "continuable", "provider": "local"}),
            id="continuable-without-label",
        ),
        pytest.param(SubagentDescriptorEvent(payload={"mode": "one-shot"}), id="no-version"),
        pytest.param(SubagentDescriptorEvent(payload=[1, 2]), id="not-a-map"),  # type: ignore[arg-type]
    ],
)
def test_bad_descriptor_folds_to_null_and_replaces(
    registry: ProjectionRegistry, bad: SubagentDescriptorEvent
) -> None:
    """R-PROJ-8: a malformed or unknown-version descriptor folds to None, replacing an
    earlier identity, and survives a JSON push frame as ``null``."""
    values = fold(registry, [continuable("stale"), *turn(0, 0, 1), bad])
    assert values["subagent"] is None
    assert values["subagent"] == fold(registry, [*turn(0, 0, 1)])["subagent"]
    frame = json.loads(json.dumps({"type": "projection", "values": values}))
    assert "subagent" in frame["values"] and frame["values"]["subagent"] is None
    # A later valid descriptor wins again.
    assert fold(registry, [bad, one_shot("fixed")])["subagent"] == {
        "mode": "one-shot",
        "label": "fixed",
    }


# -- R-PROJ-9: the fold never raises, whatever the payload ---------------------------------


class HostileMap(dict):  # type: ignore[type-arg]
    """A mapping whose every lookup raises."""

    def get(self, *args: Any) -> Any:
        raise RuntimeError("hostile get")

    def keys(self) -> Any:
        raise RuntimeError("hostile keys")

    def __getitem__(self, key: Any) -> Any:
        raise RuntimeError("hostile getitem")


_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True),
    st.text(max_size=8),
    st.binary(max_size=8),
)
_json_any = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
_KEYS = ["v", "mode", "provider", "label", "agent_options", "persona", "tool_filter", "model"]
_near_values = st.one_of(
    st.sampled_from([1, 2, 0, True, "1", "one-shot", "continuable", "local", "", " ", None]),
    st.text(max_size=210),
    st.dictionaries(st.sampled_from(["provider", "model", "x"]), st.text(max_size=4), max_size=3),
    st.lists(st.text(max_size=4), max_size=3),
    _json_any,
)
payloads = st.one_of(
    st.dictionaries(st.sampled_from(_KEYS), _near_values, max_size=8),
    st.fixed_dictionaries(
        {"v": st.just(1), "mode": st.sampled_from(["one-shot", "continuable"])},
        optional={
            "provider": st.sampled_from(["local", "", 3]),
            "label": st.one_of(st.none(), st.text(max_size=5)),
            "agent_options": st.one_of(
                st.fixed_dictionaries({"provider": st.just("local"), "model": st.just("echo")}),
                _json_any,
            ),
            "persona": st.one_of(st.none(), st.text(max_size=3), st.integers()),
            "tool_filter": st.one_of(st.none(), st.lists(st.text(max_size=3), max_size=2)),
        },
    ),
    _json_any,
    st.builds(lambda: HostileMap(v=1, mode="one-shot")),
)


@st.composite
def logs(draw: st.DrawFn) -> list[Event]:
    """Arbitrary event sequences with non-decreasing times and arbitrary descriptors."""
    kinds = draw(
        st.lists(
            st.sampled_from(["start", "end", "interrupt", "message", "unknown", "desc", "good"]),
            max_size=25,
        )
    )
    now = 0.0
    events: list[Event] = []
    for i, kind in enumerate(kinds):
        now += draw(st.integers(0, 5_000)) / 1000
        if kind == "start":
            events.append(TurnStart(turn=i, at=at(now)))
        elif kind == "end":
            events.append(TurnEnd(turn=i, at=at(now), stop_reason="completed"))
        elif kind == "interrupt":
            events.append(InterruptEvent(at=at(now)))
        elif kind == "message":
            events.append(MessageEvent(message_id=new_message_id(), content=draw(_json_any)))
        elif kind == "unknown":
            events.append(UnknownEvent(type_name="x/y", data={"at": now}))
        elif kind == "desc":
            events.append(SubagentDescriptorEvent(payload=draw(payloads)))
        else:
            label = draw(st.text(min_size=1, max_size=5).filter(str.strip))
            events.append(draw(st.sampled_from([one_shot(label), continuable(label)])))
    return events


def expected_identity(events: Iterable[Event]) -> Any:
    """The oracle: the last descriptor, classified by the protocol's own parser."""
    last = None
    for event in events:
        if isinstance(event, SubagentDescriptorEvent):
            last = event
    if last is None:
        return None
    try:
        descriptor = parse_descriptor_payload(last.payload)
    except Exception:
        return None
    return {"mode": descriptor.mode, "label": descriptor.label}


_settings = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@_settings
@given(events=logs())
def test_fold_never_raises_and_serves_the_last_descriptor(
    registry: ProjectionRegistry, events: list[Event]
) -> None:
    """R-PROJ-6, R-PROJ-8, R-PROJ-9: any payloads, any order: the fold does not raise, the
    identity is the last descriptor's classification (None when it is bad or absent),
    and every value survives JSON."""
    values = fold(registry, events)
    assert values["subagent"] == expected_identity(events)
    timing = values["subagent_timing"]
    assert timing["active_seconds"] >= 0
    json.dumps(values, allow_nan=False)


@st.composite
def closed_turns(draw: st.DrawFn, first: int = 0, start: float = 0.0) -> list[Event]:
    """Completed turns with optional descriptors between them (a fork seed)."""
    events: list[Event] = []
    now = start
    for i in range(draw(st.integers(0, 4))):
        if draw(st.booleans()):
            events.append(draw(st.sampled_from([one_shot("anc"), continuable("anc")])))
        begin = now + draw(st.integers(0, 3))
        now = begin + draw(st.integers(0, 3))
        events.extend(turn(first + i, begin, now))
    return events


@_settings
@given(
    seed=closed_turns(),
    durations=st.lists(st.tuples(st.integers(0, 9), st.integers(0, 9)), max_size=5),
    open_last=st.booleans(),
    layout=st.sampled_from(["continuable", "one-shot"]),
)
def test_seed_never_counts_and_own_turns_add_up(
    registry: ProjectionRegistry,
    seed: list[Event],
    durations: list[tuple[int, int]],
    open_last: bool,
    layout: str,
) -> None:
    """R-PROJ-2, R-PROJ-3, R-PROJ-4, R-PROJ-7: whatever the completed fork seed, the
    child's timing and identity equal those of its own suffix, and its active time is
    the exact sum of its own turns (a one-shot child's descriptor sits in turn 0)."""
    now, own, total = 1000.0, [], 0.0
    last_start = None
    for i, (gap, length) in enumerate(durations):
        begin = now + gap
        now = begin + length
        if open_last and i == len(durations) - 1:
            own.extend(turn(10 + i, begin, None))
            last_start = begin
        else:
            own.extend(turn(10 + i, begin, now))
            total += length
    descriptor = one_shot("own") if layout == "one-shot" else continuable("own")
    if layout == "one-shot" and own:
        own.insert(1, descriptor)
    else:
        own.insert(0, descriptor)
    values = fold(registry, [*seed, *own])
    assert values == fold(registry, own)
    assert values["subagent"] == {"mode": layout, "label": "own"}
    assert values["subagent_timing"]["active_seconds"] == total
    if last_start is None:
        assert values["subagent_timing"]["active"] is None
    else:
        assert values["subagent_timing"]["active"] == {
            "since": at(last_start).isoformat(),
            "through": at(last_start).isoformat(),
        }


@_settings
@given(events=logs(), cuts=st.lists(st.integers(0, 25), max_size=4))
def test_watermark_snapshot_equals_a_fold_from_scratch(
    events: list[Event], cuts: list[int]
) -> None:
    """R-LIST-8: the watermark snapshot folds only new events, and its value at every
    cut equals a fold of the whole log from scratch."""
    registry = ProjectionRegistry()
    registry.register(subagent_unit)
    registry.register(subagent_timing_unit)
    log: list[Event] = []
    starts: list[int] = []

    def read_from(seq: int) -> Iterator[tuple[int, Event]]:
        starts.append(seq)
        return ((i, e) for i, e in enumerate(log) if i >= seq)

    session = _Marked()
    expected_starts = []
    for cut in [*sorted(cuts), len(events)]:
        expected_starts.append(len(log))  # only what is past the watermark is read
        log.extend(events[len(log) : max(cut, len(log))])
        seq, states = registry.snapshot(session, read_from)
        assert seq == len(log) - 1
        assert registry.values(states) == fold(registry, log)
    assert starts == expected_starts


def test_a_snapshot_waiting_for_its_read_stops_no_other_greenlet(
    registry: ProjectionRegistry,
) -> None:
    """R-LIST-8 on the gevent backend: a snapshot whose read waits for the store (a
    blocking store's read yields to the hub) holds no plain lock across that wait.
    Held, another greenlet of the thread snapshotting the same session -- a listing
    while the session's own settle cached its identity -- blocked the whole thread,
    and the read it waited for never ran again. Each record is folded once."""
    import gevent
    import gevent.event

    log: list[Event] = [continuable("child"), *turn(0, 0, 1), *turn(1, 2, 3)]
    session = _Marked()
    reading, release = gevent.event.Event(), gevent.event.Event()

    def slow_read(seq: int) -> Iterator[tuple[int, Event]]:
        reading.set()
        assert release.wait(30)
        return ((i, e) for i, e in enumerate(log) if i >= seq)

    def read(seq: int) -> Iterator[tuple[int, Event]]:
        return ((i, e) for i, e in enumerate(log) if i >= seq)

    waiting = gevent.spawn(registry.snapshot, session, slow_read)
    assert reading.wait(30)
    seq, states = registry.snapshot(session, read)  # (blocked the thread for good)
    release.set()
    seq_waited, states_waited = waiting.get(timeout=30)
    whole = fold(registry, log)
    assert seq == seq_waited == len(log) - 1
    assert registry.values(states) == registry.values(states_waited) == whole
    log += turn(2, 4, 5)  # and the watermark goes on from there
    seq, states = registry.snapshot(session, read)
    assert seq == len(log) - 1 and registry.values(states) == fold(registry, log)


# -- through a runtime (exact durations from an injected clock) ---------------------------


def _timing_of(rt: Runtime, child: Any) -> tuple[dict[str, Any], list[Event]]:
    reg = rt.session_projections
    assert reg is not None
    records = rt.sessions.read(child)
    return reg.values(reg.fold((r.seq, r.event) for r in records)), [r.event for r in records]


def _turn_seconds(events: list[Event]) -> float:
    starts = [e.at for e in events if isinstance(e, TurnStart)]
    ends = [e.at for e in events if isinstance(e, TurnEnd)]
    return sum(seconds(e - s) for s, e in zip(starts, ends))


def test_runtime_children_timing_is_exact(backend: Backend) -> None:
    """R-PROJ-2, R-PROJ-3, R-PROJ-6: a one-shot and a continuable child, timed by an
    injected clock: each child's active time is exactly its own turns' time."""
    with Runtime(MemoryStore(), backend=backend, clock=StepClock(step=1.5)) as rt:
        probe = LifecycleProbe(rt)
        parent = rt.spawn("echo")
        run = rt.subagents.start(
            "local",
            SubagentStartRequest(parent=parent, prompt="x", signal=AbortSignal.never(), label="o"),
        )
        assert run.result.get(10).stop_reason == "completed"
        handle = rt.subagents.start_continuable(
            ContinuableStartSpec(parent=parent, provider="local", prompt="y", label="c")
        )
        assert probe.wait_for(lambda evs: sum(e.type == "subagent/end" for e in evs) == 2)
        run.dispose()
        rt.sessions.flush()
        for child, identity in (
            (run.id, {"mode": "one-shot", "label": "o"}),
            (handle.child_id, {"mode": "continuable", "label": "c"}),
        ):
            values, events = _timing_of(rt, child)
            assert values["subagent"] == identity
            assert _turn_seconds(events) == 1.5
            assert values["subagent_timing"] == {"active_seconds": 1.5, "active": None}
        probe.close()


def test_runtime_open_turn_in_the_live_watermark(backend: Backend) -> None:
    """R-PROJ-4, R-LIST-8: a child blocked in its turn shows ``active.since`` equal to
    its turn/start time in the live watermark snapshot; once ended, the exact total."""
    gate = Gate()
    with Runtime(MemoryStore(), backend=backend, clock=StepClock()) as rt:
        rt.models.register("slow", lambda _o: ScriptedBehaviour([Block(gate)]))
        parent = rt.spawn("echo")
        run = rt.subagents.start(
            "local",
            SubagentStartRequest(
                parent=parent, prompt="x", signal=AbortSignal.never(), model="slow"
            ),
        )
        assert gate.wait_reached(10)
        reg = rt.session_projections
        assert reg is not None
        child = SessionId(run.id)

        def read_from(seq: int) -> Iterator[tuple[int, Event]]:
            return ((r.seq, r.event) for r in rt.sessions.read(child, seq))

        live = rt.sessions.live(child)
        assert live is not None
        _, states = reg.snapshot(live, read_from)
        start = next(e for e in rt.sessions.read(child) if isinstance(e.event, TurnStart))
        assert isinstance(start.event, TurnStart)
        assert reg.values(states)["subagent_timing"] == {
            "active_seconds": 0.0,
            "active": {"since": start.event.at.isoformat(), "through": start.event.at.isoformat()},
        }
        gate.release()
        assert run.result.get(10).stop_reason == "completed"
        _, states = reg.snapshot(live, read_from)
        assert reg.values(states)["subagent_timing"] == {"active_seconds": 1.0, "active": None}
        run.dispose()


def _watermarks(rt: Runtime | None = None) -> int:
    """The watermarks in the process -- but those on ``rt``'s live sessions, which
    go with them (a listing of the root may well have marked the root)."""
    import warnings

    from subagents.actors._catalog import _projections

    with warnings.catch_warnings():  # another test's leftovers are not this one's
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    held: set[int] = set()
    if rt is not None:
        for sid in rt.sessions.live_ids():
            live = rt.sessions.live(sid)
            if live is not None:
                held.add(id(live.projection_mark))
    return sum(
        1 for o in gc.get_objects() if type(o) is _projections._Watermark and id(o) not in held
    )


def test_a_listing_racing_a_child_leaving_keeps_no_watermark(
    rtp: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced: a listing finds a child live (its live session read), then the child
    leaves the live set (it settles) before the listing folds its identity. The
    identity is still folded, and no watermark stays behind for it: it stayed for
    the runtime's life, one per such race. R-PROJ-6."""
    rt = rtp
    before = _watermarks(rt)  # (other tests' leftovers in this process count in both)
    go = rt.backend.event()

    def kid(turn: Any) -> None:
        go.wait(10)

    rt.models.register("kid", lambda _o: kid)
    root = rt.spawn("echo", label="root")
    child, _mid = rt.subagents.start_continuable(
        ContinuableStartSpec(parent=root, provider="local", prompt="p", label="kid", model="kid")
    )
    stale = [rt.sessions.live(child)]  # what the listing read, while the child was live
    assert stale[0] is not None
    go.set()
    assert rt.wait_idle(10)
    for _ in range(1000):  # it settles once idle (keep_warm 0), after its agent stops
        if rt.sessions.live(child) is None:
            break
        rt.backend.sleep(0.01)
    assert rt.sessions.live(child) is None  # settled: left the live set
    live_ids, live = rt.sessions.live_ids, rt.sessions.live
    monkeypatch.setattr(rt.sessions, "live_ids", lambda: [*live_ids(), child])
    monkeypatch.setattr(rt.sessions, "live", lambda sid: stale[0] if sid == child else live(sid))
    rows = rt.subagents.list_children(root.session_id).rows
    assert [(r.id, r.label) for r in rows] == [(child, "kid")]
    monkeypatch.undo()
    assert stale[0].projection_mark is not None  # the listing's, on the stale session
    stale.clear()
    # Nothing of the runtime keeps it: it goes with the session, once the child's
    # agent (whose finishing thread may still hold the session for a moment) is gone.
    for _ in range(500):
        if _watermarks(rt) <= before:
            break
        rt.backend.sleep(0.02)
    assert _watermarks(rt) <= before


def test_listings_racing_settles_leave_no_watermarks(rtp: Runtime) -> None:
    """Race, 40 rounds: a child runs a follow-up and settles while its parent lists
    it. Once every child settled (its session released), no watermark remains."""
    rt = rtp
    before = _watermarks()  # (other tests' leftovers in this process count in both)
    root = rt.spawn("echo", label="root")
    children = []
    for i in range(40):
        child, _mid = rt.subagents.start_continuable(
            ContinuableStartSpec(parent=root, provider="local", prompt="p", label=f"c{i}")
        )
        children.append(child)
        rt.subagents.followup(root, child, "x")
        rt.subagents.list_children(root.session_id)
    assert rt.wait_idle(10)
    for _ in range(1000):  # each settles once idle (keep_warm 0): its session released
        if all(rt.sessions.live(c) is None for c in children):
            break
        rt.backend.sleep(0.01)
    assert all(rt.sessions.live(c) is None for c in children)
    for _ in range(500):  # the agents' finishing threads may hold a session a moment
        if _watermarks() <= before:
            break
        rt.backend.sleep(0.02)
    assert _watermarks() <= before
