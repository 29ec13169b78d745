"""Opt-in keep-warm: an idle continuable child stays resident for a while (beyond the seed)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import LifecycleProbe
from subagents.protocol import ErrorCode, SubagentError
from subagents.store import MemoryStore


def _start(rt: Runtime):  # type: ignore[no-untyped-def]
    root = rt.spawn("echo", label="root")
    handle = rt.subagents.start_continuable(
        ContinuableStartSpec(parent=root, provider="local", prompt="p", label="kid")
    )
    return root, handle.child_id


@pytest.fixture
def warm_forever(backend: Backend) -> Iterator[Runtime]:
    with Runtime(MemoryStore(), backend=backend, keep_warm=float("inf")) as rt:
        yield rt


def test_default_settles_at_once(rt_mem: Runtime) -> None:
    """R-RES-3: with the default (0) a leaf child leaves residency once idle."""
    probe = LifecycleProbe(rt_mem)
    _root, cid = _start(rt_mem)
    assert probe.wait_for(lambda evs: [e.type for e in evs] == ["subagent/start", "subagent/end"])
    assert rt_mem.continuation.activation(cid) is None


def test_warm_child_stays_resident_and_wakes_without_cold_resume(warm_forever: Runtime) -> None:
    rt = warm_forever
    probe = LifecycleProbe(rt)
    root, cid = _start(rt)
    agent = rt.agents.get(cid)
    assert agent is not None
    assert agent.wait_idle(10)
    assert rt.wait_idle(10)
    assert rt.continuation.activation(cid) is not None  # idle, yet resident
    for i in range(5):
        rt.subagents.followup(root, cid, i)
    assert agent.wait_idle(10)
    assert rt.agents.get(cid) is agent  # the same agent took the follow-ups
    assert probe.types() == ["subagent/start"]  # no new epoch
    rt.subagents.drain_continuable_descendants([root])  # a drain releases warm children
    assert rt.continuation.activation(cid) is None
    assert probe.types() == ["subagent/start", "subagent/end"]


def test_warm_child_settles_after_the_delay(backend: Backend) -> None:
    with Runtime(MemoryStore(), backend=backend, keep_warm=0.05) as rt:
        probe = LifecycleProbe(rt)
        root, cid = _start(rt)
        # Settles by itself once the delay has passed (polled: the delay is the point).
        assert probe.wait_for(lambda evs: len(evs) == 2, timeout=10)
        assert rt.continuation.activation(cid) is None
        start = time.monotonic()
        rt.subagents.followup(root, cid, "again")  # cold-resumes
        assert probe.wait_for(lambda evs: len(evs) == 4, timeout=10)
        assert time.monotonic() - start >= 0.05


@pytest.mark.parametrize("bad", [-1, "soon"])
def test_keep_warm_validated(backend: Backend, bad: object) -> None:
    with pytest.raises(SubagentError) as err:
        Runtime(backend=backend, keep_warm=bad)  # type: ignore[arg-type]
    assert err.value.code == ErrorCode.INVALID_ARGUMENT
