"""Races on the rules of admission, run many rounds on both backends.

On gevent every racing operation is a greenlet of one hub, which is where a
``threading.RLock`` used to exclude nothing; on threads they are OS threads. The
rules raced (R-FUP-1, R-FUP-4, R-RES-3, R-DRAIN-1, R-DRAIN-6):

* a follow-up racing the child's settlement is delivered exactly once, in each
  sender's order, whether it met the child resident, settling or absent;
* once a drain's cutoff is in place no follow-up below it is admitted, and
  nothing runs in the drained forest after the drain returned;
* on gevent, no lock of the runtime is ever held across a greenlet switch (the
  discipline that makes its native locks correct between greenlets).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator
from typing import Any

import greenlet
import pytest
from continuable_kit import CountingStore, Kit, spawn
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._children._admission import Registry
from subagents.actors._kernel import Backend
from subagents.actors._kernel._gate import Latch
from subagents.protocol import ErrorCode, SubagentError

ROUNDS = 12
PRODUCERS = 4
PER_PRODUCER = 25


@pytest.fixture
def warm_kit(backend: Backend) -> Iterator[Kit]:
    with Runtime(CountingStore(), backend=backend) as rt:
        kit = Kit(rt)
        yield kit
        kit.close()


def _followups_racing_settlement(kit: Kit, rounds: int) -> None:
    rt = kit.rt
    for r in range(rounds):
        root = kit.root(f"root{r}")
        child_id, _ = kit.start(root, ("first", r), label=f"kid{r}")

        def produce(p: int, root: Any = root, child_id: Any = child_id) -> list[Any]:
            ids = []
            for i in range(PER_PRODUCER):
                ids.append(rt.subagents.followup(root, child_id, (p, i)))
                if i % 5 == p % 5:
                    rt.backend.sleep(0)  # let the child settle between some of them
            return ids

        tasks = [spawn(rt, produce, p) for p in range(PRODUCERS)]
        accepted = [mid for t in tasks for mid in t.result(30)]
        kit.wait_settled(f"kid{r}", timeout=30)
        ran = kit.started_ids(f"kid{r}")
        assert sorted(ran[1:]) == sorted(accepted), "a follow-up was lost or run twice"
        contents = [tuple(c) for c in kit.contents(f"kid{r}")[1:]]
        for p in range(PRODUCERS):
            mine = [i for q, i in contents if q == p]
            assert mine == list(range(PER_PRODUCER)), f"producer {p} out of order: {mine}"


def test_followups_racing_settlement_run_once_in_order(warm_kit: Kit) -> None:
    """Four senders follow up one child that settles whenever it runs dry: every
    accepted id runs exactly once, each sender's messages in its order."""
    _followups_racing_settlement(warm_kit, ROUNDS)


def test_no_followup_is_admitted_after_the_cutoff(warm_kit: Kit, monkeypatch: Any) -> None:
    """Senders race a drain of their children's parent: a follow-up that began after
    the cutoff was applied is refused with ``ADMISSION_CLOSED``; everything accepted
    before it ran or was discarded, and nothing ran after the drain returned."""
    kit = warm_kit
    rt = kit.rt
    cut = threading.Event()
    original = Registry._cutoff

    def cutoff(self: Registry, parents: Any, *more: Any) -> Any:
        result = original(self, parents, *more)
        cut.set()  # applied: the gates of the forest are closed
        return result

    monkeypatch.setattr(Registry, "_cutoff", cutoff)
    for r in range(ROUNDS):
        cut.clear()
        root = kit.root(f"root{r}")
        kids = [kit.start(root, "hi", label=f"k{r}-{j}")[0] for j in range(3)]
        outcomes: list[tuple[bool, Any]] = []
        lock = threading.Lock()

        def produce(
            p: int,
            root: Any = root,
            kids: list[Any] = kids,
            lock: Any = lock,
            outcomes: list[tuple[bool, Any]] = outcomes,
        ) -> None:
            for i in itertools.count():
                began_after_cutoff = cut.is_set()
                try:
                    rt.subagents.followup(root, kids[(p + i) % len(kids)], (p, i))
                    outcome: Any = "accepted"
                except SubagentError as exc:
                    outcome = exc.code
                with lock:
                    outcomes.append((began_after_cutoff, outcome))
                if began_after_cutoff or i > 200:
                    return
                if i % 3 == 0:
                    rt.backend.sleep(0)

        tasks = [spawn(rt, produce, p) for p in range(PRODUCERS)]
        rt.backend.sleep(0)
        rt.subagents.drain_continuable_descendants([root])
        for t in tasks:
            t.result(30)
        late = [o for after, o in outcomes if after]
        assert late and set(late) == {ErrorCode.ADMISSION_CLOSED}, late
        logs = {kid: list(rt.sessions.read(kid)) for kid in kids}
        kit.barrier()
        assert {kid: list(rt.sessions.read(kid)) for kid in kids} == logs
        assert all(rt.continuation.activation(kid) is None for kid in kids)


class _SwitchWatch:
    """At every greenlet switch, checks that no lock of the runtime is held."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.switches = 0
        self.held: list[str] = []
        self._previous: Any = greenlet.settrace(self)

    def _locks(self) -> Iterator[tuple[str, Any]]:
        rt = self.rt
        cont = rt.continuation
        yield "agent registry", rt.agents._lock
        yield "session service", rt.sessions._lock
        writer = rt.sessions._writer
        if writer is not None:
            yield "writer", writer._lock
        yield "registry notices", cont._registry_box._lock
        yield "supervisor notices", cont._supervisor_box._lock
        yield "setups", cont._setups._lock
        yield "alarm", cont._alarm._lock
        for agent in list(rt.agents._agents.values()):
            yield f"agent {agent.label}", agent._lock
        for live in list(rt.sessions._live.values()):
            yield f"session {live.header.label}", live._lock

    def __call__(self, event: str, args: Any) -> None:
        if event in ("switch", "throw"):
            self.switches += 1
            for name, lock in self._locks():
                if lock.locked():
                    self.held.append(name)
        if self._previous is not None:
            self._previous(event, args)

    def close(self) -> None:
        greenlet.settrace(self._previous)


@pytest.mark.backend_specific
def test_no_lock_is_held_across_a_greenlet_switch() -> None:
    """On gevent the runtime's locks are native locks that only exclude because no
    critical section ever yields; run the settlement race under a switch tracer
    that looks at every one of them at every switch."""
    with Runtime(CountingStore(), backend="gevent") as rt:
        kit = Kit(rt)
        watch = _SwitchWatch(rt)
        try:
            _followups_racing_settlement(kit, 3)
        finally:
            watch.close()
            kit.close()
        assert watch.switches > 300, watch.switches
        assert watch.held == [], sorted(set(watch.held))


# -- forced interleavings at the two points where the fast path meets the registry ----


def test_a_followup_meeting_a_retiring_child_waits_for_its_next_epoch(kit: Kit) -> None:
    """Forced interleaving: the registry has closed the child's gate to retire it but
    not yet recorded the retirement (its phase still reads ``RESIDENT``). A
    follow-up that reads that phase must not enter the retiring agent: it waits in
    the registry, and runs once, in the child's next epoch, on a new agent."""
    rt = kit.rt
    root = kit.root()
    child_id, _ = kit.start(root, [["block", "busy"]], label="kid")
    assert kit.gate("busy").wait_reached(10)
    old = kit.live("kid")
    retiring = kit.gate("retiring")
    close_if_idle = old.close_if_idle

    def paused_close() -> bool:
        closed = close_if_idle()
        if closed:
            retiring.pass_through(None)  # the registry, preempted right after the gate
        return closed

    old.close_if_idle = paused_close  # type: ignore[method-assign]
    kit.gate("busy").release()
    assert retiring.wait_reached(10)
    act = rt.continuation._index[child_id]
    assert act.agent is old and act.phase.name == "RESIDENT" and old.idle
    task = spawn(rt, rt.subagents.followup, root, child_id, "in the window")
    assert not task.join(0.2), "the follow-up was admitted into a retiring agent"
    retiring.release()
    task.result(10)
    kit.wait_settled("kid", epochs=2)
    last = kit.script.turns_of("kid")[-1]
    assert last.content == "in the window" and last.agent is not old
    assert kit.contents("kid").count("in the window") == 1


def test_a_followup_that_read_a_stale_phase_meets_the_closed_gate(kit: Kit) -> None:
    """Forced interleaving: a follow-up read ``RESIDENT`` and is about to enter the
    child's inbox when a drain applies its cutoff; the gate, closed by the cutoff in
    the same registry step as the phase, refuses it with ``ADMISSION_CLOSED``."""
    rt = kit.rt
    root = kit.root()
    child_id, _ = kit.start(root, [["block", "busy"]], label="kid")
    assert kit.gate("busy").wait_reached(10)
    agent = kit.live("kid")
    entering = kit.gate("entering")
    admit = agent.admit_followup

    def paused_admit(*args: Any) -> bool:
        entering.pass_through(None)  # read RESIDENT, preempted before the gate
        return admit(*args)

    agent.admit_followup = paused_admit  # type: ignore[method-assign]
    task = spawn(rt, rt.subagents.followup, root, child_id, "too late")
    assert entering.wait_reached(10)
    drain = spawn(rt, rt.subagents.drain_continuable_descendants, [root])
    assert kit.script.notes.has("cancelled", "kid")  # the cutoff is applied
    entering.release()
    error = task.error(10)
    assert isinstance(error, SubagentError) and error.code == ErrorCode.ADMISSION_CLOSED
    drain.result(20)
    assert "too late" not in kit.contents("kid")


def test_a_followup_by_parent_id_never_meets_its_parent_leaving(
    backend: Backend, tmp_path: Any
) -> None:
    """R-FUP-1, R-FUP-4: a follow-up naming the parent by id (the caller vouches
    for it) while the parent is disposed and resumed over and over: each call is
    accepted -- it raised ``UNAUTHORIZED`` (about one in three) when the parent it
    found live left before the child admitted the message -- and each accepted
    message runs once, in order."""
    with Runtime(str(tmp_path / "p.db"), backend=backend, lease_ttl=1.5) as rt:
        rt.models.register("w", lambda _o: lambda turn: turn.content)
        root = rt.spawn("w", label="root")
        pid = root.session_id
        child = rt.subagents.start_continuable(
            ContinuableStartSpec(parent=root, provider="local", prompt="p", label="k", model="w")
        ).child_id
        assert rt.wait_idle(10)
        done = [False]
        sent: list[str] = []
        refused: list[str] = []

        def churn() -> None:
            while not done[0]:
                parent = rt.agents.get(pid)
                if parent is not None:
                    parent.dispose()
                else:
                    with contextlib.suppress(SubagentError):
                        rt.agents.resume(pid)
                backend.sleep(0)

        churner = backend.spawn(churn)
        try:
            for i in range(150):
                try:
                    rt.subagents.followup(pid, child, f"m{i}")
                    sent.append(f"m{i}")
                except SubagentError as exc:
                    refused.append(exc.code)
                backend.sleep(0)
        finally:
            done[0] = True
            churner.join(30)
        assert refused == []
        for _ in range(400):  # what a wake missed, the holders' sweep (ttl / 3) runs
            ran = [e.output for e in rt.sessions.turn_ends(child)][1:]
            if len(ran) >= len(sent):
                break
            backend.sleep(0.05)
        assert ran == sent


def test_by_id_meeting_its_parent_settling_waits_until_it_has_left(
    kitp: Kit, monkeypatch: Any
) -> None:
    """R-FUP-1, R-CONT-1, forced interleaving, 3 rounds: a start and a follow-up
    naming a continuable parent by id, while that parent is settling (retired, its
    disposal held). The registry refuses the parent ("leaving residency") while it
    is still registered live; the call used to raise ``UNAUTHORIZED``. Now it
    waits until the parent has left, then goes through the parent's next
    activation: each runs once, below it."""
    kit = kitp
    rt = kit.rt
    root = kit.root()
    c0, _ = kit.start(root, [["start", "c1", "hi"]], label="c0")
    c1 = kit.sid("c1")
    assert rt.wait_idle(10)
    met = [Latch()]
    reserve = Registry._reserve

    def spied(self: Any, child_id: Any, parent: Any) -> Any:
        try:
            return reserve(self, child_id, parent)
        except SubagentError as exc:
            if parent.session_id == c0 and exc.code == ErrorCode.UNAUTHORIZED:
                met[0].set()
            raise

    monkeypatch.setattr(Registry, "_reserve", spied)
    hooks = rt.continuation._hooks
    dispose = hooks.dispose
    held: list[Any] = []

    def held_dispose(act: Any) -> None:
        if act.child_id == c0 and held:
            held.pop().pass_through(None)  # the supervisor, preempted before disposing
        dispose(act)

    monkeypatch.setattr(hooks, "dispose", held_dispose)
    for i in range(3):
        for how in ("start", "followup"):
            kit.wait_settled("c0")  # so the hold catches the next settle, the wake's
            met[0] = Latch()
            gate = kit.gate(f"{how}{i}")
            held.append(gate)
            rt.subagents.followup(root, c0, f"wake{how}{i}")  # it runs, then settles
            assert gate.wait_reached(10)
            assert rt.agents.is_live(rt.agents.get(c0))  # registered, though leaving
            if how == "start":
                spec = ContinuableStartSpec(
                    parent=c0, provider="local", prompt=f"s{i}", label=f"s{i}", model="cmd"
                )
                task = spawn(rt, rt.subagents.start_continuable, spec)
            else:
                task = spawn(rt, rt.subagents.followup, c0, c1, f"f{i}")
            assert met[0].wait(10)  # it met the parent leaving
            gate.release()
            task.result(10)
            assert rt.wait_idle(10)
    assert [t.content for t in kit.script.turns_of("c1")][1:] == ["f0", "f1", "f2"]
    for i in range(3):
        assert [t.content for t in kit.script.turns_of(f"s{i}")] == [f"s{i}"]


def test_a_child_disposed_before_its_publication_leaves_its_parent_free(
    kit: Kit, monkeypatch: Any
) -> None:
    """Forced interleaving (a closing runtime disposes a child mid-start): the new
    child's agent is disposed after its materialization began, and its dispose
    listeners run after the registry tried to publish it. The publication fails
    (``AGENT_DISPOSED``) and is rolled back; the late listener posted a release
    the registry could not apply ("no transition from RESERVED on RELEASE", a
    failure of the registry actor), and the parent kept owning the child it
    never got. Now the start fails alone, and the parent settles. R-CONT-1."""
    from subagents.actors._children._materialize import Materializer
    from subagents.actors._kernel._gate import Latch

    rt = kit.rt
    busy = kit.gate("child-stop")
    rolling_back = Latch()
    contributed: list[Any] = []
    rollback = Materializer.rollback

    def contribution(scope: Any) -> None:
        agent = scope.agent
        if agent.label == "doomed" and not contributed:
            contributed.append(agent)
            # Its first dispose listener holds its actor's stop: the runtime's own,
            # added after the contributions, runs once the test lets it.
            agent.add_dispose_listener(lambda _a: busy.pass_through(None))
            agent.dispose(wait=False)

    def rollback_seen(self: Any, act: Any, agent: Any, delete_from: Any) -> None:
        if contributed and agent is contributed[0]:
            rolling_back.set()  # its publication failed
        rollback(self, act, agent, delete_from)

    monkeypatch.setattr(Materializer, "rollback", rollback_seen)
    rt.subagents.register_continuable_setup(contribution)
    root = kit.root()
    kit.start(root, [["try_start", "doomed", "hi"]], label="mid")
    assert rolling_back.wait(10) and busy.wait_reached(10)
    busy.release()
    assert kit.script.notes.has("start-refused", "mid", ErrorCode.AGENT_DISPOSED)
    kit.barrier()
    kit.wait_settled("mid", epochs=1)
