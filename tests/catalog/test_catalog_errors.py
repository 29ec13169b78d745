"""Cancellation and error codes of the listing (R-ERR-1..5, R-LIST-21).

An abort is forced from *inside* a store read (a hook of the hooked stores calls
``controller.abort``), so the read provably started before the abort and the
listing must notice it right after; the read log then shows that no persistence
read began after the abort.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from catalog_kit import (
    InTask,
    at,
    continuable,
    hooked,
    write_child,
)
from subagents.actors import (
    AbortController,
    AbortSignal,
    Agent,
    ContinuableStartSpec,
    Runtime,
)
from subagents.actors._catalog import Catalog, Listing
from subagents.actors._catalog import _identity as _listing
from subagents.actors._catalog._projections import ProjectionRegistry, subagent_timing_unit
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Block, Gate, ScriptedBehaviour
from subagents.protocol import ErrorCode, SessionId, SubagentError
from subagents.store import MemoryStore

LISTINGS = ["list_children", "list_descendants"]


def listing(rt: Runtime, which: str, root: SessionId, signal: Any = None) -> Listing:
    fn: Callable[..., Listing] = getattr(rt.subagents, which)
    return fn(root, signal)


def _joins(store: Any) -> bool:
    """Whether the store reads a tree level's identity rows with its headers."""
    return hasattr(store, "scan_children_with")


def code_of(fn: Callable[[], Any]) -> str:
    with pytest.raises(SubagentError) as err:
        fn()
    return err.value.code


def slow_model(gate: Gate) -> Callable[[Any], ScriptedBehaviour]:
    return lambda _options: ScriptedBehaviour([Block(gate)])


# -- R-ERR-3: an already-aborted signal ----------------------------------------------------


@pytest.mark.parametrize("which", LISTINGS)
def test_an_aborted_signal_cancels_before_any_read(rtp: Runtime, which: str) -> None:
    """R-ERR-3: a signal already aborted when the call begins raises ``CANCELLED`` and no
    persistence read happens."""
    store = hooked(rtp)
    root = rtp.spawn("echo")
    write_child(store, root.session_id, [continuable("c")])
    store.reset_counts()
    signal = AbortSignal.aborted_with("too late")
    assert code_of(lambda: listing(rtp, which, root.session_id, signal)) == ErrorCode.CANCELLED
    assert sum(store.calls.values()) == 0


@pytest.mark.parametrize("which", LISTINGS)
def test_an_aborted_signal_cancels_a_live_only_listing(rt: Runtime, which: str) -> None:
    """R-ERR-3: without persistence too."""
    root = rt.spawn("echo")
    signal = AbortSignal.aborted_with("too late")
    assert code_of(lambda: listing(rt, which, root.session_id, signal)) == ErrorCode.CANCELLED


# -- R-ERR-2, R-ERR-3: an abort inside each persistence read ---------------------------------


@pytest.mark.parametrize("which", LISTINGS)
@pytest.mark.parametrize("method", ["headers", "get_projection", "read", "header"])
def test_an_abort_inside_a_persistence_read_cancels_at_once(
    rtp: Runtime, which: str, method: str
) -> None:
    """R-ERR-2, R-ERR-3: the signal is checked right after each persistence read: an abort
    during any of them raises ``CANCELLED`` (never a partial result), and no later
    persistence read begins. ("headers": the header read, ``scan_children``: both
    listings read the parent index.)"""
    if method == "headers":
        method = "scan_children"
    store = hooked(rtp)
    if method == "get_projection" and _joins(store):
        pytest.skip("an SQL store's listing reads identity rows with each level")
    root = rtp.spawn("echo")
    write_child(store, None, [], origin="user")  # another tree: the level reads are made
    for i in range(3):
        write_child(store, root.session_id, [continuable(f"c{i}")], created_at=at(i))
    controller = AbortController()
    aborted_at: list[int] = []

    def abort(*_args: Any) -> None:
        if not aborted_at:
            aborted_at.append(len(store.read_log))
            controller.abort("stop")

    store.hooks[method] = abort
    store.reset_counts()
    before = _listing.INSPECTION_CONCURRENCY
    _listing.INSPECTION_CONCURRENCY = 1  # one inspection at a time: "later" is exact
    try:
        code = code_of(lambda: listing(rtp, which, root.session_id, controller.signal))
    finally:
        _listing.INSPECTION_CONCURRENCY = before
    assert code == ErrorCode.CANCELLED
    assert aborted_at, f"the listing never called {method}"
    assert len(store.read_log) == aborted_at[0], store.read_log[aborted_at[0] :]


@pytest.mark.parametrize("method", ["sole_root", "scan_headers"])
def test_an_abort_inside_the_reads_of_a_stores_only_tree(rtp: Runtime, method: str) -> None:
    """R-ERR-2, R-ERR-3: the tree that is a whole SQL store is read with the question
    whether it is (``sole_root``) and one scan: an abort inside either raises
    ``CANCELLED``, and no later persistence read begins."""
    store = hooked(rtp)
    if not hasattr(store, "sole_root"):
        pytest.skip("a memory store reads every tree level by level")
    root = rtp.spawn("echo")
    for i in range(3):
        write_child(store, root.session_id, [continuable(f"c{i}")], created_at=at(i))
    controller = AbortController()
    aborted_at: list[int] = []

    def abort(*_args: Any) -> None:
        aborted_at.append(len(store.read_log))
        controller.abort("stop")

    store.hooks[method] = abort
    store.reset_counts()
    code = code_of(lambda: rtp.subagents.list_descendants(root.session_id, controller.signal))
    assert code == ErrorCode.CANCELLED
    assert aborted_at and len(store.read_log) == aborted_at[0], store.read_log
    assert [m for m, _ in store.read_log][-1] == method


def test_an_abort_inside_a_live_childs_persisted_prefix_read(rtp: Runtime) -> None:
    """R-ERR-2, R-ERR-3: a live child's watermark snapshot reads the persisted prefix of
    its log (the live tail was trimmed once committed); an abort during that read is
    noticed right after it, before any other persistence read."""
    rt = rtp
    store = hooked(rt)
    gates = [Gate("a"), Gate("b")]
    for i, gate in enumerate(gates):
        rt.models.register(f"slow{i}", slow_model(gate))
    root = rt.spawn("echo")
    for i, gate in enumerate(gates):
        rt.subagents.start_continuable(
            ContinuableStartSpec(
                parent=root, provider="local", prompt="p", label=f"k{i}", model=f"slow{i}"
            )
        )
        assert gate.wait_reached(10)
    rt.sessions.flush()
    controller = AbortController()
    aborted_at: list[int] = []

    def abort(*_args: Any) -> None:
        if not aborted_at:
            aborted_at.append(len(store.read_log))
            controller.abort("stop")

    store.hooks["read"] = abort
    store.reset_counts()
    try:
        code = code_of(lambda: rt.subagents.list_children(root.session_id, controller.signal))
    finally:
        for gate in gates:
            gate.release()
    assert code == ErrorCode.CANCELLED
    assert aborted_at, "the live snapshot never read persistence"
    assert len(store.read_log) == aborted_at[0], store.read_log[aborted_at[0] :]


def test_a_signal_must_be_an_abort_signal(rtp: Runtime) -> None:
    """R-ERR-1: a wrong signal type is ``INVALID_ARGUMENT``."""
    root = rtp.spawn("echo")
    code = code_of(lambda: rtp.subagents.list_children(root.session_id, "soon"))  # type: ignore[arg-type]
    assert code == ErrorCode.INVALID_ARGUMENT


# -- R-ERR-4, R-ERR-5: missing dependencies ---------------------------------------------------


@pytest.mark.parametrize("which", LISTINGS)
@pytest.mark.parametrize("persistent", [False, True], ids=["live-only", "persistent"])
def test_no_projection_registry(backend: Backend, which: str, persistent: bool) -> None:
    """R-ERR-4: without a mounted projection registry listing fails loud."""
    store = MemoryStore() if persistent else None
    with Runtime(store, backend=backend, projections=False) as rt:
        root = rt.spawn("echo")
        code = code_of(lambda: listing(rt, which, root.session_id))
        assert code == "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE"


def test_a_registry_without_the_subagent_unit_is_unavailable(rt: Runtime) -> None:
    """R-ERR-4: a registry that does not serve the ``subagent`` unit cannot classify."""
    registry = ProjectionRegistry()
    registry.register(subagent_timing_unit)
    catalog = Catalog(rt.sessions, None, registry, rt.backend)
    root = rt.spawn("echo")
    for which in LISTINGS:
        code = code_of(lambda: getattr(catalog, which)(root.session_id))  # noqa: B023
        assert code == ErrorCode.PROJECTIONS_UNAVAILABLE


@pytest.mark.parametrize("which", LISTINGS)
def test_no_session_store(rtp: Runtime, which: str) -> None:
    """R-ERR-5: without a live session store listing fails loud, through the service (a
    runtime whose ``sessions`` is unmounted) and through a Catalog built without one."""
    root: Agent = rtp.spawn("echo")
    sessions = rtp.sessions
    rtp.sessions = None  # type: ignore[assignment]
    try:
        code = code_of(lambda: listing(rtp, which, root.session_id))
    finally:
        rtp.sessions = sessions
    assert code == "SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE"
    catalog = Catalog(
        rtp.sessions,
        rtp.store,
        rtp.session_projections,
        rtp.backend,
        live_store_mounted=False,
    )
    code = code_of(lambda: getattr(catalog, which)(root.session_id))
    assert code == ErrorCode.SESSION_STORE_UNAVAILABLE


@pytest.mark.parametrize("which", LISTINGS)
@pytest.mark.parametrize("persistent", [False, True], ids=["live-only", "persistent"])
def test_a_closed_runtimes_listing_is_store_closed(
    backend: Backend, which: str, persistent: bool
) -> None:
    """A closed runtime lists no children: ``STORE_CLOSED``, with a store or
    without one (its sessions ended with it). Without a store it answered an
    empty listing, as if the parent never had a child."""
    with Runtime(MemoryStore() if persistent else None, backend=backend) as rt:
        root = rt.spawn("echo")
        if persistent:  # (a continuable child needs a store)
            rt.subagents.start_continuable(
                ContinuableStartSpec(
                    parent=root, provider="local", prompt="hi", label="k", model="echo"
                )
            )
        assert len(listing(rt, which, root.session_id).rows) == int(persistent)
    assert code_of(lambda: listing(rt, which, root.session_id)) == ErrorCode.STORE_CLOSED


def test_an_abort_during_concurrent_inspections(
    rtp: Runtime, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-ERR-3, R-LIST-10: an abort while several inspections are inside ``read`` raises
    ``CANCELLED`` once they return, with no partial result and no further read."""
    bound = 3
    monkeypatch.setattr(_listing, "INSPECTION_CONCURRENCY", bound)
    store = hooked(rtp)
    root = rtp.spawn("echo")
    for i in range(8):
        write_child(store, root.session_id, [continuable(f"c{i}")], created_at=at(i))
    gate = Gate("reads")
    full = AbortController()
    controller = AbortController()

    def hold(*_args: Any) -> None:
        with store.hook_lock:
            together = store.inside_read
        if together >= bound:
            full.abort("all inside")
        gate.pass_through(None)

    store.hooks["read"] = hold
    store.reset_counts()
    task = InTask(
        rtp.backend, lambda: rtp.subagents.list_children(root.session_id, controller.signal)
    )
    assert full.signal.wait(10)
    controller.abort("stop")
    reads_at_abort = store.calls["read"]
    gate.release()
    with pytest.raises(SubagentError) as err:
        task.result()
    assert err.value.code == ErrorCode.CANCELLED
    assert store.calls["read"] == reads_at_abort == bound
    assert store.calls["header"] == 0


def test_an_abort_inside_the_bulk_cache_read(rtp: Runtime) -> None:
    """R-ERR-2, R-ERR-3: the one-go cache read of a big listing is a persistence read too:
    an abort inside it raises ``CANCELLED`` before any other read."""
    store = hooked(rtp)
    root = rtp.spawn("echo")
    write_child(store, None, [], origin="user")  # another tree: the level reads are made
    for i in range(70):
        write_child(store, root.session_id, [continuable(f"c{i}")], created_at=at(i))
    controller = AbortController()

    def abort(*_args: Any) -> None:
        controller.abort("stop")

    store.hooks["get_projections"] = abort
    store.hooks["get_projections_of"] = abort  # list_children reads its family's rows
    store.reset_counts()
    for which in LISTINGS:
        # Both read the family through the parent index (root, then its children).
        reads = ["scan_children", "scan_children", "get_projections_of"]
        if _joins(store):
            # The identity rows come with each level's read: no cache read to abort
            # (and no read of the leaves' children: the level read said they have none).
            assert len(listing(rtp, which, root.session_id, controller.signal).rows) == 70
            methods = [m for m, _ in store.read_log]
            assert methods.count("scan_children") == 1  # then inspections, if uncached
            assert "get_projections_of" not in methods and "get_projections" not in methods
        else:
            code = code_of(lambda: listing(rtp, which, root.session_id, controller.signal))  # noqa: B023
            assert code == ErrorCode.CANCELLED
            assert [m for m, _ in store.read_log] == reads
        store.reset_counts()
        controller = AbortController()
