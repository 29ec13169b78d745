"""The supervisor's notices: from many threads or greenlets, batched into few
mailbox messages, each handled exactly once, in each poster's order, before any
later mailbox message (R-RES-5, R-RES-6: settlement and child-first release
are driven by these notices; a lost one leaves an Activation resident forever).
"""

from __future__ import annotations

import threading
from typing import Any

from subagents.actors._kernel._backend import Backend
from subagents.supervision import Notices, supervisor_actor_class


class _Act:
    """Stands in for an Activation: the hooks below only record what they see."""

    def __init__(self, poster: int, n: int) -> None:
        self.key = (poster, n)


class _Hooks:
    """Records every settle/release the supervisor asks for (never settles)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: list[tuple[str, tuple[int, int]]] = []

    def begin_settle(self, activation: Any) -> None:
        raise AssertionError("nothing settles here")

    def dispose_async(self, activation: Any) -> None:
        raise AssertionError("nothing settles here")

    def on_released(self, activation: Any) -> None:
        self.seen.append(("released", activation.key))

    def keep_warm(self, activation: Any) -> bool:
        return False


class _Busy:
    """An agent that is never idle; records each residency check (a handled
    ``quiescent`` notice)."""

    def __init__(self, key: tuple[int, int], checks: list[tuple[int, int]]) -> None:
        self._key = key
        self._checks = checks

    @property
    def idle(self) -> bool:
        self._checks.append(self._key)
        return False


def _round(backend: Backend, posters: int, per: int) -> None:
    hooks = _Hooks()
    checks: list[tuple[int, int]] = []
    notices = Notices()
    ref = supervisor_actor_class(backend.actor_class).start(hooks, notices)
    notices.bind(ref)
    try:
        barrier = threading.Barrier(posters) if backend.name == "threading" else None

        def post(p: int) -> None:
            if barrier is not None:
                barrier.wait()
            for i in range(per):
                act: Any = _Act(p, i)
                act.parent_activation = None
                if i % 2:  # both kinds, interleaved: the supervisor iterates one
                    act.settling = False  # while posters add to the other
                    act.admissions = 0
                    act.owned = set()
                    act.agent = _Busy((p, i), checks)
                    notices.quiescent(act)
                else:
                    notices.released(act)
                if i % 50 == 0:
                    backend.sleep(0)  # let the supervisor drain mid-stream

        tasks = [backend.spawn(post, p) for p in range(posters)]
        for t in tasks:
            t.join()
        order: list[Any] = []
        ref.ask(lambda: order.extend(k for _, k in hooks.seen))  # runs after every notice
        evens = [(p, i) for p in range(posters) for i in range(0, per, 2)]
        odds = [(p, i) for p in range(posters) for i in range(1, per, 2)]
        assert sorted(order) == evens, "a release notice was lost or doubled"
        assert sorted(checks) == odds, "a quiescence notice was lost or doubled"
        for p in range(posters):
            assert [i for q, i in order if q == p] == list(range(0, per, 2))
            assert [i for q, i in checks if q == p] == list(range(1, per, 2))
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


def test_quiescent_notices_settle_only_settled_activations(backend: Backend) -> None:
    """A ``quiescent`` notice goes through the residency table: a running Activation (agent
    busy) and a waiting one (it owns a child) stay; a settled one is settled and
    its disposal started, once, however many notices name it."""

    class Agentish:
        def __init__(self, idle: bool) -> None:
            self.idle = idle

    class Actish:
        def __init__(self, name: str, idle: bool, owned: set[Any]) -> None:
            self.name = name
            self.settling = False
            self.admissions = 0
            self.owned = owned
            self.agent = Agentish(idle)

    settled: list[str] = []
    disposing: list[str] = []

    class Hooks(_Hooks):
        def begin_settle(self, activation: Any) -> None:
            settled.append(activation.name)

        def dispose_async(self, activation: Any) -> None:
            disposing.append(activation.name)

    notices = Notices()
    ref = supervisor_actor_class(backend.actor_class).start(Hooks(), notices)
    notices.bind(ref)
    try:
        running = Actish("running", idle=False, owned=set())
        waiting = Actish("waiting", idle=True, owned={"kid"})
        done = Actish("settled", idle=True, owned=set())
        for act in (running, waiting, done, done, running):
            notices.quiescent(act)  # type: ignore[arg-type]
        ref.ask(lambda: None)  # a barrier: every notice above was handled
        assert settled == ["settled"] and disposing == ["settled"]
    finally:
        ref.stop()


def test_notices_posted_while_the_supervisor_handles_notices(backend: Backend) -> None:
    """Forced interleaving: handling one notice posts the next (a release makes a
    parent quiescent, settling that parent posts another). Each lands in a fresh
    batch, none is lost, and the supervisor keeps running."""

    class Agentish:
        idle = True

    class Actish:
        def __init__(self, name: str) -> None:
            self.name = name
            self.settling = False
            self.admissions = 0
            self.owned: set[Any] = set()
            self.agent = Agentish()
            self.parent_activation = None

    x, y = Actish("x"), Actish("y")
    settled: list[str] = []
    notices = Notices()

    class Hooks(_Hooks):
        def on_released(self, activation: Any) -> None:
            notices.quiescent(x)  # while the supervisor iterates its releases

        def begin_settle(self, activation: Any) -> None:
            settled.append(activation.name)

        def dispose_async(self, activation: Any) -> None:
            if activation is x:
                notices.quiescent(y)  # while it iterates its quiescent batch

    ref = supervisor_actor_class(backend.actor_class).start(Hooks(), notices)
    notices.bind(ref)
    try:
        notices.released(Actish("a"))
        ref.ask(lambda: None)
        assert settled == ["x", "y"]
        assert ref.is_alive()
    finally:
        ref.stop()
