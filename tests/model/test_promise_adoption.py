"""A background ``delegate``'s promise is kept in every crash shape (L-8: nothing
promised is lost when the process holding it dies; R-ONE-7: one result per run;
R-DUR-*: across processes, SQLite and PostgreSQL).

* A parent SIGKILLed right after the turn that started its runs ended has no
  inbox rows; its open promises are accepted work all the same, so a surviving
  runtime's sweep adopts it -- a top-level parent from its recorded model, a
  continuable child through its parent -- and the model hears, once per run,
  that the run stopped, without anyone resuming it.
* A run that completed, its result lost with the process as it was being
  delivered, has its real result delivered (read from its child's log, under
  the result's own id), not a stand-in saying it stopped.

The worker (:mod:`promise_worker`) is the process that dies."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from background_script import FAST, SLOW, fast, responder, results_in, slow
from subagents.actors import Runtime, openai_chat
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import FakeOpenAI
from subagents.protocol import ErrorCode, MessageEvent

WORKER = Path(__file__).with_name("promise_worker.py")
TTL = 1.5  # the dead worker's leases lapse soon; the sweep looks every TTL / 3


def _killed(db: str, backend: Backend, shape: str) -> str:
    """Run the worker until it is SIGKILLed; the session id of the runs' parent."""
    done = subprocess.run(
        [sys.executable, str(WORKER), db, backend.name, shape, str(TTL)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(WORKER.parent),
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    return done.stdout.split()[0]


def _runtime(db: str, backend: Backend, fake: FakeOpenAI, *, runs: bool = False) -> Runtime:
    """A runtime on ``db``; ``runs``: its runs run (both until cancelled), else none
    does (a run again would block)."""
    rt = Runtime(db, backend=backend, lease_ttl=TTL)
    never = rt.backend.event()
    rt.models.register(FAST, lambda _o: slow if runs else fast(never))
    rt.models.register(SLOW, lambda _o: slow)
    rt.models.register("m", openai_chat("gpt-test", base_url=fake.base_url, api_key="k"))
    rt.models.register("root", lambda _o: lambda turn: "root again")
    return rt


def _results(fake: FakeOpenAI) -> list[dict[str, Any]]:
    return [r for request in fake.requests for r in results_in(request)]


def _labels(rt: Runtime, sid: str) -> dict[str, str]:
    return {row.label: str(row.id) for row in rt.subagents.list_children(sid).rows}


@pytest.mark.parametrize("shape", ["root", "child"])
def test_a_parent_killed_with_runs_under_way_is_adopted_and_told(
    backend: Backend, db: str, shape: str
) -> None:
    sid = _killed(db, backend, shape)
    with (
        FakeOpenAI(api_key="k", responder=responder()) as fake,
        _runtime(db, backend, fake) as rt,
    ):
        # Nobody resumes it: the sweep finds it owed (its holder dead) and adopts it.
        assert fake.wait_requests(2, 60), "the parent was never adopted"
        assert rt.wait_idle(30)
        results = _results(fake)
        labels = _labels(rt, sid)
        assert set(labels) == {FAST, SLOW}  # no child was started again
        assert sorted(r["id"] for r in results) == sorted(labels.values()), results
        for r in results:
            assert (r["stop_reason"], r["output"]) == ("cancelled", None)
            assert r["error"]["code"] == ErrorCode.CANCELLED
            assert "process stopped" in r["error"]["message"]
        rt.sessions.flush()
    # Each promise was kept once: nothing is owed, nothing left to adopt or deliver.
    with (
        FakeOpenAI(api_key="k", responder=responder()) as fake,
        _runtime(db, backend, fake) as rt,
    ):
        assert rt.store.owed(sid) == [] and rt.sessions.pending(sid) == []
        assert sid not in rt.sessions.orphans()
        if shape == "root":
            rt.agents.resume(sid)
            assert rt.wait_idle(30)
        assert _results(fake) == []


def test_a_run_that_completed_as_its_result_was_lost_delivers_that_result(
    backend: Backend, db: str
) -> None:
    sid = _killed(db, backend, "delivering")
    with (
        FakeOpenAI(api_key="k", responder=responder()) as fake,
        _runtime(db, backend, fake) as rt,
    ):
        rt.agents.resume(sid)
        assert fake.wait_requests(2, 60)
        assert rt.wait_idle(30)
        labels = _labels(rt, sid)
        by_id = {r["id"]: r for r in _results(fake)}
        assert set(by_id) == {labels[FAST], labels[SLOW]}, by_id
        # The fast run's real result, as its delivery would have said it.
        assert by_id[labels[FAST]] == {
            "id": labels[FAST],
            "stop_reason": "completed",
            "output": "fast done",
        }
        assert by_id[labels[SLOW]]["stop_reason"] == "cancelled"  # it did not end
        rt.sessions.flush()
        messages = [r.event for r in rt.store.read(sid) if isinstance(r.event, MessageEvent)]
        fast_result = [m for m in messages if labels[FAST] in str(m.content)]
        (promise,) = [
            e
            for r in rt.store.read(sid)
            if type(e := r.event).__name__ == "ExpectedEvent" and labels[FAST] in str(e.source)
        ]
        # Under the result's own id, from the run.
        assert [m.message_id for m in fast_result] == [promise.message_id]
        assert fast_result[0].source is not None
        assert str(fast_result[0].source.session_id) == labels[FAST]


def test_a_disposed_parent_is_left_alone_and_a_closed_one_is_adopted(
    backend: Backend, db: str
) -> None:
    """A disposal is the owner's: the store forgets its promises (no sweep brings
    the agent back for them; its next activation still delivers their stand-ins).
    A closing runtime keeps them, as it keeps accepted messages: the next
    runtime's sweep adopts the agent and tells its model."""
    with FakeOpenAI(api_key="k", responder=responder()) as fake:
        with _runtime(db, backend, fake, runs=True) as rt:
            disposed, closed = rt.spawn("m", label="disposed"), rt.spawn("m", label="closed")
            for agent in (disposed, closed):
                agent.followup("start both")
            assert fake.wait_requests(4, 30)
            assert disposed.wait_idle(30) and closed.wait_idle(30)  # (their runs run on)
            rt.sessions.flush()
            assert len(rt.store.owed(disposed.session_id)) == 2
            disposed.dispose()
            assert rt.store.owed(disposed.session_id) == []
        with _runtime(db, backend, fake) as rt:
            assert len(rt.store.owed(closed.session_id)) == 2
            assert fake.wait_requests(6, 60), "the closed agent was never adopted"
            assert rt.wait_idle(30)
            assert rt.agents.get(disposed.session_id) is None
            told = [r for request in fake.requests[4:] for r in results_in(request)]
            closed_runs = _labels(rt, closed.session_id).values()
            assert sorted(r["id"] for r in told) == sorted(closed_runs)
