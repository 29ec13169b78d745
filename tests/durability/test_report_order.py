"""One child's reports reach its parent in the order the child made them, across an
activation of the parent (R-REP-1, R-REP-5, R-REP-6, L-9), both backends, SQLite
and PostgreSQL.

A report to a parent that is not live is kept in the parent's durable inbox and
wakes it; the parent's activation replays what waits there. A later report that
found the parent's agent registered but its replay not yet queued was committed
taken by the new activation and queued at once -- ahead of the earlier report the
replay was about to queue (the crash soak's per-child order check saw it: a report
ran a turn before the one its child made first). The interleaving is forced at the
seam between the two: the top-level resume's replay, a continuable parent's
setup contribution (which runs before its publication replays the inbox).
"""

from __future__ import annotations

from typing import Any

import pytest
from durability_kit import Noted, until
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._agents import _mail, _registry
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Gate
from subagents.protocol import ReportEvent, SessionId


def _settled(rt: Runtime, parent: Any, label: str) -> SessionId:
    """A continuable child of ``parent`` (an Agent or an id) that ran its prompt and
    settled: not live (keep_warm=0)."""
    ended = Noted()

    def listen(event: Any) -> None:
        if event.type == "subagent/end":
            ended.add(("end", event.child_id, False))

    subscription = rt.subagents.subscribe(listen)
    child_id = rt.subagents.start_continuable(
        ContinuableStartSpec(parent=parent, provider="local", prompt="p", label=label, model="note")
    ).child_id
    assert ended.wait_for(lambda items: ("end", child_id, False) in items, 30)
    subscription.dispose()
    assert rt.wait_idle(30)
    return child_id


def _hold_after_registering(monkeypatch: pytest.MonkeyPatch, sid: SessionId, gate: Gate) -> None:
    """The next activation of ``sid`` waits at ``gate`` right after its agent is
    registered -- found live by others -- and before its replay is queued."""
    register = _registry.AgentRegistry._register
    watched = [sid]

    def gated(self: Any, agent: Any, **kw: Any) -> None:
        register(self, agent, **kw)
        if agent.session_id in watched:
            watched.clear()
            gate.pass_through()

    monkeypatch.setattr(_registry.AgentRegistry, "_register", gated)


def _ran(noted: Noted, who: str) -> list[Any]:
    return [c for n, c, _ in noted.items() if n == who and c != "p"]


def test_a_report_during_the_parents_resume_runs_after_the_one_that_woke_it(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parent (top-level) is not live: the child's waking report r1 is kept and
    activates it (the mail's adoption); its resume is held right after the agent's
    registration, before the replay of r1. The child's next report r2 meanwhile finds
    the parent live: it ran before r1. Now it runs after it."""
    replaying = Gate("replay")

    noted = Noted()
    with Runtime(db, backend=backend) as rt:
        noted.register(rt, "rt")
        parent = rt.spawn("note", label="parent")
        parent_id = parent.session_id
        child_id = _settled(rt, parent, "kid")
        parent.dispose()
        _hold_after_registering(monkeypatch, parent_id, replaying)
        rt.subagents.report_from(child_id, "r1", delivery="waking")
        assert replaying.wait_reached(30)  # registered, r1 not queued yet
        rt.subagents.report_from(child_id, "r2", delivery="waking")
        replaying.release()
        assert noted.wait_for(
            lambda items: len([c for _, c, _ in items if c in ("r1", "r2")]) >= 2, 30
        )
        assert rt.wait_idle(30)
        assert rt.agents.get(parent_id) is not None
    assert [c for c in noted.contents() if c in ("r1", "r2")] == ["r1", "r2"]


def test_a_report_during_a_continuable_parents_materialization_runs_after_the_kept_one(
    backend: Backend, db: str
) -> None:
    """The parent is a continuable child that settled, and so did its own child: by
    the grandchild's id, r1 is kept in the parent's inbox and wakes it below the
    root; its materialization is held in a setup contribution (before publication
    replays r1). r2, by id as well, found the parent's agent registered and was
    queued ahead of r1. Now it runs after it."""
    setup = Gate("setup")
    armed: list[bool] = []

    def contribution(scope: Any) -> None:
        if armed and scope.child_id == armed_for[0]:
            armed.clear()
            setup.pass_through()

    armed_for: list[SessionId] = []
    noted = Noted()
    with Runtime(db, backend=backend) as rt:
        noted.register(rt, "rt")
        root = rt.spawn("note", label="root")
        mid = _settled(rt, root, "mid")
        leaf = _settled(rt, mid, "leaf")
        rt.subagents.register_continuable_setup(contribution)
        armed_for.append(mid)
        armed.append(True)
        rt.subagents.report_from(leaf, "r1", delivery="waking")
        assert setup.wait_reached(30)  # the parent materializing, r1 not queued yet
        rt.subagents.report_from(leaf, "r2", delivery="waking")
        setup.release()
        assert noted.wait_for(
            lambda items: len([c for _, c, _ in items if c in ("r1", "r2")]) >= 2, 30
        )
        assert rt.wait_idle(30)
    assert [c for c in noted.contents() if c in ("r1", "r2")] == ["r1", "r2"]


def test_a_report_another_runtime_rang_about_waits_for_the_replay(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quiet report r1 waits in the inbox of a parent that is not live (it wakes
    nobody). Runtime ``a`` resumes the parent, held right after the registration;
    meanwhile runtime ``b`` sends the waking report r2 by the child's id: committed
    untaken, ``a`` rung. ``a``'s pickup found the parent live and queued r2 ahead
    of the replay of r1, so r2's turn ran without r1 as its context. Now the pickup
    stands back until the replay is queued: r2's turn sees r1."""
    replaying = Gate("replay")

    picked: list[bool] = []
    deliver = _mail.Mailman._deliver

    def looked(self: Any, agent: Any) -> None:
        deliver(self, agent)
        if agent.session_id == parent_id:
            picked.append(True)

    seen: list[tuple[Any, tuple[Any, ...]]] = []

    def watch(_options: Any) -> Any:
        def on_turn(turn: Any) -> Any:
            seen.append((turn.content, tuple(m.content for m in turn.context)))
            return turn.content

        return on_turn

    with Runtime(db, backend=backend) as a, Runtime(db, backend=backend) as b:
        for rt in (a, b):
            rt.models.register("note", watch)
        parent = a.spawn("note", label="parent")
        parent_id = parent.session_id
        child_id = _settled(a, parent, "kid")
        parent.dispose()
        a.subagents.report_from(child_id, "r1")  # quiet: kept, wakes nobody
        _hold_after_registering(monkeypatch, parent_id, replaying)
        monkeypatch.setattr(_mail.Mailman, "_deliver", looked)
        resumed = a.backend.spawn(lambda: a.agents.resume(parent_id), name="resume")
        assert replaying.wait_reached(30)  # registered (leased by a), r1 not queued yet
        b.subagents.report_from(child_id, "r2", delivery="waking")  # a is rung
        assert until(a, lambda: bool(picked), timeout=30)  # a's pickup looked at it
        replaying.release()
        assert resumed.join(30) and resumed.exception is None
        assert until(a, lambda: any(c == "r2" for c, _ in seen), timeout=30)
        assert a.wait_idle(30)
    assert [s for s in seen if s[0] != "p"] == [("r2", ("r1",))]


def test_reports_accepted_while_the_runtime_closes_run_after_those_it_kept(
    backend: Backend, db: str
) -> None:
    """The runtime closes while the parent's turn runs, a quiet report q1 queued
    behind it: the close cancels the parent keeping what it accepted (q1 runs at
    its next activation). Its disposal comes after its child's, whose turn is still
    running; meanwhile the child reports q2 (quiet) and w3 (waking). They were
    accepted and run at once -- w3's turn took q2 as its context, in the closing
    runtime -- and q1 later, behind them (the crash soak saw a child's second quiet
    report consumed before its first). Now the cancelled activation runs nothing
    more: what it accepts after the close's cancel stays in the inbox too, behind
    q1, and the next activation runs all three in order."""
    hold_parent, hold_child = Gate("parent"), Gate("child")
    seen: list[tuple[Any, tuple[Any, ...]]] = []

    def model(_options: Any) -> Any:
        def on_turn(turn: Any) -> Any:
            seen.append((turn.content, tuple(m.content for m in turn.context)))
            if turn.content == "hold":
                hold_parent.pass_through(turn.signal)  # cancelled by the close
            elif turn.content == "hold-child":
                hold_child.pass_through()  # not cancellable: the close waits for it
            return turn.content

        return on_turn

    rt = Runtime(db, backend=backend, keep_warm=60)
    try:
        rt.models.register("m", model)
        parent = rt.spawn("m", label="parent")
        parent_id = parent.session_id
        child = rt.subagents.start_continuable(
            ContinuableStartSpec(parent=parent, provider="local", prompt="hi", label="k", model="m")
        ).child_id
        assert rt.wait_idle(30)
        rt.subagents.followup(parent, child, "hold-child")
        assert hold_child.wait_reached(30)
        parent.followup("hold")
        assert hold_parent.wait_reached(30)
        rt.subagents.report_from(child, "q1")  # queued behind the parent's turn
        closing = rt.backend.spawn(rt.close, name="close")
        # The close's cancel ended the parent's turn; the child's turn holds the close.
        assert until(rt, lambda: len(rt.sessions.turn_ends(parent_id)) == 1, timeout=30)
        rt.subagents.report_from(child, "q2")
        rt.subagents.report_from(child, "w3", delivery="waking")
        hold_child.release()
        assert closing.join(60) and closing.exception is None
    finally:
        hold_child.release()
        hold_parent.release()  # its turn runs again at the next activation
        rt.close()
    assert ("w3", ("q2",)) not in seen  # nothing more ran in the closing runtime
    # Not adopting: its sweep would also wake the child, whose turn the close cut
    # short -- recorded cancelled, it runs again -- and the last turn seen is that.
    with Runtime(db, backend=backend, adopt=False) as again:
        again.models.register("m", model)
        again.agents.resume(parent_id)
        assert until(again, lambda: any(c == "w3" for c, _ in seen), timeout=30)
        assert again.wait_idle(30)
        reports = [
            r.event.content
            for r in again.sessions.read(parent_id)
            if isinstance(r.event, ReportEvent)
        ]
    assert reports == ["q1", "q2", "w3"]
    assert seen[-1] == ("w3", ("q1", "q2"))


def test_a_send_during_the_resume_runs_after_the_replay(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-FUP-1, L-8: as a report, a ``send`` that found the resumed session's agent
    registered before its replay was queued ran first -- its turn without the
    quiet report r1 that waited in the inbox as its context. Now it is kept in the
    inbox, and the pickup queues it after the replay."""
    replaying = Gate("replay")

    seen: list[tuple[Any, tuple[Any, ...]]] = []

    def watch(_options: Any) -> Any:
        def on_turn(turn: Any) -> Any:
            seen.append((turn.content, tuple(m.content for m in turn.context)))
            return turn.content

        return on_turn

    with Runtime(db, backend=backend) as rt:
        rt.models.register("note", watch)
        parent = rt.spawn("note", label="parent")
        parent_id = parent.session_id
        child_id = _settled(rt, parent, "kid")
        parent.dispose()
        rt.subagents.report_from(child_id, "r1")  # quiet: kept, wakes nobody
        _hold_after_registering(monkeypatch, parent_id, replaying)
        resumed = rt.backend.spawn(lambda: rt.agents.resume(parent_id), name="resume")
        assert replaying.wait_reached(30)
        rt.agents.send(parent_id, "m2")
        replaying.release()
        assert resumed.join(30) and resumed.exception is None
        assert until(rt, lambda: any(c == "m2" for c, _ in seen), timeout=30)
        assert rt.wait_idle(30)
    assert [s for s in seen if s[0] != "p"] == [("m2", ("r1",))]
