"""A listener that raises ``SystemExit`` (a ``sys.exit()`` in it) is contained like
any other failing listener: logged, and the runtime goes on. Raised out of an actor
it used to reach pykka, which stops every actor of the process -- every agent of
the runtime was disposed. R-EVT-11."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors._kernel._gate import Latch
from subagents.store import MemoryStore


class Exits:
    """A listener that raises ``SystemExit`` the first time it hears ``match``,
    and counts each later hearing on ``again``."""

    def __init__(self, match: Any = None) -> None:
        self.match = match
        self.calls = 0
        self.again = Latch()

    def __call__(self, arg: Any) -> None:
        if self.match is not None and not self.match(arg):
            return
        self.calls += 1
        if self.calls == 1:
            raise SystemExit("a listener exits")
        self.again.set()


def _echo(turn: Any) -> Any:
    if turn.content == "start":
        turn.subagents.start_continuable("local", "kid", label="kid", model="echo")
    return turn.content


@pytest.fixture
def rt(backend: Backend) -> Any:
    with Runtime(MemoryStore(), backend=backend) as runtime:
        runtime.models.register("echo", lambda _o: _echo, replace=True)
        yield runtime


def _bystander_runs(rt: Runtime, bystander: Any) -> None:
    bystander.followup("still here?")
    assert bystander.wait_idle(10)
    assert not bystander.disposed and bystander.statistics().turns == 1


def test_a_lifecycle_listener_that_exits(rt: Runtime, caplog: pytest.LogCaptureFixture) -> None:
    """The dispatcher announcing a child's end runs on: the next end is heard."""
    listener = Exits(lambda e: e.type == "subagent/end" and e.mode == "continuable")
    rt.subagents.subscribe(listener)
    bystander = rt.spawn("echo", label="bystander")
    root = rt.spawn("echo", label="root")
    with caplog.at_level(logging.ERROR, logger="subagents"):
        for _ in range(2):  # each child settles at once (keep_warm 0): its end
            root.followup("start")
            assert root.wait_idle(10)
        assert listener.again.wait(10), "the dispatcher stopped"
    assert any("SystemExit" in r.getMessage() or r.exc_info for r in caplog.records)
    _bystander_runs(rt, bystander)
    root.followup("and the parent")
    assert root.wait_idle(10) and not root.disposed


def test_an_idle_listener_that_exits(rt: Runtime) -> None:
    """The agent whose idle listener exits runs its next turn, and is heard again."""
    agent = rt.spawn("echo", label="listened")
    bystander = rt.spawn("echo", label="bystander")
    listener = Exits()
    agent.add_idle_listener(listener)
    for content in ("one", "two"):
        agent.followup(content)
        assert agent.wait_idle(10)
    assert listener.again.wait(10)
    assert not agent.disposed and agent.statistics().turns == 2
    _bystander_runs(rt, bystander)


def test_a_dispose_listener_that_exits(rt: Runtime) -> None:
    """Disposing an agent whose dispose listener exits leaves the others live."""
    agent = rt.spawn("echo", label="leaving")
    bystander = rt.spawn("echo", label="bystander")
    listener = Exits()
    agent.add_dispose_listener(listener)
    agent.dispose()
    assert listener.calls == 1
    _bystander_runs(rt, bystander)
