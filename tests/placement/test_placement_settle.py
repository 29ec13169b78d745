"""A placed child its parent settled or released is held by no host afterwards.

A run the pool stopped waiting for (its child released meanwhile) may still be
on its way to a host, or awaiting the child's lease there, when the parent
settles the child. The settle carries a call number, as a release does: the
host then does not hold the child for that run. The orderings are forced in the
parent's pool (its calls to the hosts, gated) and through the child's lease,
which the test holds while the host the run failed over to waits for it.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import hostkit
import pytest
from subagents.actors import Backend, ContinuableStartSpec
from test_placement import _held, eventually, parent_tree

pytestmark = [
    pytest.mark.slow,
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::ResourceWarning"),
]

#: Generous bounds for what another process does (a loaded 2-core box).
_WAIT = 60.0


def _pool(db: str, name: str, **kw: Any) -> Any:
    from subagents.actors.ray import RayPlacement

    env = {"PYTHONPATH": str(Path(hostkit.__file__).parent)}
    return RayPlacement(
        db, setup=hostkit.setup, name=name, options={"runtime_env": {"env_vars": env}}, **kw
    )


class _Spy:
    """A host actor handle whose ``run`` calls are kept (their refs, to wait on)."""

    def __init__(self, handle: Any, refs: list[Any]) -> None:
        self._handle = handle
        self._refs = refs

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._handle, name)
        if name != "run":
            return method
        refs = self._refs

        class _Run:
            def remote(self, *args: Any) -> Any:
                ref = method.remote(*args)
                refs.append(ref)
                return ref

        return _Run()


def test_a_run_failed_over_during_a_drain_does_not_hold_the_settled_child(
    backend: Backend, tmp_path: Path, ray_pool: tuple[str, Any]
) -> None:
    """R-DRAIN-1, R-DRAIN-2: the host running a placed child's turn is SIGKILLed
    as the drain's cancel goes to it; the run fails over to the other host before
    that cancel fails, and the other host awaits the child's lease (held here)
    while the pool, seeing the cancel fail, stops waiting for the run and the
    child settles. Once the lease is free that host carries the run out: it must
    not hold the child for a parent that settled it (it did, for good, when a
    settle carried no call number)."""
    import ray

    db = ray_pool[0]
    # lease_ttl 15: the host awaits a held lease 30 s, well past the drain.
    placement = _pool(db, "failover-drain", hosts=2, call_timeout=3.0, lease_ttl=15.0)
    real = list(placement._hosts)
    marker = tmp_path / "busy"
    refs: list[Any] = []  # the runs sent to the host the child fails over to
    polls = threading.Event()  # cleared: the runs' polls wait (their host's death unseen)
    polls.set()
    parked = threading.Event()
    killed: list[int] = []
    gated: list[Any] = []  # the lease the test holds: (store, lease)
    cancel, get = placement.cancel, placement._get

    def gated_get(ref: Any, timeout: float | None = None) -> Any:
        if timeout == 3.0 and killed and polls.is_set() is False:
            # The drain's cancel, sent to the dead host: the run fails over first.
            polls.set()
            assert _wait(lambda: bool(refs)), "the run did not fail over"
        elif timeout != 3.0 and not polls.is_set():
            parked.set()
            assert polls.wait(_WAIT)
        return get(ref, timeout)

    def killing(child_id: Any, cause: str, keep_inbox: bool, call: Any = None) -> None:
        if cause == "drained" and not killed:
            polls.clear()
            assert parked.wait(_WAIT), "the run did not poll"
            killed.append(int(Path(f"{marker}.started").read_text()))
            os.kill(killed[0], signal.SIGKILL)
            store = gated[0]
            now = time.time()
            gated.append(store.acquire_lease(child_id, "test-gate", now=now + 1e6, expires=1e12))
        cancel(child_id, cause, keep_inbox, call)

    placement._get = gated_get
    placement.cancel = killing
    try:
        # adopt=False: this runtime's sweep does not race the host for the lease.
        with parent_tree(db, backend, placement, "failover-drain", adopt=False) as tree:
            gated.append(tree.rt.store)
            spec = ContinuableStartSpec(
                parent=tree.root,
                provider="failover-drain",
                prompt=f"hold:{marker}",
                label="child",
                model="hold",
            )
            cid = tree.rt.subagents.start_continuable(spec).child_id
            eventually(lambda: Path(f"{marker}.started").exists())
            first = placement.host_of(cid)
            other = 1 - first
            placement._hosts[other] = _Spy(real[other], refs)
            tree.rt.subagents.drain_continuable_descendants([tree.root], timeout=30)
            assert killed, "the drain asked no cancel"
            assert tree.settled(cid)
            assert refs, "no run went to the other host"
            store, lease = gated[0], gated[1]
            store.release_lease(cid, lease.token())
            try:
                ray.get(refs[0], timeout=_WAIT)  # the host carried the run out
            except Exception as exc:  # (this process took the lease first)
                assert "LEASE_HELD" in repr(exc) or "lease" in str(exc).lower(), exc
            held = _held(real[other])
            assert held is not None and str(cid) not in held[1], held
            # Nor does a host keep its lease (given back through the host's session
            # writer, after the run returned).
            eventually(
                lambda: store.get_lease(cid).holder is None,
                timeout=30,
                why=lambda: store.get_lease(cid),
            )
    finally:
        placement._hosts[:] = real
        Path(f"{marker}.go").write_text("go")
        placement.close(timeout=30)


def test_what_the_pool_and_its_hosts_keep_of_settled_children_goes(
    backend: Backend, tmp_path: Path, ray_pool: tuple[str, Any]
) -> None:
    """R-RES-1 (a settled continuable child leaves residency): placed children
    that settled -- after their turns, after a follow-up placed one again, after
    a drain that dropped what waited -- leave nothing behind in the pool (which
    host ran them, their releases and drops) nor in its hosts (the markers that
    stop a late run from holding them again): those grew by an entry per child
    for ever."""
    import ray

    db = ray_pool[0]
    placement = _pool(db, "bounded", hosts=2, call_timeout=10.0, lease_ttl=3.0)
    markers = [tmp_path / f"held{i}" for i in range(2)]
    try:
        with parent_tree(db, backend, placement, "bounded") as tree:
            quiet = [tree.start(f"n{i}", label=f"q{i}") for i in range(4)]
            for cid in quiet:
                tree.wait_outputs(cid, 1)
            eventually(lambda: all(tree.settled(c) for c in quiet))
            tree.rt.subagents.followup(tree.root, quiet[0], "again")
            assert tree.wait_outputs(quiet[0], 2)[1].startswith("again@")
            eventually(lambda: tree.settled(quiet[0]))
            held = [
                tree.start(f"hold:{m}", model="hold", label=f"h{i}") for i, m in enumerate(markers)
            ]
            eventually(lambda: all(Path(f"{m}.started").exists() for m in markers))
            tree.rt.subagents.drain_continuable_descendants([tree.root], timeout=30)
            assert all(tree.settled(c) for c in held)
            kept = {
                k: getattr(placement, k)
                for k in ("_where", "_released", "_dropped", "_moved", "_abandoned", "_forgetting")
                if getattr(placement, k, None)
            }
            assert not kept, kept

            def marks() -> list[Any]:
                return ray.get(
                    [
                        h.__ray_call__.remote(
                            lambda actor: (
                                dict(actor.host._hosting._released_at),
                                dict(actor.host._hosting._dropped_at),
                                dict(getattr(actor.host._hosting, "_moved_at", {})),
                            )
                        )
                        for h in placement.host_actors
                    ],
                    timeout=_WAIT,
                )

            eventually(lambda: all(m == ({}, {}, {}) for m in marks()), timeout=30, why=marks)
    finally:
        for m in markers:
            Path(f"{m}.go").write_text("go")
        placement.close(timeout=30)


def test_a_host_taken_for_dead_but_alive_lets_the_child_go(
    backend: Backend, tmp_path: Path, ray_pool: tuple[str, Any]
) -> None:
    """R-CONT-1, R-FU-1: Ray answers a run with ``ActorUnavailableError`` (a
    ``RayActorError``) both for a host that died and for one unreachable for a
    while, which runs on. Here the host running a placed child's turn is alive
    when the pool is told so: the run fails over to the other host, which takes
    the child once the first let it go, and runs the cut turn again (redelivered)
    there. The child was held for good by the first host -- its turn running, its
    lease renewed -- while the other failed to take it and the parent settled it."""
    import ray
    from ray.exceptions import ActorUnavailableError

    db = ray_pool[0]
    placement = _pool(db, "unreachable", hosts=2, call_timeout=3.0, lease_ttl=3.0)
    marker = tmp_path / "busy"
    get = placement._get
    armed: list[bool] = []

    def unreachable_once(ref: Any, timeout: float | None = None) -> Any:
        if armed and not armed[0] and timeout != 3.0:  # the run's poll, once
            armed[0] = True
            raise ActorUnavailableError("unreachable for a while (the test)", None)
        return get(ref, timeout)

    placement._get = unreachable_once
    try:
        with parent_tree(db, backend, placement, "unreachable") as tree:
            cid = tree.start(f"hold:{marker}", model="hold")
            started = Path(f"{marker}.started")
            eventually(lambda: started.exists())
            first = placement.host_of(cid)
            hosts = placement.host_actors
            pids = ray.get([h.pid.remote() for h in hosts], timeout=_WAIT)
            assert started.read_text() == str(pids[first])
            armed.append(False)
            other = pids[1 - first]
            eventually(lambda: started.read_text() == str(other), timeout=_WAIT)
            held = _held(hosts[first])
            assert held is not None and str(cid) not in held[1], held
            Path(f"{marker}.go").write_text("go")
            assert tree.wait_outputs(cid, 2)[-1] == f"released@{other}!"
            eventually(lambda: tree.settled(cid))

            # Held for good by neither host. (Polled: once, in a full suite run
            # beside another, a host still held it right after the parent settled
            # it; that run did not show which host, nor for how long.)
            def let_go_everywhere() -> bool:
                return all((h := _held(x)) is not None and str(cid) not in h[1] for x in hosts)

            eventually(
                let_go_everywhere, why=lambda: ([_held(h) for h in hosts], tree.settled(cid))
            )
    finally:
        Path(f"{marker}.go").write_text("go")
        placement.close(timeout=30)


def _wait(check: Any) -> bool:
    deadline = time.monotonic() + _WAIT
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
