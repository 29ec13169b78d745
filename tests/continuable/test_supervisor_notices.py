"""The supervisor's notices: from many threads or greenlets, batched into few
mailbox messages, each handled exactly once, in each poster's order, before any
later mailbox message (R-RES-5, R-RES-6: settlement and child-first release
are driven by these notices; a lost one leaves an Activation resident forever).
"""

from __future__ import annotations

import threading
from typing import Any

from subagents.actors._kernel import Backend, Latch, actor_class
from subagents.protocol import SessionId, new_session_id
from subagents.supervision import Activation, Phase, Supervisor, SupervisorInbox


class _Agent:
    """Stands in for an agent: idle or not; records each residency check."""

    def __init__(self, idle: bool, key: Any = None, checks: list[Any] | None = None) -> None:
        self._idle = idle
        self._key = key
        self._checks = checks
        self.idle_since = 0.0

    @property
    def idle(self) -> bool:
        if self._checks is not None:
            self._checks.append(self._key)
        return self._idle


def _act(agent: Any, *, parent: Activation | None = None, key: Any = None) -> Activation:
    act = Activation(
        SessionId(new_session_id()),
        parent_session=SessionId(new_session_id()),
        parent_activation=parent,
        lineage=(),
        admitted=Latch(),
        released=Latch(),
    )
    act.agent = agent
    act.phase = Phase.RESIDENT
    act.provider = repr(key)
    return act


class _Hooks:
    """Records every retirement, disposal and release the supervisor asks for."""

    def __init__(self) -> None:
        self.retired: list[Activation] = []
        self.disposed: list[Activation] = []
        self.released: list[Activation] = []

    def retire(self, activation: Activation) -> None:
        self.retired.append(activation)

    def dispose(self, activation: Activation) -> None:
        self.disposed.append(activation)

    def announce_release(self, activation: Activation) -> None:
        self.released.append(activation)

    def warm_until(self, activation: Activation) -> float | None:
        return None

    def wake_at(self, deadline: float) -> None:
        raise AssertionError("no keep-warm here")

    def now(self) -> float:
        return 0.0


def _start(backend: Backend, hooks: Any) -> tuple[Any, SupervisorInbox]:
    box = SupervisorInbox()
    ref = actor_class(backend.actor_class, Supervisor).start(hooks, box)
    box.bind(ref)
    return ref, box


def _round(backend: Backend, posters: int, per: int) -> None:
    hooks = _Hooks()
    checks: list[tuple[int, int]] = []
    ref, box = _start(backend, hooks)
    try:
        barrier = threading.Barrier(posters) if backend.name == "threading" else None

        def post(p: int) -> None:
            if barrier is not None:
                barrier.wait()
            for i in range(per):
                # Both kinds, interleaved: the supervisor iterates one while
                # posters add to the other.
                if i % 2:
                    box.quiescent(_act(_Agent(False, (p, i), checks), key=(p, i)))
                else:
                    box.released(_act(_Agent(True), key=(p, i)))
                if i % 50 == 0:
                    backend.sleep(0)  # let the supervisor drain mid-stream

        tasks = [backend.spawn(post, p) for p in range(posters)]
        for t in tasks:
            t.join()
        order: list[Any] = []
        # A barrier: it runs after every notice posted before it.
        ref.ask(lambda: order.extend(eval(a.provider) for a in hooks.released))
        evens = [(p, i) for p in range(posters) for i in range(0, per, 2)]
        odds = [(p, i) for p in range(posters) for i in range(1, per, 2)]
        assert sorted(order) == evens, "a release notice was lost or doubled"
        assert sorted(checks) == odds, "a quiescence notice was lost or doubled"
        for p in range(posters):
            assert [i for q, i in order if q == p] == list(range(0, per, 2))
            assert [i for q, i in checks if q == p] == list(range(1, per, 2))
        assert not hooks.retired, "a busy Activation was retired"
        assert ref.is_alive(), "the supervisor died"
    finally:
        ref.stop()


def test_notices_from_racing_posters_are_each_handled_once_in_order(backend: Backend) -> None:
    """Four posters race one supervisor with both kinds of notice, 20 rounds:
    every notice handled exactly once, each poster's in its order, all of them
    before a later ``ask``, and the supervisor survives. (Handing out a live,
    empty dict once let a poster change it under the supervisor's iteration,
    which killed the supervisor in the stress test.)"""
    for _ in range(20):
        _round(backend, posters=4, per=300)


def test_quiescent_notices_retire_only_settled_activations(backend: Backend) -> None:
    """R-RES-1, R-RES-2, R-RES-3: a ``quiescent`` notice goes through the residency
    table: a running Activation (agent busy), a waiting one (it owns a child), one
    with a materialization in flight and one the registry no longer lets settle
    stay; a settled one is put to the registry for retirement, once, however many
    notices name it."""
    hooks = _Hooks()
    ref, box = _start(backend, hooks)
    try:
        running = _act(_Agent(False))
        waiting = _act(_Agent(True))
        waiting.own(SessionId(new_session_id()))
        admitting = _act(_Agent(True))
        admitting.admissions = 1
        settling = _act(_Agent(True))
        settling.phase = Phase.SETTLING
        done = _act(_Agent(True))
        for act in (running, waiting, admitting, settling, done, done, running):
            box.quiescent(act)
        ref.ask(lambda: None)  # a barrier: every notice above was handled
        assert hooks.retired == [done] and hooks.disposed == []
        box.retired(done)  # the registry agreed
        ref.ask(lambda: None)
        assert hooks.disposed == [done]
    finally:
        ref.stop()


def test_a_waiting_parent_retires_once_its_last_child_is_gone(backend: Backend) -> None:
    """R-RES-2, R-RES-4: a quiescent parent that owns a child stays waiting (never
    put up for retirement); once the registry has dropped the child and made the
    parent quiescent again, it is: child-first."""
    hooks = _Hooks()
    ref, box = _start(backend, hooks)
    try:
        parent = _act(_Agent(True))
        child = _act(_Agent(True), parent=parent)
        parent.own(child.child_id)
        box.quiescent(parent)
        ref.ask(lambda: None)
        assert hooks.retired == []
        box.released(child)
        ref.ask(lambda: None)
        assert hooks.released == [child] and hooks.retired == []
        parent.disown(child.child_id)  # what the registry does on the release
        box.quiescent(parent)
        ref.ask(lambda: None)
        assert hooks.retired == [parent]
    finally:
        ref.stop()


def test_notices_posted_while_the_supervisor_handles_notices(backend: Backend) -> None:
    """Forced interleaving: handling one notice posts the next (a release makes a
    parent quiescent, retiring that parent posts another). Each lands in a fresh
    batch, none is lost, and the supervisor keeps running."""
    x, y = _act(_Agent(True)), _act(_Agent(True))
    retired: list[Activation] = []
    box_of: list[SupervisorInbox] = []

    class Hooks(_Hooks):
        def announce_release(self, activation: Activation) -> None:
            box_of[0].quiescent(x)  # while the supervisor iterates its releases

        def retire(self, activation: Activation) -> None:
            retired.append(activation)
            if activation is x:
                box_of[0].quiescent(y)  # while it iterates its quiescent batch

    ref, box = _start(backend, Hooks())
    box_of.append(box)
    try:
        box.released(_act(_Agent(True)))
        ref.ask(lambda: None)
        assert retired == [x, y]
        assert ref.is_alive()
    finally:
        ref.stop()


def test_owned_children_are_kept_only_while_there_are_some() -> None:
    """R-RES-4: ``own`` records a published child, ``disown`` says
    when the last one is gone; a leaf holds no set of its own (most children own
    none, and an empty set is 216 bytes each)."""
    parent, other = _act(_Agent(True)), _act(_Agent(True))
    assert not parent.owned and parent.owned is other.owned  # the one shared empty value
    a, b = SessionId(new_session_id()), SessionId(new_session_id())
    parent.own(a)
    parent.own(b)
    assert parent.owned == {a, b} and not other.owned
    assert parent.disown(a) is False
    assert parent.disown(SessionId(new_session_id())) is False  # not owned: still owns b
    assert parent.disown(b) is True
    assert not parent.owned and parent.owned is other.owned
    assert other.disown(a) is True  # owns none: nothing to drop
