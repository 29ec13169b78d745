"""Issue 15: continuable children placed on a Ray cluster behave as local ones.

Every scenario runs over ``local`` (the built-in provider) and ``ray`` (a
:class:`~subagents.actors.ray.RayPlacement` of two host processes on the same
SQLite file), on both backends: follow-ups run once each, in order; interrupt,
report and drain keep their authority rules; a placed child delegates further;
the parent keeps ownership and releases child-first. Cross-process interleavings
are forced by files named in the messages (``hostkit.hold``); waiting for an
effect in another process polls the store until a deadline.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sqlite3
import time
import warnings
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import hostkit
import pytest
from subagents.actors import (
    AncestorAuthority,
    Backend,
    ContinuableStartSpec,
    Runtime,
    UserAuthority,
)
from subagents.protocol import ErrorCode, InterruptEvent, SessionId, SubagentError

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]


_BACKEND: list[Backend] = []


def eventually(
    check: Callable[[], Any], timeout: float = 60.0, why: Callable[[], Any] | None = None
) -> Any:
    """Poll ``check`` until it returns something true (effects in another process);
    sleeping the backend's way, so a gevent runtime's tasks run meanwhile. ``why``:
    what the failure message shows of the state then."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"the condition did not hold in time: {why() if why else ''}")
        _BACKEND[-1].sleep(0.02)


class Tree:
    """A parent runtime on the shared store, with ``provider`` for its children."""

    def __init__(self, rt: Runtime, provider: str) -> None:
        self.rt = rt
        self.provider = provider
        self.root = rt.spawn("parent", label="root")

    def start(self, prompt: Any, model: str = "note", label: str = "child") -> SessionId:
        spec = ContinuableStartSpec(
            parent=self.root, provider=self.provider, prompt=prompt, label=label, model=model
        )
        return self.rt.subagents.start_continuable(spec).child_id

    def outputs(self, sid: SessionId) -> list[Any]:
        return [e.output for e in self.rt.sessions.turn_ends(sid)]

    def wait_outputs(self, sid: SessionId, n: int) -> list[Any]:
        return eventually(lambda: (o := self.outputs(sid)) and len(o) >= n and o)

    def settled(self, sid: SessionId) -> bool:
        return self.rt.continuation.activation(sid) is None


@contextlib.contextmanager
def parent_tree(
    db: str, backend: Backend, placement: Any, provider: str, **runtime: Any
) -> Iterator[Tree]:
    """A parent runtime on ``db`` (``runtime``: more of its arguments) with the
    models and ``placement`` registered, and its root; closed after."""
    _BACKEND[:] = [backend]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        rt = Runtime(db, backend=backend, lease_ttl=3.0, **runtime)
    hostkit.setup(rt)
    registration = rt.subagents.register_provider(placement) if placement is not None else None
    try:
        yield Tree(rt, provider)
    finally:
        rt.close()
        if registration is not None:
            registration.dispose()


@pytest.fixture(params=["local", "ray"])
def tree(
    request: pytest.FixtureRequest, backend: Backend, tmp_path: Path, ray_pool: tuple[str, Any]
) -> Iterator[Tree]:
    # ray_pool for both: a session fixture set up before any test's leak guard.
    if request.param == "ray":
        db, placement = ray_pool
    else:
        db, placement = str(tmp_path / "local.db"), None
    with parent_tree(db, backend, placement, request.param) as made:
        yield made


def _pid(output: str) -> int:
    return int(output.rsplit("@", 1)[1].rstrip("!"))


def test_followups_run_once_each_in_order_where_placed(tree: Tree) -> None:
    """R-CONT-1/R-FU-1 on either placement: the prompt and ten follow-ups each run
    once, in order, in the host's process (ray) or here (local); the child settles
    between them and resumes where it is placed."""
    cid = tree.start("m0")
    for i in range(1, 11):
        tree.rt.subagents.followup(tree.root, cid, f"m{i}")
    outputs = tree.wait_outputs(cid, 11)
    assert [o.split("@")[0] for o in outputs] == [f"m{i}" for i in range(11)]
    # Nothing crashed: no turn is a replay (a placed child's prompt was, its
    # creation having handed it to the parent's epoch, which let it go untaken).
    assert not [o for o in outputs if o.endswith("!")]
    pids = {_pid(o) for o in outputs}
    if tree.provider == "ray":
        assert os.getpid() not in pids
    else:
        assert pids == {os.getpid()}
    eventually(lambda: tree.settled(cid))
    tree.rt.subagents.followup(tree.root, cid, "after settling")
    assert tree.wait_outputs(cid, 12)[-1].startswith("after settling@")


def test_only_the_exact_live_parent_follows_up(tree: Tree) -> None:
    """R-FU-3: another agent is UNAUTHORIZED, for a placed child as for a local one."""
    cid = tree.start("first")
    other = tree.rt.spawn("parent", label="other")
    with pytest.raises(SubagentError) as caught:
        tree.rt.subagents.followup(other, cid, "not yours")
    assert caught.value.code == ErrorCode.UNAUTHORIZED
    tree.wait_outputs(cid, 1)


def test_interrupt_cancels_the_running_turn_and_keeps_the_inbox(tree: Tree, tmp_path: Path) -> None:
    """R-INT-1/R-INT-8: an ancestor interrupts the running turn (wherever it runs);
    the queued follow-up still runs; the interrupt is in the child's log; a user
    authority at another address is refused."""
    marker = tmp_path / "turn"
    cid = tree.start(f"hold:{marker}", model="hold")
    eventually(lambda: Path(f"{marker}.started").exists())
    tree.rt.subagents.followup(tree.root, cid, "queued")
    with pytest.raises(SubagentError) as caught:
        tree.rt.subagents.interrupt(cid, UserAuthority(tree.rt.spawn("parent").session_id))
    assert caught.value.code == ErrorCode.UNAUTHORIZED
    tree.rt.subagents.interrupt(cid, AncestorAuthority(tree.root))
    outputs = tree.wait_outputs(cid, 2)
    assert outputs[0] == "cancelled"
    assert outputs[1].startswith("queued@")
    events = [r.event for r in tree.rt.sessions.read(cid)]
    interrupts = [e for e in events if isinstance(e, InterruptEvent)]
    assert [(e.authority, e.by_session) for e in interrupts] == [("ancestor", tree.root.session_id)]


def test_an_ancestor_interrupts_a_grandchild_wherever_it_runs(tree: Tree, tmp_path: Path) -> None:
    """R-INT-1: the root interrupts its grandchild -- started by a (placed) child
    where that child runs -- as an ancestor: the grandchild's running turn is
    cancelled, and the interrupt logged as the root's. Placed, it returned at
    once and did nothing (the grandchild is live only on the child's host)."""
    marker = tmp_path / "grand"
    cid = tree.start(str(marker), model="spawner")
    gid = SessionId(tree.wait_outputs(cid, 1)[0])
    eventually(lambda: Path(f"{marker}.started").exists())
    with pytest.raises(SubagentError) as caught:  # an agent that is no ancestor
        tree.rt.subagents.interrupt(gid, AncestorAuthority(tree.rt.spawn("parent")))
    assert caught.value.code == ErrorCode.UNAUTHORIZED
    tree.rt.subagents.interrupt(gid, AncestorAuthority(tree.root))
    store = tree.rt.store
    assert store is not None
    ends = eventually(
        lambda: tree.outputs(gid),
        why=lambda: f"lease={store.get_lease(gid)} log={[r.event.type for r in store.read(gid)]}",
    )
    assert ends[0] == "cancelled"
    events = [r.event for r in tree.rt.sessions.read(gid)]
    interrupts = [e for e in events if isinstance(e, InterruptEvent)]
    assert [(e.authority, e.by_session) for e in interrupts] == [("ancestor", tree.root.session_id)]


def test_a_waking_report_reaches_the_parent_once(tree: Tree) -> None:
    """R-REP-1/R-REP-3: a placed child's waking report starts one parent turn."""
    cid = tree.start("hello", model="reporter")
    tree.wait_outputs(cid, 1)
    parent_outputs = eventually(
        lambda: [o for o in tree.outputs(tree.root.session_id) if "report:hello" in str(o)]
    )
    assert parent_outputs == ["parent saw report:hello"]


def test_a_placed_child_delegates_further(tree: Tree) -> None:
    """The child runs a one-shot child and starts a continuable grandchild of its
    own (where it runs); the grandchild's report reaches the child."""
    cid = tree.start("plan", model="delegator")
    first = tree.wait_outputs(cid, 1)[0]
    helper, grandchild = first.split("|")
    assert helper.startswith("one-shot work@")
    gid = SessionId(grandchild)
    header = tree.rt.sessions.header(gid)
    assert header is not None and header.parent_session == cid
    assert tree.wait_outputs(gid, 1)[0].startswith("grandchild work@")
    # The grandchild's waking report became a turn of the child.
    later = tree.wait_outputs(cid, 2)
    assert later[1].startswith("report:grandchild work@")
    if tree.provider == "ray":
        assert _pid(helper) != os.getpid()


def test_a_settled_grandchild_of_a_placed_child_is_reached_by_id(tree: Tree) -> None:
    """The tree settled: the placed child's own continuable grandchild (started on
    its host) is followed up by its parent's id from the parent's process. The
    wake climbs to the root, wakes the placed child on a host, and the host wakes
    the grandchild below it: the message runs. It was accepted and never ran (the
    wake stopped at the placed child, which is no agent here; a host dropped
    rings about the children of the sessions it held)."""
    cid = tree.start("plan", model="delegator")
    _helper, grandchild = tree.wait_outputs(cid, 1)[0].split("|")
    gid = SessionId(grandchild)
    tree.wait_outputs(gid, 1)
    tree.wait_outputs(cid, 2)  # the grandchild's report ran
    eventually(lambda: tree.settled(cid))
    tree.rt.subagents.followup(cid, gid, "by id")
    assert tree.wait_outputs(gid, 2)[1].startswith("by id@")


def test_drain_cancels_and_releases_then_closes_admission(tree: Tree, tmp_path: Path) -> None:
    """R-DRAIN-1/R-DRAIN-3: drain cancels the running turn, releases the child
    (on its host too), and admission stays closed below the drained parent."""
    marker = tmp_path / "drained"
    cid = tree.start(f"hold:{marker}", model="hold")
    eventually(lambda: Path(f"{marker}.started").exists())
    tree.rt.subagents.drain_continuable_descendants([tree.root], timeout=60)
    assert tree.settled(cid)
    assert tree.outputs(cid) == ["cancelled"]
    with pytest.raises(SubagentError) as caught:
        tree.rt.subagents.followup(tree.root, cid, "after the drain")
    assert caught.value.code == ErrorCode.ADMISSION_CLOSED


@pytest.mark.parametrize("tree", ["ray"], indirect=True)
def test_a_host_killed_mid_turn_hands_the_child_to_another_host(
    tree: Tree, tmp_path: Path, ray_pool: tuple[str, Any]
) -> None:
    """Issue 15 point 2 (and issue 13 point 2 across hosts): the host running a turn
    is SIGKILLed; the next run takes the child on another host, which replays the
    cut turn (``redelivered``) and then the follow-up accepted behind it -- each
    accepted message completes exactly once. (The cut turn ends ``failed`` when
    its start was written before the kill; a host under load may still hold it in
    its writer then: the log shows no trace of the cut run.)"""
    import signal

    marker = tmp_path / "killed"
    cid = tree.start(f"hold:{marker}", model="hold")
    started = Path(f"{marker}.started")
    eventually(lambda: started.exists() and started.read_text())
    first_host = int(started.read_text())
    tree.rt.subagents.followup(tree.root, cid, "behind the cut turn")
    started.unlink()
    os.kill(first_host, signal.SIGKILL)
    eventually(lambda: started.exists() and started.read_text())
    second_host = int(started.read_text())
    assert second_host not in (first_host, os.getpid())
    Path(f"{marker}.go").write_text("go")

    def completed() -> list[Any]:
        return [e for e in tree.rt.sessions.turn_ends(cid) if e.stop_reason == "completed"]

    eventually(
        lambda: len(completed()) >= 2, timeout=90, why=lambda: _placed_state(tree, cid, ray_pool[1])
    )
    ends = tree.rt.sessions.turn_ends(cid)
    assert [e.output for e in ends[-2:]] == [
        f"released@{second_host}!",
        f"behind the cut turn@{second_host}",
    ]
    assert [(e.stop_reason, e.output) for e in ends[:-2]] in ([], [("failed", None)])
    placement = ray_pool[1]
    # (host_of: None once it settled -- the pool forgets it -- or placed again.)
    assert "log=" in _placed_state(tree, cid, placement)  # what a failure would show


def _placed_state(tree: Tree, cid: SessionId, placement: Any) -> str:
    """What a placed child's store and placement say of it (a failure's message)."""
    store = tree.rt.store
    log = [f"{r.seq}:{r.event.type}" for r in tree.rt.sessions.read(cid)]
    pending = [(e.n, e.epoch, getattr(e.event, "content", None)) for e in store.pending(cid)]
    host = placement.host_of(cid)
    return f"lease={store.get_lease(cid)} pending={pending} host={host} log={log}"


def _unpicklable_setup() -> Callable[[Any], None]:
    import threading

    lock = threading.Lock()

    def setup(runtime: Any) -> None:
        with lock:
            hostkit.setup(runtime)

    return setup


def test_placement_arguments_and_limits(backend: Backend, tmp_path: Path, ray_pool: Any) -> None:
    """A bad pool is INVALID_ARGUMENT; a one-shot child is not placed; placing needs a
    strict durable store (relaxed: PERSISTENCE_UNAVAILABLE, nothing created)."""
    from subagents.actors.ray import RayPlacement

    for bad in (0, -1, 1.5, "2"):
        with pytest.raises(SubagentError) as caught:
            RayPlacement(str(tmp_path / "x.db"), hosts=bad)
        assert caught.value.code == ErrorCode.INVALID_ARGUMENT
    # Each was a raw ValueError or TypeError from Ray, or a host that died starting.
    for kwargs in (
        {"num_cpus": -1},
        {"num_cpus": "1"},
        {"max_restarts": "x"},
        {"max_restarts": -2},
        {"lease_ttl": -1},
        {"lease_ttl": float("nan")},
        {"name": 5},
        {"name": " "},
        {"resources": {"gpu": -1}},
        {"resources": ["CPU"]},
        {"resources": {"CPU": 1}},  # Ray: use num_cpus
        {"options": {"bogus": 1}},
        {"options": {1: 1}},
        {"start_timeout": 0},
        {"call_timeout": float("inf")},
        # A raw TypeError, ValueError, AssertionError, ActorAlreadyExistsError:
        {"setup": _unpicklable_setup()},
        {"options": {"scheduling_strategy": "BOGUS"}},
        {"options": {"placement_group": "x"}},
        {"hosts": 2, "options": {"name": "one-name-for-two"}},
    ):
        with pytest.raises(SubagentError) as caught:
            RayPlacement(str(tmp_path / "x.db"), **kwargs)
        assert caught.value.code == ErrorCode.INVALID_ARGUMENT, kwargs
    placement = ray_pool[1]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        rt = Runtime(ray_pool[0], backend=backend, durability="relaxed")  # the pool's store
    try:
        hostkit.setup(rt)
        registration = rt.subagents.register_provider(placement)
        root = rt.spawn("parent")
        with pytest.raises(SubagentError) as caught:
            rt.subagents.start_continuable(
                ContinuableStartSpec(parent=root, provider="ray", prompt="x", label="c")
            )
        assert caught.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
        assert len(rt.subagents.list_children(root.session_id)) == 0
        with pytest.raises(SubagentError) as caught:
            root.subagents.delegate("ray", "one-shot", label="once")
        assert caught.value.code == ErrorCode.INVALID_ARGUMENT
        registration.dispose()
    finally:
        rt.close()


def test_a_pool_on_another_store_is_refused_when_registered(
    backend: Backend, tmp_path: Path, ray_pool: Any
) -> None:
    """A placement whose hosts open another store than the runtime registering it:
    ``INVALID_ARGUMENT`` at ``register_provider`` (its children's starts were
    accepted and never ran, the hosts warning every sweep that the session did
    not exist). The same file by another spelling is the same store."""
    db, placement = ray_pool
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        other = Runtime(str(tmp_path / "other.db"), backend=backend)
        same = Runtime(
            os.path.join(os.path.dirname(db), ".", os.path.basename(db)), backend=backend
        )
    try:
        with pytest.raises(SubagentError) as caught:
            other.subagents.register_provider(placement)
        assert caught.value.code == ErrorCode.INVALID_ARGUMENT
        assert other.subagents.get_provider("ray") is None
        same.subagents.register_provider(placement).dispose()
    finally:
        other.close()
        same.close()


def test_a_pool_whose_hosts_cannot_start_is_refused_at_once(
    backend: Backend, tmp_path: Path, ray_pool: Any
) -> None:
    """Hosts whose ``setup`` raises, or that ask for more than the cluster has,
    refuse the pool when it is built -- ``INVALID_ARGUMENT`` with the cause, and
    ``TIMEOUT`` after ``start_timeout`` -- and the hosts started are stopped. (The
    pool was accepted, children were started on it and never ran: a drain of one
    on an unschedulable host, and the runtime's close, then waited for ever.)"""
    import ray
    from subagents.actors.ray import RayPlacement

    _BACKEND[:] = [backend]
    before = _host_actors(ray)
    with pytest.raises(SubagentError) as caught:
        RayPlacement(str(tmp_path / "x.db"), setup=hostkit.failing_setup, hosts=2)
    assert caught.value.code == ErrorCode.INVALID_ARGUMENT
    assert "no model registry here" in str(caught.value)
    with pytest.raises(SubagentError) as caught:
        RayPlacement(str(tmp_path / "x.db"), hosts=1, num_cpus=64, start_timeout=1)
    assert caught.value.code == ErrorCode.TIMEOUT
    assert "num_cpus" in str(caught.value)
    assert eventually(lambda: _host_actors(ray) == before)


def _host_actors(ray: Any) -> int:
    """Host actors of this cluster not dead (the session pool's included), from the
    cluster's own table (the state API needs the dashboard, which the tests leave
    out)."""
    from ray._private import state

    return sum(
        1
        for a in state.actors().values()
        if a["ActorClassName"] == "_RayHost" and a["State"] != "DEAD"
    )


def test_a_tree_across_hosts_on_postgres(
    backend: Backend, pg_url: str, ray_pool: tuple[str, Any]
) -> None:
    """Issue 15 with the store for many machines: a Ray host on a PostgreSQL schema
    runs the placed child's turns (once each, in order); its waking report reaches
    the parent here through the store (``LISTEN/NOTIFY``)."""
    from subagents.actors.ray import RayPlacement

    placement = RayPlacement(pg_url, setup=hostkit.setup, hosts=1, name="ray-pg", lease_ttl=3.0)
    try:
        with parent_tree(pg_url, backend, placement, "ray-pg") as tree:
            cid = tree.start("p0", model="reporter")
            for i in range(1, 5):
                tree.rt.subagents.followup(tree.root, cid, f"p{i}")
            outputs = tree.wait_outputs(cid, 5)
            assert [o.split("@")[0] for o in outputs] == [f"p{i}" for i in range(5)]
            assert os.getpid() not in {_pid(o) for o in outputs}
            reports = eventually(
                lambda: (
                    (r := [o for o in tree.outputs(tree.root.session_id) if "report:" in str(o)])
                    and len(r) >= 5
                    and r
                )
            )
            assert sorted(reports) == sorted(f"parent saw report:p{i}" for i in range(5))
    finally:
        placement.close()


@pytest.mark.parametrize("tree", ["ray"], indirect=True)
def test_a_placed_child_is_not_steered_but_queued(tree: Tree, tmp_path: Path) -> None:
    """Issue 16 point 4 meets placement: a steer to a child running on a host is
    queued (``steer=True``) or refused with nothing delivered (``"strict"``)."""
    marker = tmp_path / "steer"
    cid = tree.start(f"hold:{marker}", model="hold")
    eventually(lambda: Path(f"{marker}.started").exists())
    with pytest.raises(SubagentError) as caught:
        tree.rt.subagents.followup(tree.root, cid, "strict", steer="strict")
    assert caught.value.code == ErrorCode.TURN_NOT_OPEN
    steered = tree.rt.subagents.followup(tree.root, cid, "queued", steer=True)
    assert steered.outcome == "queued"
    Path(f"{marker}.go").write_text("go")
    outputs = tree.wait_outputs(cid, 2)
    assert outputs[0].startswith("released@")
    assert outputs[1].startswith("queued@")
    eventually(lambda: len(tree.outputs(cid)) == 2 and tree.settled(cid))


@pytest.mark.parametrize("tree", ["ray"], indirect=True)
def test_followups_racing_the_settle_each_run_once_in_order(tree: Tree) -> None:
    """The race between a follow-up and the placed child's settling (its host
    releasing it while the parent admits more): follow-ups sent with gaps around
    the time a turn and a settle take, over many rounds -- each admitted before
    the retirement runs in this epoch, each after it cold-places the child again;
    none is lost, none runs twice, the order holds."""
    cid = tree.start("r0")
    sent = ["r0"]
    for i in range(1, 41):
        _BACKEND[-1].sleep((i % 8) * 0.004)  # 0 to 28 ms: across the settle window
        tree.rt.subagents.followup(tree.root, cid, f"r{i}")
        sent.append(f"r{i}")
    outputs = tree.wait_outputs(cid, len(sent))
    assert [o.split("@")[0] for o in outputs] == sent
    eventually(lambda: tree.settled(cid))
    assert len(tree.outputs(cid)) == len(sent)


def test_a_followup_refused_below_a_drain_cutoff_is_taken_back(
    backend: Backend, tmp_path: Path, ray_pool: Any
) -> None:
    """R-DRAIN-3 on a placed child's resident fast path: a follow-up is committed to
    the child's durable inbox before the child's gate sees it; when the gate refuses
    it (``ADMISSION_CLOSED``, a drain cutoff), the message is taken back -- it stayed
    accepted, to run at the child's next activation. (The placement, a real one,
    is never reached: the gate refuses first. A store of its own keeps the pool's
    hosts from seeing the session.)"""
    import datetime as dt

    from subagents.actors._children._placed import PlacedChild
    from subagents.actors._children._placement import followup_placed
    from subagents.actors._children._requests import Delivery
    from subagents.protocol import SessionHeader, new_message_id, new_session_id

    _db, placement = ray_pool
    with Runtime(str(tmp_path / "own.db"), backend=backend) as rt:
        root = rt.spawn("echo", label="root")
        header = SessionHeader(
            id=new_session_id(),
            parent_session=root.session_id,
            origin="subagent",
            delegation_depth=1,
            created_at=dt.datetime.now(dt.UTC),
            label="placed",
        )
        assert rt.store is not None
        rt.store.create_session(header)
        child = PlacedChild(header, placement, rt.backend)
        child.close_admission()  # a drain cutoff covers it
        delivery = Delivery("too late", root.parent_source, new_message_id())
        with pytest.raises(SubagentError) as caught:
            followup_placed(rt.sessions, child, delivery)
        assert caught.value.code == ErrorCode.ADMISSION_CLOSED
        assert rt.sessions.pending(header.id) == []
        assert delivery.committed is False


@pytest.mark.parametrize("tree", ["ray"], indirect=True)
def test_a_settled_placed_child_is_freed_without_the_cycle_collector(
    tree: Tree, tmp_path: Path
) -> None:
    """R-RES-1 (a settled continuable child leaves residency): once a placed child
    settled, nothing the runtime keeps holds its in-process stand-in -- its
    residency listeners, which close over its activation, are dropped when heard
    for the last time -- so reference counting frees it."""
    marker = tmp_path / "held"
    gc.collect()
    gc.disable()
    try:
        cid = tree.start(f"hold:{marker}", model="hold")
        eventually(lambda: Path(f"{marker}.started").exists())
        activation = tree.rt.continuation.activation(cid)
        assert activation is not None
        ref = weakref.ref(activation.agent)
        del activation
        Path(f"{marker}.go").write_text("")
        assert tree.wait_outputs(cid, 1)[0].startswith("released@")
        eventually(lambda: tree.settled(cid))
        # Its settling task returns right after the last notice.
        eventually(lambda: ref() is None, timeout=10)
    finally:
        gc.enable()


def test_a_placed_childs_turns_join_the_parents_trace_on_their_host(
    backend: Backend, tmp_path: Path, ray_pool: tuple[str, Any]
) -> None:
    """``RayPlacement(tracing=True)``: the host traces the child's deliveries and
    turns with the provider its ``setup`` configured (after the host's runtime
    was built), and each joins the trace of the parent's ``subagents.start`` or
    ``subagents.followup`` (a host never traced: its runtime was built before
    ``setup`` could configure anything, and the pool had no way to ask)."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from subagents.actors.ray import RayPlacement

    db = ray_pool[0]
    spans = tmp_path / "host-spans"
    env = {"PYTHONPATH": str(Path(hostkit.__file__).parent), "SUBAGENTS_TEST_SPANS": str(spans)}
    placement = RayPlacement(
        db,
        setup=hostkit.traced_setup,
        hosts=1,
        lease_ttl=3.0,
        name="traced",
        tracing=True,
        options={"runtime_env": {"env_vars": env}},
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    try:
        with parent_tree(db, backend, placement, "traced", tracing=provider) as tree:
            cid = tree.start("traced")
            tree.wait_outputs(cid, 1)
            tree.rt.subagents.followup(tree.root, cid, "again")
            tree.wait_outputs(cid, 2)
    finally:
        placement.close()
    ours = {
        s.name: format(s.context.trace_id, "032x")
        for s in exporter.get_finished_spans()
        if s.name in ("subagents.start", "subagents.followup")
    }
    lines = eventually(lambda: spans.exists() and spans.read_text().splitlines())
    there = [line.split() for line in lines]
    turns = [trace_id for name, trace_id, _ in there if name == "subagents.turn"]
    assert set(ours.values()) <= set(turns), (ours, there)
    assert any(n == "subagents.deliver" for n, _, _ in there)


def test_closing_right_after_a_placed_start_leaves_nothing_held(
    backend: Backend, ray_pool: tuple[str, Any]
) -> None:
    """The parent's runtime closes right after starting placed children: its
    release reaches a host before (or while) the child's first run does, and the
    run, carried out after it, activated the child there again -- held, with its
    lease, for a parent that had left. Runs and releases are numbered in the
    order asked; a host ignores a run asked before a release it carried out.
    Five rounds of four children: afterwards no host holds any of them and none
    of their leases is held."""
    import ray

    db, placement = ray_pool
    started: list[SessionId] = []
    for _round in range(5):
        with parent_tree(db, backend, placement, "ray") as tree:  # closed right after
            started.extend(tree.start(f"p{i}") for i in range(4))
    held = {sid for h in placement.host_actors for sid in ray.get(h.held.remote(), timeout=60)}
    assert not held & {str(s) for s in started}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        check = Runtime(db, backend=backend, lease_ttl=3.0)
    try:
        store = check.store
        assert store is not None

        def released() -> bool:
            # A host lets a child go in memory first; its lease's release is
            # written behind, by the host's session writer: it lands shortly after.
            leases = [store.get_lease(sid) for sid in started]
            return all(lease is None or lease.holder is None for lease in leases)

        eventually(released, timeout=30)
    finally:
        check.close()


def test_a_call_to_a_host_that_does_not_answer_returns_after_call_timeout(
    backend: Backend, tmp_path: Path, ray_pool: tuple[str, Any], caplog: Any
) -> None:
    """A host busy past ``call_timeout`` (here: one call slot, taken by the child's
    run, whose turn waits for a file) is treated as gone by a call acting on the
    child there: the cancel returns, logged, instead of waiting with it (a drain
    and the runtime's close waited for ever on a host that never answered)."""
    import logging

    from subagents.actors.ray import RayPlacement

    db = ray_pool[0]
    env = {"PYTHONPATH": str(Path(hostkit.__file__).parent)}
    placement = RayPlacement(
        db,
        setup=hostkit.setup,
        hosts=1,
        lease_ttl=3.0,
        name="one-slot",
        call_timeout=0.5,
        options={"max_concurrency": 1, "runtime_env": {"env_vars": env}},
    )
    marker = tmp_path / "held"
    try:
        with parent_tree(db, backend, placement, "one-slot") as tree:
            cid = tree.start(f"hold:{marker}", model="hold")
            eventually(lambda: Path(f"{marker}.started").exists())
            with caplog.at_level(logging.WARNING, logger="subagents"):
                placement.cancel(cid, "test", True)  # queued behind the run: times out
            assert any("is gone (cancel of" in r.getMessage() for r in caplog.records)
            Path(f"{marker}.go").write_text("")
            assert tree.wait_outputs(cid, 1)[0].startswith("released@")
    finally:
        placement.close()


def _own_pool(db: str, name: str, **kw: Any) -> Any:
    from subagents.actors.ray import RayPlacement

    env = {"PYTHONPATH": str(Path(hostkit.__file__).parent)}
    return RayPlacement(
        db,
        setup=hostkit.setup,
        lease_ttl=3.0,
        name=name,
        options={"runtime_env": {"env_vars": env}},
        **kw,
    )


def test_a_close_right_after_a_host_died_leaves_nothing_held(
    backend: Backend, tmp_path: Path, ray_pool: tuple[str, Any]
) -> None:
    """Four placed children run, held; the host running some of them is SIGKILLed
    and the parent's runtime closes at once. The runs of the dead host's children
    move to the other host while their releases went to the dead one: they were
    activated there after the close -- held, their turns running, for a parent
    that had left -- and the close waited 30 s for each. The pool remembers what
    it released: afterwards no host holds any of them, and the close is quick."""
    import signal

    import ray

    db = ray_pool[0]
    placement = _own_pool(db, "killed-pool", hosts=2, call_timeout=3.0)
    markers = [tmp_path / f"held{i}" for i in range(4)]
    try:
        with parent_tree(db, backend, placement, "killed-pool") as tree:
            cids = [tree.start(f"hold:{m}", model="hold", label=f"c{i}") for i, m in
                    enumerate(markers)]  # fmt: skip
            eventually(lambda: all(Path(f"{m}.started").exists() for m in markers))
            pid = ray.get(placement.host_actors[0].pid.remote(), timeout=30)
            os.kill(pid, signal.SIGKILL)
            began = time.monotonic()
            tree.rt.close()
            took = time.monotonic() - began
        assert took < 20, took
        for host in placement.host_actors:  # the dead one answers once restarted
            held = eventually(lambda h=host: _held(h), timeout=60)
            assert not held[1] & {str(c) for c in cids}, held
    finally:
        for m in markers:
            Path(f"{m}.go").write_text("go")
        placement.close(timeout=30)


def _held(host: Any) -> tuple[bool, set[str]] | None:
    import ray

    try:
        return True, set(ray.get(host.held.remote(), timeout=5))
    except Exception:
        return None


def _stop_outside_a_write(pid: int, db: str) -> None:
    """SIGSTOP ``pid`` at a moment it holds no write lock on ``db`` and no read
    snapshot older than its last commit. Stopped inside a write (a lease
    renewal's), it would make every writer wait SQLite's busy timeout (30 s);
    stopped inside a read, every flush (a FULL checkpoint, which waits for old
    readers and holds off writers meanwhile) -- stalls that are not the one the
    caller measures. A FULL checkpoint that finishes within the probe's short
    timeout shows neither."""
    import signal

    for _ in range(50):
        os.kill(pid, signal.SIGSTOP)
        probe = sqlite3.connect(db, timeout=0.2, isolation_level=None)
        try:
            busy = probe.execute("PRAGMA wal_checkpoint(FULL)").fetchone()[0]
            if not busy:
                return
        except sqlite3.OperationalError:
            pass
        finally:
            probe.close()
        os.kill(pid, signal.SIGCONT)  # mid-write or mid-read: let it finish, then again
    raise AssertionError("the host held a write lock or an old snapshot at every try")


def test_a_close_does_not_wait_on_a_stopped_host_once_per_child(
    backend: Backend, tmp_path: Path, ray_pool: tuple[str, Any]
) -> None:
    """The host of three placed children stops answering (SIGSTOP): the close
    waits ``call_timeout`` for it once, not once per child plus 30 s for each
    child's run (64 s for two children, 96 s for three), and no run is left
    waiting on it."""
    import signal

    import ray

    db = ray_pool[0]
    placement = _own_pool(db, "stopped-pool", hosts=1, call_timeout=2.0)
    markers = [tmp_path / f"held{i}" for i in range(3)]
    pid = ray.get(placement.host_actors[0].pid.remote(), timeout=30)
    try:
        with parent_tree(db, backend, placement, "stopped-pool") as tree:
            for i, m in enumerate(markers):
                tree.start(f"hold:{m}", model="hold", label=f"c{i}")
            eventually(lambda: all(Path(f"{m}.started").exists() for m in markers))
            _stop_outside_a_write(pid, db)
            began = time.monotonic()
            tree.rt.close()
            took = time.monotonic() - began
        assert took < 12, took
    finally:
        os.kill(pid, signal.SIGCONT)
        for m in markers:
            Path(f"{m}.go").write_text("go")
        placement.close(timeout=30)


# -- drains and closes racing a placed child's runs; hosts that stop answering -----
#
# What a drain cancels is cancelled (and it returns), what a close keeps stays
# accepted -- as for a local child. Cross-process interleavings are forced by
# files named in the messages (``hostkit.hold``); a silent host is a SIGSTOPped one.


def _check_runtime(db: str, backend: Backend) -> Runtime:
    """A runtime on ``db`` that activates nothing (it only reads the store)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ResourceWarning)
        return Runtime(db, backend=backend, lease_ttl=3.0, adopt=False)


def test_a_drain_right_after_a_start_cancels_the_prompt(tree: Tree, tmp_path: Path) -> None:
    """R-DRAIN-1: drained right after its start, before any host activated it, a
    placed child's prompt is cancelled -- its turn ends cancelled, or never runs
    -- and the drain returns at once, as for a local child. (The cancel reached a
    host that did not hold the child yet and was forgotten; the run asked before
    it activated the child after it and ran the prompt, which waits here for its
    cancellation: the drain timed out.)"""
    marker = tmp_path / "prompt"
    cid = tree.start(f"hold:{marker}", model="hold")
    began = time.monotonic()
    tree.rt.subagents.drain_continuable_descendants([tree.root], timeout=20)
    assert time.monotonic() - began < 10
    assert tree.settled(cid)
    assert {e.stop_reason for e in tree.rt.sessions.turn_ends(cid)} <= {"cancelled"}
    assert not Path(f"{marker}.go").exists()


def test_a_drain_returns_while_the_childs_host_is_silent(
    backend: Backend, tmp_path: Path, ray_pool: tuple[str, Any]
) -> None:
    """``call_timeout``: the host of a placed child stops answering (SIGSTOP) and
    its parent drains: the cancel times out, the host counts as gone, and the
    drain returns -- the child settled here, its lease left to expire there. (Its
    run went on waiting for the host, and the drain with it, for ever.)"""
    import ray

    db = ray_pool[0]
    placement = _own_pool(db, "silent-drain", hosts=1, call_timeout=2.0)
    marker = tmp_path / "busy"
    pid = ray.get(placement.host_actors[0].pid.remote(), timeout=30)
    try:
        with parent_tree(db, backend, placement, "silent-drain") as tree:
            cid = tree.start(f"hold:{marker}", model="hold")
            eventually(lambda: Path(f"{marker}.started").exists())
            _stop_outside_a_write(pid, db)
            began = time.monotonic()
            tree.rt.subagents.drain_continuable_descendants([tree.root], timeout=30)
            assert time.monotonic() - began < 15
            assert tree.settled(cid)
    finally:
        os.kill(pid, signal.SIGCONT)
        Path(f"{marker}.go").write_text("go")
        placement.close(timeout=30)


def test_closing_keeps_what_a_placed_childs_own_children_accepted(
    tree: Tree, tmp_path: Path, backend: Backend
) -> None:
    """R-CONT (strict durability): the parent's runtime closes while a child's own
    continuable child runs a turn: the grandchild's turn is cancelled and its
    message stays accepted, to run at its next activation -- wherever the child
    runs. (Placed, the host drained the grandchild on release: its message was
    dropped.)"""
    marker = tmp_path / "grand"
    cid = tree.start(str(marker), model="spawner")
    gid = SessionId(tree.wait_outputs(cid, 1)[0])
    eventually(lambda: Path(f"{marker}.started").exists())
    db = tree.rt.store.path  # type: ignore[union-attr]
    tree.rt.close()
    check = _check_runtime(db, backend)
    try:
        ends = eventually(lambda: check.sessions.turn_ends(gid))
        assert [e.stop_reason for e in ends] == ["cancelled"]
        assert "run again" in str(ends[0].error)
        store = check.store
        assert store is not None
        assert [getattr(e.event, "content", None) for e in store.pending(gid)] == [f"hold:{marker}"]
    finally:
        check.close()
        Path(f"{marker}.go").write_text("go")


def test_a_child_settled_while_its_host_is_silent_is_let_go_there(
    backend: Backend, tmp_path: Path, ray_pool: tuple[str, Any]
) -> None:
    """``call_timeout``: a placed child settles while its host does not answer
    (SIGSTOP; an interrupt timed out first): its settle is sent, not waited for, and the host,
    answering again, lets the child go -- it holds nothing for a parent that
    settled it. (Nothing was sent: the host held the child, and renewed its
    lease, for good.)"""
    import ray

    db = ray_pool[0]
    call_timeout, keep_warm = 4.0, 6.0
    placement = _own_pool(db, "silent-settle", hosts=1, call_timeout=call_timeout)
    host = placement.host_actors[0]
    pid = ray.get(host.pid.remote(), timeout=30)
    try:
        with parent_tree(db, backend, placement, "silent-settle", keep_warm=keep_warm) as tree:
            cid = tree.start("quick")
            tree.wait_outputs(cid, 1)
            assert str(cid) in ray.get(host.held.remote(), timeout=30)
            # The child's run answered here (the child is idle, its keep_warm counts):
            # its turn's end in the store comes first. A host stopped in between
            # never answers the run, which waits for the child's turns however long
            # they take -- the child stays running here, and never settles.
            act = tree.rt.continuation.activation(cid)
            assert act is not None
            eventually(lambda: act.agent.idle)
            _stop_outside_a_write(pid, db)
            assert not tree.settled(cid)  # (its keep_warm outlasts the stop)
            # An interrupt (nothing to cut) times out: the host counts as silent for
            # call_timeout more, through the end of the child's keep_warm.
            tree.rt.subagents.interrupt(cid, UserAuthority(tree.root.session_id))
            # It retires keep_warm after it went idle; its settle and the release
            # that follows each wait call_timeout at most: twice that, for a loaded box.
            eventually(lambda: tree.settled(cid), timeout=2 * (keep_warm + 2 * call_timeout))
            os.kill(pid, signal.SIGCONT)
            eventually(lambda: str(cid) not in ray.get(host.held.remote(), timeout=30))
    finally:
        os.kill(pid, signal.SIGCONT)
        placement.close(timeout=30)


# -- a placed child's publication, its start, and what a drain drops ---------------


def _held_anywhere(placement: Any) -> set[str]:
    """The children the pool's hosts hold now."""
    import ray

    return {sid for h in placement.host_actors for sid in ray.get(h.held.remote(), timeout=30)}


@pytest.mark.parametrize("tree", ["ray"], indirect=True)
def test_a_woken_placed_child_is_not_retired_before_its_start(
    tree: Tree, ray_pool: tuple[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep wakes a settled placed child for a message committed to its durable
    inbox: the child is published, then started. The registry's retirement look
    (``close_if_idle``, on publication) is forced between the two, each round: it
    found the stand-in idle -- nothing counted before its start -- and retired it;
    the start then ran the message on a host after the settle there, and the host
    held the child for good, for a parent that had let it go. Now it waits for the
    start: the message runs once, the child settles, no host holds it."""
    from subagents.actors._children._placed import PlacedChild
    from subagents.protocol import MessageSource, new_message_id, trusted_message

    backend = _BACKEND[-1]
    cid = tree.start("w0")
    tree.wait_outputs(cid, 1)
    eventually(lambda: tree.settled(cid))
    placement = ray_pool[1]
    looked: dict[str, Any] = {}
    close_if_idle, start = PlacedChild.close_if_idle, PlacedChild.start

    def closing(child: PlacedChild) -> bool:
        closed = close_if_idle(child)
        if child.session_id == cid and "closed" not in looked:
            looked["closed"] = closed
            looked["event"].set()
        return closed

    def starting(child: PlacedChild) -> None:
        if child.session_id == cid:  # published: its retirement is looked at first
            assert looked["event"].wait(30), "the registry never looked"
            if looked["closed"]:  # retired: its settle on the host ends first
                act = tree.rt.continuation.activation(cid)
                assert act is None or act.released.wait(30)
        start(child)

    monkeypatch.setattr(PlacedChild, "close_if_idle", closing)
    monkeypatch.setattr(PlacedChild, "start", starting)
    source = MessageSource(kind="parent", session_id=tree.root.session_id)
    store = tree.rt.store
    assert store is not None
    for i in range(1, 5):
        # Its host let it go (the lease's release is written behind): nobody holds it.
        eventually(lambda: (lease := store.get_lease(cid)) is None or lease.holder is None)
        looked.clear()
        looked["event"] = backend.event()
        message = trusted_message(new_message_id(), f"w{i}", source)
        tree.rt.sessions.accept(cid, [message])
        tree.rt._orphan(cid)  # the sweep's look at a session nobody holds
        assert "closed" in looked  # the interleaving was forced
        outputs = tree.wait_outputs(cid, i + 1)
        assert [o.split("@")[0] for o in outputs] == [f"w{n}" for n in range(i + 1)]
        eventually(lambda: tree.settled(cid))
        eventually(
            lambda: str(cid) not in _held_anywhere(placement),
            timeout=15,
            why=lambda i=i: f"round {i}: a host holds the settled child ({looked})",
        )
    assert len(tree.outputs(cid)) == 5


def test_a_drain_before_the_first_run_drops_the_prompt(
    tree: Tree, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-DRAIN-1: a drain that cancels a child right after its publication -- for a
    placed child, before its first run was even asked of a host -- drops its
    prompt, as for a local child: the turn ends cancelled, unrun, and nothing is
    left in the durable inbox. (Placed, the prompt stayed accepted: no host was
    asked to run the child, so none dropped what waited.) The drain is forced in
    between by a ``subagent/start`` listener, which runs in the publishing thread
    right after publication, and waits for the drain's cancels."""
    from subagents.actors._children import _control

    backend = _BACKEND[-1]
    cut = backend.event()
    cut_forest = _control._cut

    def cutting(forest: Any) -> Any:
        try:
            return cut_forest(forest)
        finally:
            cut.set()

    monkeypatch.setattr(_control, "_cut", cutting)
    drains: list[Any] = []

    def drain() -> None:
        tree.rt.subagents.drain_continuable_descendants([tree.root], timeout=30)

    def on_start(event: Any) -> None:
        if event.type == "subagent/start" and not drains:
            drains.append(backend.spawn(drain, name="test-drain"))
            assert cut.wait(30)  # its cancels were asked

    tree.rt.subagents.subscribe(on_start, scope=tree.root)
    marker = tmp_path / "prompt"
    began = time.monotonic()
    cid = tree.start(f"hold:{marker}", model="hold")
    assert drains, "no subagent/start"
    assert drains[0].join(30)
    assert drains[0].exception is None
    assert time.monotonic() - began < 20
    assert tree.settled(cid)
    ends = eventually(lambda: tree.rt.sessions.turn_ends(cid), timeout=15)
    assert [e.stop_reason for e in ends] == ["cancelled"]
    store = tree.rt.store
    assert store is not None
    eventually(lambda: store.pending(cid) == [], timeout=15, why=lambda: store.pending(cid))
    assert not Path(f"{marker}.go").exists()
    with pytest.raises(SubagentError) as caught:
        tree.rt.subagents.followup(tree.root, cid, "after the drain")
    assert caught.value.code == ErrorCode.ADMISSION_CLOSED


def _unaccounted(rt: Runtime, cid: SessionId, ids: list[Any]) -> list[Any]:
    """Of the messages ``ids`` accepted for ``cid``, those neither still in its
    durable inbox nor ended in its log (run, cancelled, or cut by a crash)."""
    from subagents.protocol import MessageEvent, TurnEnd

    store = rt.store
    assert store is not None
    pending = {e.message_id for e in store.pending(cid)}
    ended: set[Any] = set()
    opened: list[Any] = []
    for record in rt.sessions.read(cid):
        event = record.event
        if isinstance(event, MessageEvent):
            opened.append(event.message_id)
        elif isinstance(event, TurnEnd):
            ended.update(opened)
            opened.clear()
    return [i for i in ids if i not in pending and i not in ended]


def test_a_host_killed_during_a_drain(
    backend: Backend, tmp_path: Path, ray_pool: tuple[str, Any]
) -> None:
    """The host running a placed child's turn (a follow-up queued behind it) is
    SIGKILLed as the drain's cancel goes to it. The drain returns well within its
    timeout with its documented outcome -- the child settled here, admission
    closed below the parent, no host holding it -- and nothing is lost: each
    accepted message either ended (dropped by the drain: cancelled, or cut by the
    crash) or is still in the child's durable inbox."""
    db = ray_pool[0]
    placement = _own_pool(db, "killed-drain", hosts=2, call_timeout=3.0)
    marker = tmp_path / "busy"
    killed: list[int] = []
    cancel = placement.cancel

    def killing(child_id: Any, cause: str, keep_inbox: bool, call: Any = None) -> None:
        if cause == "drained" and not killed:  # the drain's cancel: its host dies first
            killed.append(int(Path(f"{marker}.started").read_text()))
            os.kill(killed[0], signal.SIGKILL)
        cancel(child_id, cause, keep_inbox, call)

    placement.cancel = killing
    try:
        with parent_tree(db, backend, placement, "killed-drain") as tree:
            spec = ContinuableStartSpec(
                parent=tree.root,
                provider="killed-drain",
                prompt=f"hold:{marker}",
                label="child",
                model="hold",
            )
            handle = tree.rt.subagents.start_continuable(spec)
            cid = handle.child_id
            eventually(lambda: Path(f"{marker}.started").exists())
            behind = tree.rt.subagents.followup(tree.root, cid, "behind the turn")
            began = time.monotonic()
            tree.rt.subagents.drain_continuable_descendants([tree.root], timeout=30)
            took = time.monotonic() - began
            assert killed, "the drain asked no cancel"
            assert took < 20, took
            assert tree.settled(cid)
            with pytest.raises(SubagentError) as caught:
                tree.rt.subagents.followup(tree.root, cid, "after the drain")
            assert caught.value.code == ErrorCode.ADMISSION_CLOSED
            ids = [handle.message_id, behind]
            eventually(
                lambda: not _unaccounted(tree.rt, cid, ids),
                timeout=15,
                why=lambda: (_unaccounted(tree.rt, cid, ids), _placed_state(tree, cid, placement)),
            )
        for host in placement.host_actors:  # the killed one answers once restarted
            held = eventually(lambda h=host: _held(h), timeout=60)
            assert str(cid) not in held[1], held
    finally:
        Path(f"{marker}.go").write_text("go")
        placement.close(timeout=30)
