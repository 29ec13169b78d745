"""Messages discarded unrun stay in the log.

A cancel without ``keep_inbox`` (``Agent.dispose()``, a one-shot run's dispose or
abort, a drain) skips every queued message. Each is still logged, as a turn that
ended ``cancelled`` without running (error ``discarded unrun``), with the events it
carries: so a one-shot child disposed before its first turn keeps the descriptor
that gives it its identity, and every id a caller was given is in the log.
A quiet report is not a turn: it waits for the next one.

R-ONE-11, R-ONE-20, R-CAT (a published child lists with its identity), R-REP-5.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from subagents.actors import (
    AbortController,
    AbortSignal,
    ContinuableStartSpec,
    Runtime,
    SubagentStartRequest,
)
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Gate
from subagents.protocol import (
    MessageEvent,
    ReportEvent,
    SubagentDescriptorEvent,
    TurnEnd,
    TurnStart,
)
from subagents.store import MemoryStore

DISCARDED = ("cancelled", "discarded unrun")


def _log(rt: Runtime, sid: Any) -> list[Any]:
    rt.sessions.flush()
    return [r.event for r in rt.sessions.read(sid)]


@pytest.fixture(params=["sqlite", "memory"])
def rt_store(request: pytest.FixtureRequest, backend: str, tmp_path: Path) -> Iterator[Runtime]:
    """A runtime with persistence, on ``backend``: an SQLite file or the memory store."""
    store = str(tmp_path / "sessions.db") if request.param == "sqlite" else MemoryStore()
    with Runtime(store, backend=backend) as runtime:
        yield runtime


@pytest.mark.parametrize("how", ["dispose", "abort"])
def test_a_one_shot_child_disposed_at_once_keeps_its_identity(rt_store: Runtime, how: str) -> None:
    """A one-shot run disposed (or its signal aborted) right after ``start``,
    whether or not its turn began: the child lists as a row with its label, never
    as a ``corrupt`` diagnostic, and its log holds the descriptor and the prompt."""
    rt = rt_store
    host = rt.spawn("echo", label="host")
    runs = []
    for i in range(20):
        controller = AbortController()
        run = rt.subagents.start(
            "local",
            SubagentStartRequest(
                parent=host, prompt=f"job {i}", label=f"job-{i}", signal=controller.signal
            ),
        )
        if how == "abort":
            controller.abort("changed my mind")
        run.dispose()
        runs.append(run)
    listing = rt.subagents.list_children(host.session_id)
    assert listing.diagnostics == ()
    assert sorted(r.label for r in listing.rows) == sorted(f"job-{i}" for i in range(20))
    for i, run in enumerate(runs):
        log = _log(rt, run.id)
        assert [e.content for e in log if isinstance(e, MessageEvent)] == [f"job {i}"]
        assert sum(isinstance(e, SubagentDescriptorEvent) for e in log) == 1
        (end,) = [e for e in log if isinstance(e, TurnEnd)]
        assert end.stop_reason in {"completed", "cancelled"}
        assert run.result.get(0).stop_reason == end.stop_reason


def test_dispose_logs_each_queued_message_as_a_turn_that_never_ran(rt_store: Runtime) -> None:
    """``Agent.dispose()`` with messages queued behind a running turn: the turn is
    cancelled, the behaviour never sees the queued ones, and each of their ids is
    in the log as a turn that ended cancelled unrun, in acceptance order. Nothing
    is left pending in the durable inbox."""
    rt = rt_store
    gate = Gate()
    seen: list[Any] = []

    def slow(turn: Any) -> Any:
        seen.append(turn.content)
        gate.pass_through(turn.signal)
        return turn.content

    rt.models.register("slow", lambda _o: slow)
    agent = rt.spawn("slow")
    ids = [agent.followup(m) for m in ("m1", "m2", "m3")]
    assert gate.wait_reached(10)
    agent.dispose()
    assert seen == ["m1"]
    log = _log(rt, agent.session_id)
    assert [m for e in log if isinstance(e, TurnStart) for m in e.message_ids] == ids
    ends = [(e.stop_reason, e.error) for e in log if isinstance(e, TurnEnd)]
    assert ends == [("cancelled", None), DISCARDED, DISCARDED]
    assert rt.sessions.pending(agent.session_id) == []


def test_a_quiet_report_queued_behind_a_cancel_waits_for_the_next_turn(
    rt_store: Runtime,
) -> None:
    """A quiet report queued for a parent whose inbox a cancel without
    ``keep_inbox`` skips is not a turn to discard: the parent's next turn logs it."""
    rt = rt_store
    held, reported = Gate("held"), Gate("reported")

    def parent(turn: Any) -> Any:
        if turn.index == 0:
            turn.subagents.start_continuable("local", "go", label="c", model="reporter")
            held.pass_through(turn.signal)
        return turn.content

    def reporter(turn: Any) -> Any:
        turn.subagents.report("for the parent", delivery="quiet")
        reported.pass_through(turn.signal)

    rt.models.register("parent", lambda _o: parent)
    rt.models.register("reporter", lambda _o: reporter)
    p = rt.spawn("parent", label="p")
    p.followup("start")
    assert held.wait_reached(10) and reported.wait_reached(10)
    p.cancel("stop", keep_inbox=False)  # the report waits in p's inbox
    reported.release()
    assert p.wait_idle(10)
    p.followup("next")
    assert p.wait_idle(10)
    reports = [e.content for e in _log(rt, p.session_id) if isinstance(e, ReportEvent)]
    assert reports == ["for the parent"]
    rt.wait_idle()


@pytest.mark.parametrize("how", ["cancel", "dispose", "dispose-behaviour"])
def test_a_quiet_report_ahead_of_a_discarded_message_reaches_the_next_turn(
    rt_store: Runtime, how: str
) -> None:
    """A quiet report that reached the parent's context, then a follow-up queued
    behind it, both skipped by a cancel without ``keep_inbox`` (or a dispose, the
    parent resumed after): the discarded follow-up's unrun turn does not take the
    report -- the next turn that runs sees it, and the receipt names that turn.
    It was logged in the unrun turn, and no behaviour ever saw it. Across a
    dispose the durable inbox keeps it (strict), or the checkpoint a top-level
    agent spawned by model name writes at its disposal; only a behaviour-built
    agent under relaxed durability has neither. R-REP-5."""
    rt = rt_store
    gate = Gate("held")
    seen: list[tuple[Any, list[Any]]] = []

    def parent(turn: Any) -> Any:
        if turn.content == "block":
            gate.pass_through(turn.signal)
        seen.append((turn.content, [m.content for m in turn.context]))

    rt.models.register("parent", lambda _o: parent)
    by_model = how != "dispose-behaviour"
    p = rt.spawn("parent" if by_model else parent, label="p")
    sid = p.session_id
    child, _mid = rt.subagents.start_continuable(
        ContinuableStartSpec(parent=p, provider="local", prompt="x", label="kid", model="echo")
    )
    assert rt.wait_idle(10)
    seen.clear()
    p.followup("block")
    assert gate.wait_reached(10)
    report = rt.subagents.report_from(child, "quiet context")
    p.followup("queued")
    if how == "cancel":
        p.cancel("stop", keep_inbox=False)
        gate.release()
        assert p.wait_idle(10)
    else:
        gate.release()
        p.dispose()
        p = rt.agents.resume(sid) if by_model else rt.agents.resume(sid, behaviour=parent)
    p.followup("next")
    assert rt.wait_idle(10)
    receipt = rt.subagents.report_receipt(child, report)
    ends = [e for e in _log(rt, sid) if isinstance(e, TurnEnd)]
    assert receipt.status == "delivered"
    if how != "dispose-behaviour" or rt.sessions.strict:
        assert seen[-1] == ("next", ["quiet context"])
        assert receipt.turn == ends[-1].turn
    else:  # relaxed, nothing keeps it once the agent is gone: its discarded turn logs it
        assert seen[-1] == ("next", [])
        assert [(e.turn, e.error) for e in ends[-2:]] == [
            (receipt.turn, "discarded unrun"),
            (ends[-1].turn, None),
        ]


def test_a_never_signal_run_disposed_at_once_lists(rt_store: Runtime) -> None:
    """The same with the signal that never aborts (``delegate``'s own)."""
    rt = rt_store
    host = rt.spawn("echo", label="host")
    for i in range(10):
        run = rt.subagents.start(
            "local",
            SubagentStartRequest(parent=host, prompt=i, label=f"n{i}", signal=AbortSignal.never()),
        )
        run.dispose()
    listing = rt.subagents.list_children(host.session_id)
    assert (len(listing.rows), listing.diagnostics) == (10, ())


def test_a_quiet_report_to_a_resident_child_outlives_a_relaxed_close(
    backend: Backend, tmp_path: Path
) -> None:
    """Relaxed durability: a child kept resident (its own child busy) gets a quiet
    report, and the runtime closes with nothing queued to discard. The report was
    in no log, checkpoint or turn after: the closing disposal now checkpoints the
    child with the reports no turn saw, and its next turn, in a new runtime, sees
    it. R-REP-5."""
    db = str(tmp_path / "relaxed.db")
    busy = Gate("busy")

    def rec(turn: Any) -> Any:
        if turn.content == "spawn":
            return str(turn.subagents.start_continuable("local", "busy", label="g").child_id)
        if turn.content == "busy":
            busy.pass_through(turn.signal)
        return [m.content for m in turn.context]

    def runtime() -> Runtime:
        rt = Runtime(db, backend=backend, durability="relaxed")
        rt.models.register("rec", lambda _o: rec)
        return rt

    rt = runtime()
    try:
        top = rt.spawn("rec", label="top")
        child, _mid = rt.subagents.start_continuable(
            ContinuableStartSpec(
                parent=top, provider="local", prompt="spawn", label="c", model="rec"
            )
        )
        assert busy.wait_reached(10)  # the grandchild runs: the child stays resident
        assert rt.wait_idle(0) is False
        (grandchild,) = [r.id for r in rt.subagents.list_children(child).rows]
        rt.subagents.report_from(grandchild, "quiet news", delivery="quiet")
    finally:
        rt.close()
    rt = runtime()
    try:
        rt.subagents.followup(top.session_id, child, "next")
        assert rt.wait_idle(10)
        assert rt.sessions.turn_ends(child)[-1].output == ["quiet news"]
        assert "quiet news" in [e.content for e in _log(rt, child) if isinstance(e, ReportEvent)]
    finally:
        rt.close()
