"""``list_children`` / ``list_descendants`` (R-LIST-1..21, R-ONE-21).

Trees are built through the runtime (continuable and one-shot children) or written
straight into the store with :func:`~catalog_kit.write_child` when a test needs a
shape the runtime would not make (a fork seed with an ancestor descriptor, an
ordinary session in the tree, chosen ids). Every ordering is forced with gates and
lifecycle events; every store read is counted by the hooked stores.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

import pytest
from catalog_kit import (
    T0,
    HookedMemoryStore,
    HookedSqliteStore,
    HookedStore,
    InTask,
    StepClock,
    at,
    continuable,
    future_descriptor,
    hooked,
    identity_blob,
    one_shot,
    sid,
    turn,
    write_child,
)
from subagents.actors import (
    AbortController,
    AbortSignal,
    Agent,
    AgentOptions,
    ContinuableStartSpec,
    Runtime,
    SubagentRun,
    SubagentStartRequest,
)
from subagents.actors._catalog import Catalog, ChildRow, DescendantRow, Diagnostic, Listing
from subagents.actors._catalog import _identity as listing_module
from subagents.actors._catalog._projections import ProjectionRegistry, ProjectionUnit
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Block, Call, Gate, LifecycleProbe, ScriptedBehaviour
from subagents.protocol import (
    ErrorCode,
    Event,
    SessionHeader,
    SessionId,
    SubagentDescriptorEvent,
    SubagentError,
    new_session_id,
)

# -- helpers -----------------------------------------------------------------------------


def kid(rt: Runtime, parent: Agent, label: str, prompt: Any = "hi", **fields: Any) -> SessionId:
    spec = ContinuableStartSpec(
        parent=parent, provider="local", prompt=prompt, label=label, **fields
    )
    return rt.subagents.start_continuable(spec).child_id


def one(rt: Runtime, parent: Agent, label: str | None, **fields: Any) -> SubagentRun:
    request = SubagentStartRequest(
        parent=parent, prompt="task", signal=AbortSignal.never(), label=label, **fields
    )
    return rt.subagents.start("local", request)


def settle(rt: Runtime, probe: LifecycleProbe, *children: SessionId) -> None:
    """Wait until every epoch of each continuable child ended and its session left the
    live set."""
    wanted = {str(c) for c in children}

    def ended(events: Sequence[Any]) -> bool:
        starts = Counter(e.child_id for e in events if e.type == "subagent/start")
        ends = Counter(e.child_id for e in events if e.type == "subagent/end")
        # A follow-up racing settlement reopens a child after its end; the live set
        # is left before an epoch's end is heard, so the last end makes both hold.
        return all(
            ends[c] and ends[c] == starts[c] and rt.sessions.live(SessionId(c)) is None
            for c in wanted
        )

    assert probe.wait_for(ended), f"children did not settle: {probe.events}"
    for child in children:
        assert rt.sessions.live(child) is None
    rt.sessions.flush()


def first_child(probe: LifecycleProbe, parent: SessionId | str) -> SessionId:
    """The child id of the first lifecycle event delegated by ``parent`` (waiting for it)."""
    assert probe.wait_for(lambda evs: any(e.parent_session == parent for e in evs))
    return SessionId(next(str(e.child_id) for e in probe.events if e.parent_session == parent))


def live_child(
    rt: Runtime,
    parent: SessionId,
    *,
    seed: Sequence[Event] = (),
    session_id: SessionId | None = None,
    behaviour: Any = None,
    created_at: datetime | None = None,
) -> Agent:
    """A live session-backed agent with origin ``subagent`` and a hand-made log prefix."""
    header = SessionHeader(
        id=session_id or new_session_id(),
        parent_session=parent,
        origin="subagent",
        delegation_depth=1,
        created_at=created_at or rt.clock(),
    )
    return rt.agents.create(
        header=header, options=AgentOptions(model="echo"), seed=seed, behaviour=behaviour
    )


def ids(listing: Listing) -> list[SessionId]:
    return [row.id for row in listing.rows]


def kinds(listing: Listing) -> dict[SessionId, str]:
    return {d.id: d.kind for d in listing.diagnostics}


def summary(listing: Listing) -> list[tuple[Any, ...]]:
    return [(r.id, r.mode, r.label, r.activity, r.has_children) for r in listing.rows]


def store_of(rt: Runtime) -> HookedStore:
    return hooked(rt)


# -- R-LIST-1, -2, -7, -13, -17: direct children, both modes --------------------------------


def test_direct_children_of_both_modes(rtp: Runtime, probe: LifecycleProbe) -> None:
    """R-LIST-1, R-LIST-2, R-LIST-7, R-LIST-13, R-LIST-17: only direct children, one row
    each, one-shot and continuable, with mode, label, activity and has_children."""
    rt = rtp
    gate = Gate()
    rt.models.register("slow", lambda _o: ScriptedBehaviour([Block(gate)]))
    rt.models.register(
        "spawner",
        lambda _o: ScriptedBehaviour(
            [Call(lambda t: t.subagents.start_continuable("local", "hi", label="gk", model="echo"))]
        ),
    )
    root = rt.spawn("echo")
    k = kid(rt, root, "kid", model="spawner")
    helper = one(rt, root, "helper", model="slow")
    unlabeled = one(rt, root, None)
    assert unlabeled.result.get(10).stop_reason == "completed"
    assert gate.wait_reached(10)
    assert probe.wait_for(lambda evs: sum(e.type == "subagent/end" for e in evs) >= 3)
    grandkid = first_child(probe, k)
    settle(rt, probe, k, grandkid)
    unlabeled.dispose()
    rt.sessions.flush()

    listing = rt.subagents.list_children(root.session_id)
    assert listing.diagnostics == ()
    assert summary(listing) == [
        (k, "continuable", "kid", "inactive", True),
        (helper.id, "one-shot", "helper", "running", False),
        (unlabeled.id, "one-shot", None, "inactive", False),
    ]
    assert all(isinstance(row, ChildRow) for row in listing.rows)
    assert grandkid not in ids(listing)
    assert summary(rt.subagents.list_children(k)) == [
        (grandkid, "continuable", "gk", "inactive", False)
    ]
    assert rt.subagents.list_children(grandkid) == Listing((), ())
    gate.release()
    helper.dispose()


# -- R-LIST-3: created_at then id -------------------------------------------------------------


@pytest.mark.parametrize("store", ["none", "mem", "sqlite"])
def test_rows_ordered_by_created_at_then_id(backend: Backend, store: str, tmp_path: Any) -> None:
    """R-LIST-3: with a clock that returns equal times, rows follow the ids whatever the
    creation order (live-only, and live or cold over persistence); an earlier
    ``created_at`` comes first whatever its id."""
    persistence: HookedStore | None = None
    if store == "mem":
        persistence = HookedMemoryStore()
    elif store == "sqlite":
        persistence = HookedSqliteStore(str(tmp_path / "s.db"))
    gate = Gate()
    with Runtime(persistence, backend=backend, clock=StepClock(step=0)) as rt:
        rt.models.register("slow", lambda _o: ScriptedBehaviour([Block(gate)]))
        root = rt.spawn("echo")
        # Created in descending id order, all at the same instant.
        agents = [
            live_child(rt, root.session_id, seed=[continuable(f"c{n}")], session_id=sid(n))
            for n in (0xF0, 0xA0, 0x50)
        ]
        run = one(rt, root, "minted", model="slow")  # a minted id, the same instant
        assert gate.wait_reached(10)
        # An earlier instant with the highest id of all, created last.
        live_child(
            rt, root.session_id, seed=[one_shot("early")], session_id=sid(0xFFFF), created_at=at(-1)
        )
        if persistence is not None:
            agents[1].dispose()  # one cold, the rest live: the order ignores activity
            rt.sessions.flush()
        listing = rt.subagents.list_children(root.session_id)
        expected_rest = sorted([sid(0xF0), sid(0xA0), sid(0x50), SessionId(run.id)])
        assert ids(listing) == [sid(0xFFFF), *expected_rest]
        assert {r.created_at for r in listing.rows[1:]} == {T0}
        descendants = rt.subagents.list_descendants(root.session_id)
        assert ids(descendants) == ids(listing)
        gate.release()
        run.dispose()


# -- R-LIST-4: never loads or resumes ----------------------------------------------------------


def test_listing_never_loads_or_resumes(rtp: Runtime, probe: LifecycleProbe) -> None:
    """R-LIST-4: listing cold children creates no Activation, registers no Agent, makes no
    session live and emits no lifecycle event."""
    rt = rtp
    root = rt.spawn("echo")
    children = [kid(rt, root, f"k{i}") for i in range(3)]
    settle(rt, probe, *children)
    agents_before = set(rt.agents.list())
    events_before = len(probe.events)
    for _ in range(2):
        assert len(rt.subagents.list_children(root.session_id)) == 3
        assert len(rt.subagents.list_descendants(root.session_id)) == 3
    assert set(rt.agents.list()) == agents_before
    assert rt.continuation.activations() == []
    assert all(rt.sessions.live(c) is None for c in children)
    assert len(probe.events) == events_before


def test_list_children_reads_the_parents_slice_not_the_store(rtp: Runtime) -> None:
    """R-LIST-1, R-LIST-3: ``list_children`` reads the parent's children, then theirs
    (for ``has_children``), from the store's parent index: never the whole store, so
    its cost follows the parent's family, not the number of sessions stored. Where
    the first read says which children have stored children (an SQL store's), the
    second reads only theirs."""
    rt = rtp
    store = hooked(rt)
    root = rt.spawn("echo")
    elsewhere = rt.spawn("echo")
    for i in range(40):  # a big unrelated family
        write_child(store, elsewhere.session_id, [continuable(f"x{i}")], created_at=at(i))
    kids = [
        write_child(store, root.session_id, [continuable(f"k{i}")], created_at=at(i))
        for i in range(3)
    ]
    write_child(store, kids[0].id, [continuable("grandchild")], created_at=at(9))
    write_child(store, kids[1].id, [], origin="user", created_at=at(9))  # not a subagent
    store.reset_counts()
    listing = rt.subagents.list_children(root.session_id)
    assert [(r.label, r.has_children) for r in listing.rows] == [
        ("k0", True),
        ("k1", False),
        ("k2", False),
    ]
    assert store.calls["scan_headers"] == 0 and store.calls["all_headers"] == 0
    scans = [args for method, args in store.read_log if method == "scan_children"]
    asked = kids[:2] if hasattr(store, "scan_children_with") else kids
    assert [set(a) for a in scans] == [{root.session_id}, {k.id for k in asked}]


# -- R-LIST-5, -8: live preferred, watermark identity ----------------------------------------


def test_live_child_is_served_from_the_live_store(rtp: Runtime) -> None:
    """R-LIST-5, R-LIST-7, R-LIST-8: a child live and persisted is represented from the live
    side: ``running``, identity from the registry's watermark snapshot (a contrary cache
    row is never read), and the watermark folds only new events on the next listing."""
    rt = rtp
    gate = Gate()
    rt.models.register("slow", lambda _o: ScriptedBehaviour([Block(gate)]))
    root = rt.spawn("echo")
    child = kid(rt, root, "live-one", model="slow")
    assert gate.wait_reached(10)
    rt.sessions.flush()
    store = store_of(rt)
    store.put_projection(child, "subagent", 99, identity_blob("one-shot", "stale cache"))
    registry = rt.session_projections
    assert registry is not None
    starts: list[tuple[SessionId, int]] = []
    snapshot = registry.snapshot

    def spy(live: Any, read_from: Callable[[int], Any]) -> Any:
        def reading(seq: int) -> Any:
            starts.append((live.id, seq))
            return read_from(seq)

        return snapshot(live, reading)

    registry.snapshot = spy  # type: ignore[method-assign]
    try:
        store.reset_counts()
        first = rt.subagents.list_children(root.session_id)
        assert summary(first) == [(child, "continuable", "live-one", "running", False)]
        assert store.calls["get_projection"] == 0
        second = rt.subagents.list_children(root.session_id)
        assert second == first
    finally:
        del registry.snapshot
    assert starts[0] == (child, 0)
    assert starts[1][0] == child and starts[1][1] > 0  # past the watermark
    gate.release()


def test_live_only_without_persistence(rt: Runtime) -> None:
    """R-LIST-5, R-ONE-21: without persistence the live store is the whole corpus: a
    running child is listed, and once disposed it is gone (no row made up for it)."""
    gate = Gate()
    rt.models.register("slow", lambda _o: ScriptedBehaviour([Block(gate)]))
    root = rt.spawn("echo")
    run = one(rt, root, "tmp", model="slow")
    assert gate.wait_reached(10)
    assert summary(rt.subagents.list_children(root.session_id)) == [
        (run.id, "one-shot", "tmp", "running", False)
    ]
    assert summary(rt.subagents.list_descendants(root.session_id)) == [
        (run.id, "one-shot", "tmp", "running", False)
    ]
    gate.release()
    assert run.result.get(10).stop_reason == "completed"
    run.dispose()
    assert rt.subagents.list_children(root.session_id) == Listing((), ())
    assert rt.subagents.list_descendants(root.session_id) == Listing((), ())


def test_one_shot_listed_after_dispose_only_when_persisted(rtp: Runtime) -> None:
    """R-ONE-21: a disposed one-shot child whose session reached persistence is listed
    ``inactive``; one whose session never reached it has no row and no diagnostic."""
    rt = rtp
    root = rt.spawn("echo")
    kept = one(rt, root, "kept")
    assert kept.result.get(10).stop_reason == "completed"
    kept.dispose()
    store = store_of(rt)

    def refuse(header: SessionHeader, events: Any) -> None:
        if header.label == "lost":
            raise OSError("disk full")

    store.hooks["create_session"] = refuse
    lost = one(rt, root, "lost")
    # The failed write stops the child's session (no persistence failure is
    # silent): its turn ends first or is cancelled by the stop, whichever comes.
    assert lost.result.get(10).stop_reason in ("completed", "cancelled")
    lost.dispose()
    rt.sessions.flush()
    assert store.header(lost.id) is None
    listing = rt.subagents.list_children(root.session_id)
    assert summary(listing) == [(kept.id, "one-shot", "kept", "inactive", False)]
    assert listing.diagnostics == ()


# -- R-LIST-6: no provider, registry or continuation consulted --------------------------------


class Tripwire:
    """Any attribute access fails the test."""

    def __init__(self, what: str) -> None:
        self._what = what

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"listing touched {self._what}.{name}")


class TripwireProvider:
    """A provider whose every operation fails the test."""

    name = "tripwire"
    capabilities = frozenset({"output_schema", "depth_limit", "tool_filter", "persona"})
    inherits_parent_context = False

    def start(self, *_args: Any) -> Any:
        raise AssertionError("listing called a provider's start")

    def prepare_continuable(self, *_args: Any) -> Any:
        raise AssertionError("listing called a provider's prepare_continuable")


def test_listing_consults_no_provider_registry_or_activation(
    rtp: Runtime, probe: LifecycleProbe
) -> None:
    """R-LIST-6: removing every provider leaves the result unchanged, and listing works
    with the agent registry and the continuation machinery unusable."""
    rt = rtp
    gate = Gate()
    rt.models.register("slow", lambda _o: ScriptedBehaviour([Block(gate)]))
    root = rt.spawn("echo")
    cold = kid(rt, root, "cold")
    settle(rt, probe, cold)
    running = kid(rt, root, "running", model="slow")
    assert gate.wait_reached(10)
    before = rt.subagents.list_children(root.session_id)
    before_tree = rt.subagents.list_descendants(root.session_id)
    assert ids(before) == [cold, running]
    for registration in rt.default_providers:
        registration.dispose()
    assert rt.subagents.list() == []
    rt.subagents.register_provider(TripwireProvider())
    agents, continuation = rt.agents, rt.continuation
    rt.agents, rt.continuation = Tripwire("agents"), Tripwire("continuation")  # type: ignore[assignment]
    try:
        assert rt.subagents.list_children(root.session_id) == before
        assert rt.subagents.list_descendants(root.session_id) == before_tree
    finally:
        rt.agents, rt.continuation = agents, continuation
    gate.release()


# -- R-LIST-9, -11: the cache row and its fork-seed gate ---------------------------------------

SEED: list[Event] = [continuable("ancestor"), *turn(0, 0, 1)]  # seed_len 4: seqs 0..3
OWN: list[Event] = [continuable("own"), *turn(1, 5, 6)]  # the child's descriptor at seq 4


@pytest.mark.parametrize(
    ("row_seq", "served"),
    [(0, "own"), (3, "own"), (4, "cached"), (6, "cached")],
    ids=["seed-start", "seed-end", "own-descriptor", "past-it"],
)
def test_cold_identity_from_a_cache_row_only_past_the_fork_seed(
    rtp: Runtime, row_seq: int, served: str
) -> None:
    """R-LIST-9, R-LIST-10: a cache row with ``seq >= header.seed_len`` serves a cold
    child's identity without reading its log; a row inside the fork seed is ignored and
    the log is inspected once (and the result is cached past the seed)."""
    rt = rtp
    store = store_of(rt)
    root = rt.spawn("echo")
    header = write_child(store, root.session_id, OWN, seed=SEED)
    assert header.seed_len == 4
    store.put_projection(header.id, "subagent", row_seq, identity_blob("continuable", "cached"))
    store.reset_counts()
    listing = rt.subagents.list_children(root.session_id)
    assert summary(listing) == [(header.id, "continuable", served, "inactive", False)]
    assert listing.diagnostics == ()
    assert store.reads_of[header.id] == (1 if served == "own" else 0)
    if served == "own":
        assert store.get_projection(header.id, "subagent") == (
            4,
            identity_blob("continuable", "own"),
        )


def test_inspection_of_a_seeded_child_without_its_own_descriptor_is_not_cached(
    rtp: Runtime,
) -> None:
    """R-LIST-9: an identity folded from inside the fork seed is never written to the
    cache, so it cannot later pass for the child's own."""
    rt = rtp
    store = store_of(rt)
    root = rt.spawn("echo")
    header = write_child(store, root.session_id, [*turn(1, 5, 6)], seed=SEED)
    listing = rt.subagents.list_children(root.session_id)
    assert summary(listing) == [(header.id, "continuable", "ancestor", "inactive", False)]
    assert store.get_projection(header.id, "subagent") is None


@pytest.mark.parametrize(
    "failure",
    [RuntimeError("cache broken"), SubagentError("cache gone", code=ErrorCode.CORRUPT_RECORD)],
    ids=["runtime-error", "subagent-error"],
)
def test_a_throwing_cache_read_falls_through_silently(rtp: Runtime, failure: Exception) -> None:
    """R-LIST-11: a cache read that raises renders no verdict: the log is inspected, with
    no diagnostic and no error."""
    rt = rtp
    store = store_of(rt)
    root = rt.spawn("echo")
    header = write_child(store, root.session_id, OWN, seed=SEED)
    store.put_projection(header.id, "subagent", 5, identity_blob("one-shot", "wrong"))

    def broken(*_args: Any) -> None:
        raise failure

    store.hooks["get_projection"] = broken
    store.hooks["scan_children_with"] = broken  # an SQL store's joined read of the rows
    store.reset_counts()
    listing = rt.subagents.list_children(root.session_id)
    assert summary(listing) == [(header.id, "continuable", "own", "inactive", False)]
    assert listing.diagnostics == ()
    assert store.reads_of[header.id] == 1


def test_an_unreadable_identity_cache_falls_through_silently_in_a_tree_listing(
    rtp: Runtime,
) -> None:
    """R-LIST-11: an SQL store reads a tree level's identity rows with its headers,
    in one statement; when the identity cache cannot be read (its table gone), that
    read fails as a whole, and the listing reads the headers alone and inspects each
    child instead: the same rows, no diagnostic, no error."""
    store = store_of(rtp)
    if not isinstance(store, HookedSqliteStore):
        pytest.skip("a memory store reads the identity rows apart (the test above)")
    root = rtp.spawn("echo")
    kid = write_child(store, root.session_id, [continuable("kid")], created_at=at(0))
    write_child(store, kid.id, [one_shot("grandchild")], created_at=at(1))
    write_child(store, root.session_id, [one_shot("sibling")], created_at=at(2))
    before = rtp.subagents.list_descendants(root.session_id)
    assert [r.label for r in before.rows] == ["kid", "grandchild", "sibling"]
    conn = sqlite3.connect(store.path)
    conn.execute("DROP TABLE projection_cache")
    conn.commit()
    conn.close()
    store.reset_counts()
    after = rtp.subagents.list_descendants(root.session_id)
    assert after.rows == before.rows
    assert after.diagnostics == ()
    assert sum(store.reads_of.values()) == 3  # each child inspected


# -- R-LIST-10: bounded inspections ---------------------------------------------------------


def test_inspections_run_with_bounded_concurrency(
    rtp: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-LIST-10: every cold child is inspected exactly once, at most
    ``INSPECTION_CONCURRENCY`` at a time, and the bound is reached (the inspections do
    run concurrently): the first ``bound`` readers are held at a gate until all of them
    are inside ``read`` together."""
    bound = 3
    monkeypatch.setattr(listing_module, "INSPECTION_CONCURRENCY", bound)
    rt = rtp
    store = store_of(rt)
    root = rt.spawn("echo")
    children = [
        write_child(store, root.session_id, [continuable(f"c{i}")], created_at=at(i)).id
        for i in range(10)
    ]
    gate = Gate("inspections")
    full = AbortController()

    def hold(*_args: Any) -> None:
        with store.hook_lock:
            together = store.inside_read
        if together >= bound:
            full.abort("bound reached")
        gate.pass_through(None)

    store.hooks["read"] = hold
    store.reset_counts()
    task = InTask(rt.backend, lambda: rt.subagents.list_children(root.session_id))
    assert full.signal.wait(10), f"only {store.max_inside_read} inspections ran at once"
    gate.release()
    listing = task.result()
    assert ids(listing) == children
    assert store.max_inside_read == bound
    assert dict(store.reads_of) == dict.fromkeys(children, 1)


# -- R-LIST-12, -14, -15, -16: diagnostics ------------------------------------------------------


@pytest.mark.parametrize("when", ["later", "same-instant"])
def test_a_republished_id_is_corrupt(rtp: Runtime, when: str) -> None:
    """R-LIST-12: when the session is deleted and published again under the same id while
    it is being inspected -- later, or at the same instant under the same parent but with
    another header (here a fork seed) -- the child gets a ``corrupt`` diagnostic instead
    of a row; the next listing serves the new lifecycle."""
    rt = rtp
    store = store_of(rt)
    root = rt.spawn("echo")
    header = write_child(store, root.session_id, [continuable("first life")])
    fired: list[bool] = []

    def republish(session_id: Any, *_args: Any) -> None:
        if SessionId(session_id) == header.id and not fired:
            fired.append(True)
            store.delete_session(header.id)
            write_child(
                store,
                root.session_id,
                [one_shot("second life")],
                seed=[] if when == "later" else [*turn(0, 0, 1)],
                created_at=at(60) if when == "later" else header.created_at,
                session_id=header.id,
            )

    store.hooks["read"] = republish
    listing = rt.subagents.list_children(root.session_id)
    assert listing.rows == ()
    assert kinds(listing) == {header.id: "corrupt"}
    assert fired == [True]
    again = rt.subagents.list_children(root.session_id)
    assert summary(again) == [(header.id, "one-shot", "second life", "inactive", False)]
    assert again.diagnostics == ()


def test_settled_without_identity_is_corrupt_running_is_omitted(
    rtp: Runtime,
) -> None:
    """R-LIST-14, R-LIST-16: a running candidate with no identity yet (its descriptor not
    appended) is omitted with no diagnostic; once settled without one it is ``corrupt``,
    from the cache row or from an inspection alike."""
    rt = rtp
    store = store_of(rt)
    root = rt.spawn("echo")
    nameless = live_child(rt, root.session_id)
    nameless.followup("work")
    assert nameless.wait_idle(10)
    future = live_child(rt, root.session_id, seed=[future_descriptor()])
    listing = rt.subagents.list_children(root.session_id)
    assert listing == Listing((), ())
    nameless.dispose()
    future.dispose()
    rt.sessions.flush()
    listing = rt.subagents.list_children(root.session_id)
    assert listing.rows == ()
    assert kinds(listing) == {nameless.session_id: "corrupt", future.session_id: "corrupt"}
    assert all(isinstance(d, Diagnostic) and d.detail for d in listing.diagnostics)
    store.drop_projections()
    assert rt.subagents.list_children(root.session_id) == listing


def test_a_failed_inspection_is_unavailable_and_retried(rtp: Runtime) -> None:
    """R-LIST-15: a failing persistence inspection is a transient ``unavailable``
    diagnostic for that child only; the next listing inspects it again."""
    rt = rtp
    store = store_of(rt)
    root = rt.spawn("echo")
    flaky = write_child(store, root.session_id, [continuable("flaky")], created_at=at(1))
    fine = write_child(store, root.session_id, [continuable("fine")], created_at=at(2))
    failures = [OSError("I/O error"), SubagentError("busy", code=ErrorCode.TIMEOUT)]

    def fail_once(session_id: Any, *_args: Any) -> None:
        if SessionId(session_id) == flaky.id and failures:
            raise failures.pop(0)

    store.hooks["read"] = fail_once
    for _ in range(2):
        listing = rt.subagents.list_children(root.session_id)
        assert summary(listing) == [(fine.id, "continuable", "fine", "inactive", False)]
        assert kinds(listing) == {flaky.id: "unavailable"}
    listing = rt.subagents.list_children(root.session_id)
    assert ids(listing) == [flaky.id, fine.id]
    assert listing.diagnostics == ()
    assert store.reads_of[flaky.id] == 3
    assert store.reads_of[fine.id] == 1  # cached by its first inspection


# -- R-LIST-17: has_children ---------------------------------------------------------------------


def test_has_children_from_merged_headers_without_reading_descendant_logs(
    rtp: Runtime,
) -> None:
    """R-LIST-17: ``has_children`` is true only for a child with a child whose header has
    origin ``subagent`` (persisted or live); no descendant's log is read."""
    rt = rtp
    store = store_of(rt)
    root = rt.spawn("echo")
    a = write_child(store, root.session_id, [continuable("a")], created_at=at(1))
    b = write_child(store, root.session_id, [continuable("b")], created_at=at(2))
    c = write_child(store, root.session_id, [continuable("c")], created_at=at(3))
    d = write_child(store, root.session_id, [continuable("d")], created_at=at(4))
    under_a = write_child(store, a.id, [continuable("a1")])
    under_b = write_child(store, b.id, [], origin="user")  # an ordinary session
    live_under_d = live_child(rt, d.id, seed=[continuable("d1")])
    store.reset_counts()
    listing = rt.subagents.list_children(root.session_id)
    assert [(r.id, r.has_children) for r in listing.rows] == [
        (a.id, True),
        (b.id, False),
        (c.id, False),
        (d.id, True),
    ]
    read = set(store.reads_of)
    assert read <= {a.id, b.id, c.id, d.id}
    assert not read & {under_a.id, under_b.id, live_under_d.session_id}
    store.reset_counts()
    assert rt.subagents.list_children(root.session_id) == listing
    assert store.calls["read"] == 0  # every identity now comes from the cache


# -- R-LIST-18..21: list_descendants ---------------------------------------------------------


def test_descendants_in_pre_order_through_ordinary_and_one_shot_sessions(
    rtp: Runtime,
) -> None:
    """R-LIST-18, R-LIST-19, R-LIST-20: the whole tree in stable pre-order with the durable
    parent and the depth from the root; ordinary sessions and one-shot children are
    traversed, so continuable children below them are found."""
    rt = rtp
    store = store_of(rt)
    root = rt.spawn("echo")
    r = root.session_id
    o = write_child(store, r, [*turn(0, 0, 2)], created_at=at(1))
    store.append(o.id, [one_shot("oneshot")])  # after its own turn: still its own
    u = write_child(store, r, [], created_at=at(2), origin="user")
    k = write_child(store, r, [continuable("k")], created_at=at(9))
    c1 = write_child(store, o.id, [continuable("c1")], created_at=at(3))
    c2 = write_child(store, u.id, [continuable("c2")], created_at=at(4))
    c3 = write_child(store, c2.id, [one_shot("c3")], created_at=at(5))
    c4 = write_child(store, c3.id, [continuable("c4")], created_at=at(6))
    c2b = write_child(store, u.id, [continuable("c2b")], created_at=at(4), session_id=sid(0))
    tree = rt.subagents.list_descendants(r)
    assert tree.diagnostics == ()
    assert all(isinstance(row, DescendantRow) for row in tree.rows)
    assert [(x.id, x.parent_id, x.depth, x.mode, x.label) for x in tree.rows] == [
        (o.id, r, 1, "one-shot", "oneshot"),
        (c1.id, o.id, 2, "continuable", "c1"),
        (c2b.id, u.id, 2, "continuable", "c2b"),  # same instant as c2, smaller id
        (c2.id, u.id, 2, "continuable", "c2"),
        (c3.id, c2.id, 3, "one-shot", "c3"),
        (c4.id, c3.id, 4, "continuable", "c4"),
        (k.id, r, 1, "continuable", "k"),
    ]
    assert [x.has_children for x in tree.rows] == [True, False, False, True, True, False, False]
    assert ids(rt.subagents.list_children(r)) == [o.id, k.id]
    sub = rt.subagents.list_descendants(u.id)
    assert [(x.id, x.depth) for x in sub.rows] == [(c2b.id, 1), (c2.id, 1), (c3.id, 2), (c4.id, 3)]


def test_descendants_of_a_runtime_tree(rtp: Runtime, probe: LifecycleProbe) -> None:
    """R-LIST-18, R-LIST-20, R-LIST-21: a one-shot child that started a continuable
    grandchild; the grandchild is found below it, live and cold rows mix, and a corrupt
    grandchild is a diagnostic of the descendants listing as of list_children."""
    rt = rtp
    gate = Gate()
    rt.models.register("slow", lambda _o: ScriptedBehaviour([Block(gate)]))
    rt.models.register(
        "starter",
        lambda _o: ScriptedBehaviour(
            [Call(lambda t: t.subagents.start_continuable("local", "x", label="gk", model="echo"))]
        ),
    )
    root = rt.spawn("echo")
    run = one(rt, root, "oneshot", model="starter")
    assert run.result.get(10).stop_reason == "completed"
    grandkid = first_child(probe, run.id)
    settle(rt, probe, grandkid)
    run.dispose()
    running = kid(rt, root, "running", model="slow")
    assert gate.wait_reached(10)
    broken = write_child(store_of(rt), grandkid, [future_descriptor()])
    tree = rt.subagents.list_descendants(root.session_id)
    assert [(x.id, x.parent_id, x.depth, x.activity) for x in tree.rows] == [
        (run.id, root.session_id, 1, "inactive"),
        (grandkid, run.id, 2, "inactive"),
        (running, root.session_id, 1, "running"),
    ]
    assert kinds(tree) == {broken.id: "corrupt"}
    assert kinds(rt.subagents.list_children(grandkid)) == {broken.id: "corrupt"}
    gate.release()


def test_a_live_child_gone_while_listed_is_unavailable(rt: Runtime) -> None:
    """R-LIST-15: a live child whose session leaves the live set (without persistence)
    between enumeration and its snapshot is a transient ``unavailable`` diagnostic, not an
    error; the next listing no longer sees it."""
    root = rt.spawn("echo")
    child = live_child(rt, root.session_id, seed=[continuable("brief")])
    stays = live_child(rt, root.session_id, seed=[continuable("stays")])
    sessions = rt.sessions
    real_read = sessions.read

    def read_after_release(session_id: SessionId, from_seq: int = 0) -> Any:
        if session_id == child.session_id and not child.disposed:
            child.dispose()
        return real_read(session_id, from_seq)

    sessions.read = read_after_release  # type: ignore[method-assign]
    try:
        listing = rt.subagents.list_children(root.session_id)
    finally:
        del sessions.read
    assert ids(listing) == [stays.session_id]
    assert kinds(listing) == {child.session_id: "unavailable"}
    assert rt.subagents.list_children(root.session_id) == Listing(listing.rows, ())


def test_a_fork_childs_own_identity_is_cached_past_its_seed(
    rtp: Runtime, probe: LifecycleProbe
) -> None:
    """R-LIST-9, R-PROJ-2, R-PROJ-7: a ``fork`` child's seed is its parent's completed
    history, the parent's own descriptor included; the child's identity is its own
    descriptor, the cache row written when it leaves the live set sits at that
    descriptor (``seq == seed_len``) and serves the next listing without a log read, and
    the parent's turn never enters the child's active time."""
    rt = rtp
    store = store_of(rt)

    def fork_child(t: Any) -> None:
        t.subagents.start_continuable("fork", "go", label="forked", model="echo")

    rt.models.register("mid", lambda _o: ScriptedBehaviour(per_turn=[[], [Call(fork_child)]]))
    root = rt.spawn("echo")
    mid = kid(rt, root, "mid", model="mid")
    settle(rt, probe, mid)
    rt.subagents.followup(root, mid, "fork now")
    forked = first_child(probe, mid)
    settle(rt, probe, forked, mid)
    header = store.header(forked)
    assert header is not None and header.seed_len == 4
    assert store.get_projection(forked, "subagent") == (4, identity_blob("continuable", "forked"))
    store.reset_counts()
    listing = rt.subagents.list_children(mid)
    assert summary(listing) == [(forked, "continuable", "forked", "inactive", False)]
    assert store.reads_of[forked] == 0
    registry = rt.session_projections
    assert registry is not None
    records = store.read(forked)
    timing = registry.values(registry.fold((r.seq, r.event) for r in records))["subagent_timing"]
    assert timing == {"active_seconds": 1.0, "active": None}  # its own turn: one clock step
    parent_timing = registry.values(registry.fold((r.seq, r.event) for r in records[:4]))
    assert parent_timing["subagent"] == {"mode": "continuable", "label": "mid"}


@pytest.mark.parametrize("bulk_read", ["works", "raises"])
def test_a_big_listing_reads_the_cache_in_one_go(rtp: Runtime, bulk_read: str) -> None:
    """R-LIST-9, R-LIST-11: past 64 cold children the cache is read in one persistence
    read, with the same fork-seed gate (a row inside the seed is ignored, an undecodable
    row renders no verdict); when that read raises, the per-child reads take over
    silently, with the same result. (An SQL store reads the rows with the children's
    headers, in the same statement; "raises" breaks that read too.)"""
    rt = rtp
    store = store_of(rt)
    root = rt.spawn("echo")
    r = root.session_id
    seeded = write_child(store, r, OWN, seed=SEED, created_at=at(0))
    store.put_projection(seeded.id, "subagent", 1, identity_blob("continuable", "in the seed"))
    garbage = write_child(store, r, [one_shot("g")], created_at=at(1))
    store.put_projection(garbage.id, "subagent", 0, b"\xc1")
    cached = []
    for i in range(68):
        child = write_child(store, r, [continuable(f"c{i}")], created_at=at(2 + i))
        store.put_projection(child.id, "subagent", 0, identity_blob("continuable", f"cached{i}"))
        cached.append(child.id)
    if bulk_read == "raises":

        def broken(*_args: Any) -> None:
            raise OSError("cache table unreadable")

        store.hooks["get_projections_of"] = broken
        store.hooks["scan_children_with"] = broken
    store.reset_counts()
    listing = rt.subagents.list_children(r)
    assert listing.diagnostics == ()
    assert [(x.id, x.label) for x in listing.rows] == [
        (seeded.id, "own"),
        (garbage.id, "g"),
        *((c, f"cached{i}") for i, c in enumerate(cached)),
    ]
    # One read of these children's rows (none apart from the joined read), not of
    # the whole cache table.
    apart = 0 if bulk_read == "works" and hasattr(store, "scan_children_with") else 1
    assert store.calls["get_projections_of"] == apart and store.calls["get_projections"] == 0
    assert store.calls["get_projection"] == (0 if bulk_read == "works" else 70)
    assert dict(store.reads_of) == {seeded.id: 1, garbage.id: 1}


def test_the_subagent_unit_is_the_only_classification_authority(
    rtp: Runtime, probe: LifecycleProbe
) -> None:
    """R-LIST-13: listing parses no descriptor itself: a Catalog over a registry whose
    ``subagent`` unit serves its own values lists exactly those, for live and cold
    children alike, and a unit that serves nothing makes settled children corrupt."""
    rt = rtp
    gate = Gate()
    rt.models.register("slow", lambda _o: ScriptedBehaviour([Block(gate)]))
    root = rt.spawn("echo")
    cold = kid(rt, root, "cold")
    settle(rt, probe, cold)
    rt.store.drop_projections()  # type: ignore[union-attr]
    live = kid(rt, root, "live", model="slow")
    assert gate.wait_reached(10)

    def shout(state: Any, seq: int, event: Event) -> Any:
        if isinstance(event, SubagentDescriptorEvent):
            return {"mode": "one-shot", "label": str(event.payload.get("label")).upper()}
        return state

    def registry(step: Callable[[Any, int, Event], Any]) -> ProjectionRegistry:
        reg = ProjectionRegistry()
        reg.register(
            ProjectionUnit(name="subagent", initial=lambda: None, step=step, value=lambda s: s)
        )
        return reg

    catalog = Catalog(rt.sessions, rt.store, registry(shout), rt.backend)
    listing = catalog.list_children(root.session_id)
    assert [(x.id, x.mode, x.label, x.activity) for x in listing.rows] == [
        (cold, "one-shot", "COLD", "inactive"),
        (live, "one-shot", "LIVE", "running"),
    ]
    rt.store.drop_projections()  # type: ignore[union-attr]
    blind = Catalog(rt.sessions, rt.store, registry(lambda s, q, e: None), rt.backend)
    assert blind.list_children(root.session_id) == Listing(
        (), (Diagnostic(id=cold, kind="corrupt", detail="no identity in its log"),)
    )
    gate.release()


@pytest.mark.parametrize("children", [1, 70], ids=["per-id-reads", "bulk-read"])
def test_a_rewritten_cache_row_is_served_anew(rtp: Runtime, children: int) -> None:
    """R-LIST-9: decoded identities are remembered by the exact bytes of their cache
    row, so a listing after the row changed serves the new identity, never the one
    an earlier listing decoded (both the per-id and the bulk cache read, which
    starts at 64 candidates)."""
    rt = rtp
    store = store_of(rt)
    root = rt.spawn("echo")
    headers = [write_child(store, root.session_id, OWN) for _ in range(children)]
    for h in headers:
        store.put_projection(h.id, "subagent", 4, identity_blob("continuable", "first"))
    listing = rt.subagents.list_children(root.session_id)
    assert {row.label for row in listing.rows} == {"first"}
    store.put_projection(headers[0].id, "subagent", 4, identity_blob("one-shot", "second"))
    listing = rt.subagents.list_children(root.session_id)
    assert len(listing.rows) == children
    changed = [row for row in listing.rows if row.id == headers[0].id]
    assert [(row.mode, row.label) for row in changed] == [("one-shot", "second")]
    assert {row.label for row in listing.rows if row.id != headers[0].id} <= {"first"}
    tree = rt.subagents.list_descendants(root.session_id)
    assert [(r.mode, r.label) for r in tree.rows if r.id == headers[0].id] == [
        ("one-shot", "second")
    ]


def test_the_runtime_keeps_one_catalog(rtp: Runtime) -> None:
    """One catalog serves the runtime's listings, so the identities it
    decoded for one listing are not decoded again for the next; a different mount
    (the projection registry replaced) gets a catalog of its own."""
    root = rtp.spawn("echo")
    service = rtp.subagents
    first = service._catalog(None)
    service.list_children(root.session_id)
    assert service._catalog(None) is first
    projections = rtp.session_projections
    rtp.session_projections = ProjectionRegistry()
    try:
        assert service._catalog(None) is not first
    finally:
        rtp.session_projections = projections
    assert service._catalog(None) is not first  # rebuilt once more for the old mount
