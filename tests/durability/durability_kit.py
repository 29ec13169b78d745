"""Helpers of the durability tests: a model that notes what it ran, and waiting on it.

``Noted`` is a thread-safe list of ``(runtime, content, redelivered)`` tuples; its
``wait_for`` blocks cooperatively on both backends (an ``AbortController``'s
signal, which a gevent hub can wake), so a test waits for a turn another
runtime's task runs without sleeping. ``worker`` runs a worker process with
pipes (killed and reaped on leaving), ``until`` polls a condition only the
store can say, and ``two_runtimes`` makes a pair of runtimes on one store.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from subagents.actors import AbortController, ContinuableStartSpec, Runtime
from subagents.actors._agents import _mail
from subagents.actors._agents._sweep_reads import SweepReads
from subagents.actors.testing import Gate


class Noted:
    """What the ``note`` model ran, in order, from every runtime it is registered on."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[str, Any, bool]] = []
        self._probes: list[Callable[[], None]] = []

    def add(self, item: tuple[str, Any, bool]) -> None:
        with self._lock:
            self._items.append(item)
            probes = list(self._probes)
        for wake in probes:
            wake()

    def items(self) -> list[tuple[str, Any, bool]]:
        with self._lock:
            return list(self._items)

    def contents(self) -> list[Any]:
        return [c for _, c, _ in self.items()]

    def ran(self, content: Any) -> list[str]:
        """The runtimes that ran the turn of ``content`` so far, in order."""
        return [name for name, c, _ in self.items() if c == content]

    def runs(self, content: Any, expected: list[str], timeout: float = 10.0) -> bool:
        """Wait until the runtimes that ran ``content`` are ``expected``."""
        return self.wait_for(
            lambda items: [n for n, c, _ in items if c == content] == expected, timeout
        )

    def wait_for(
        self, predicate: Callable[[list[tuple[str, Any, bool]]], bool], timeout: float = 10.0
    ) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            controller = AbortController()
            wake = controller.abort
            with self._lock:
                if predicate(list(self._items)):
                    return True
                self._probes.append(wake)
            try:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return predicate(self.items())
                controller.signal.wait(remaining)
            finally:
                with self._lock:
                    self._probes.remove(wake)

    def register(self, rt: Runtime, name: str, model: str = "note") -> None:
        """Register the ``note`` model (or ``model``) on ``rt``: its turns note
        ``(name, content, redelivered)``."""

        def factory(_options: Any) -> Any:
            def on_turn(turn: Any) -> Any:
                self.add((name, turn.content, turn.redelivered))
                return turn.content

            return on_turn

        rt.models.register(model, factory, replace=True)


@contextmanager
def worker(
    script: str, *args: str, env: dict[str, str] | None = None, inside: Sequence[str] = ()
) -> Iterator[subprocess.Popen[str]]:
    """Run ``script`` (a file beside this module) with ``args`` (``env``: more
    environment; ``inside``: a command that runs it, such as ``unshare``) and text
    pipes on stdin, stdout and stderr; on leaving, kill it unless it exited, and
    close its pipes."""
    proc = subprocess.Popen(
        [*inside, sys.executable, str(Path(__file__).with_name(script)), *args],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=None if env is None else {**os.environ, **env},
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None and not pipe.closed:
                pipe.close()


def blocked(proc: subprocess.Popen[str]) -> tuple[str, str]:
    """The root and child of a ``start_worker.py ... blocked`` worker, once the
    child's first turn runs there."""
    assert proc.stdout is not None
    line = proc.stdout.readline().split()
    assert len(line) == 2, proc.stderr.read() if proc.stderr else ""
    return line[0], line[1]


def gated_pickup() -> tuple[Gate, Callable[[Any, Any], None]]:
    """A gate, and a mail pickup that passes it first: the test patches it in
    (``monkeypatch.setattr(_mail.Mailman, "pickup", gated)``) when it chooses."""
    gate = Gate("pickup")
    held = _mail.Mailman.pickup

    def gated(self: Any, sid: Any) -> None:
        gate.pass_through()
        held(self, sid)

    return gate, gated


def looked_once(rt: Runtime) -> Any:
    """A strict agent whose turns answer their content, its activation's first
    follow-up (``m0``, which looks once for messages ahead of it) run: the agent."""
    rt.models.register("w", lambda _o: lambda turn: turn.content)
    agent = rt.spawn("w")
    agent.followup("m0")
    assert agent.wait_idle(10)
    return agent


def until(rt: Runtime, done: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``done()`` with a deadline, sleeping on ``rt``'s backend (its greenlets
    run meanwhile): for conditions only the store can say (another process's
    writes), where no event reaches this process."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            return False
        rt.backend.sleep(0.005)
    return True


def exited(rt: Runtime, proc: subprocess.Popen[Any], timeout: float = 60.0) -> int | None:
    """``proc``'s exit code once it ended (None past ``timeout``), waiting on ``rt``'s
    backend: a blocking ``proc.wait`` stops a gevent runtime's hub -- its session
    writer and lease renewal -- while the process may be waiting for just those
    (its view of the store), until the runtime's leases lapse."""
    return proc.returncode if until(rt, lambda: proc.poll() is not None, timeout) else None


def resumed_elsewhere(rt: Runtime, db: str, sid: Any, marks: Any, backend: str, ttl: str) -> None:
    """Another process (``mp_worker.py resume``) resumes ``sid`` on the store ``db``
    and ends: asserts it could (the lease was free), waiting on ``rt``'s backend."""
    args = ("resume", db, str(sid), "-", "-", "-", str(marks), backend, ttl)
    with worker("mp_worker.py", *args) as other:
        assert exited(rt, other) == 0
        assert other.stdout is not None and other.stdout.read().strip() == "resumed"


def two_runtimes(backend: Any, db: str, lease_ttl: float) -> Iterator[list[Runtime]]:
    """Two strict runtimes on one store (for a fixture: ``yield from``), closed
    after, the second first."""
    made: list[Runtime] = []
    try:
        made.append(Runtime(db, backend=backend, lease_ttl=lease_ttl))
        made.append(Runtime(db, backend=backend, lease_ttl=lease_ttl))
        yield made
    finally:
        for rt in reversed(made):
            rt.close()


def gated(gates: dict[str, Gate]) -> Callable[[Any], Any]:
    """A behaviour whose turn waits at ``gates[content]``, if there is one (its signal
    cuts the wait: a cancelled turn), and returns its content."""

    def on_turn(turn: Any) -> Any:
        gate = gates.get(turn.content)
        if gate is not None:
            gate.pass_through(turn.signal)
        return turn.content

    return on_turn


def settled_child(rt: Runtime, parent: Any) -> str:
    """A continuable child of ``parent`` that ran its prompt and settled (not live:
    ``keep_warm`` 0)."""
    ended = Noted()

    def listen(event: Any) -> None:
        if event.type == "subagent/end":
            ended.add(("end", event.child_id, False))

    subscription = rt.subagents.subscribe(listen)
    child_id = rt.subagents.start_continuable(
        ContinuableStartSpec(
            parent=parent, provider="local", prompt="hi", label="kid", model="echo"
        )
    ).child_id
    assert ended.wait_for(lambda items: ("end", child_id, False) in items)
    subscription.dispose()
    assert rt.wait_idle(10)
    assert rt.agents.get(child_id) is None
    return str(child_id)


def waits_behind(rt: Runtime, child: Any, content: Any) -> bool:
    """Whether a follow-up of ``content`` to ``child`` waits in the registry behind
    the child's materialization or release (routed, not yet delivered)."""
    act = rt.continuation._index.get(child)
    waiters = [] if act is None else act.waiters or []
    return any(r.delivery is not None and r.delivery.content == content for r in waiters)


def sweep_answers(monkeypatch: Any, name: str) -> list[list[Any]]:
    """What each sweep's question ``name`` (a ``SweepReads`` method: ``abandoned``,
    ``unheard``) answered, in order; patched in with ``monkeypatch``."""
    answers: list[list[Any]] = []
    real = getattr(SweepReads, name)

    def ask(self: Any, *args: Any) -> list[Any]:
        found: list[Any] = real(self, *args)
        answers.append(found)
        return found

    monkeypatch.setattr(SweepReads, name, ask)
    return answers


@contextmanager
def beside_a_worker(
    backend: Any,
    db: str,
    tmp_path: Path,
    ttl: float,
    host: str | None = None,
    inside: Sequence[str] = (),
) -> Iterator[Any]:
    """``(worker, child, runtime, noted)``: a ``start_worker.py blocked`` worker (lease
    ttl an hour; ``host``: its holder names that host; ``inside``: see
    :func:`worker`) holds ``child``, its turn running there; ``runtime`` (lease ttl
    ``ttl``) sweeps the store, its ``block`` turns ``noted``."""
    args = (db, backend.name, str(tmp_path / "m"), "blocked", "3600")
    env = None if host is None else {"SUBAGENTS_TEST_HOST": host}
    with worker("start_worker.py", *args, env=env, inside=inside) as proc:
        _root, child = blocked(proc)
        with Runtime(db, backend=backend, lease_ttl=ttl) as rt:
            noted = Noted()
            noted.register(rt, "here", "block")
            yield proc, child, rt, noted
