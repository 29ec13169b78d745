"""A background ``delegate``'s result outlives the process that ran it: when the
process stops before the run ended -- SIGKILL, or ``close()`` -- the parent's
next activation, in another process, delivers one ``delegate_result`` saying the
run stopped (``CANCELLED``), which the model reads; a result delivered before the
stop is not delivered again, nor stood in for (R-ONE-7: one result per run; L-8:
what was accepted is not lost across a crash; R-DUR-*: across processes, on
SQLite and PostgreSQL).

The worker (:mod:`background_worker`) starts two background runs, lets the fast
one's result reach the agent and stops while the slow one runs."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from background_script import FAST, GOT, SLOW, STARTED, fast, responder, results_in, slow
from subagents.actors import AbortController, Runtime, SubagentStartRequest, openai_chat
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import FakeOpenAI
from subagents.protocol import ErrorCode
from subagents.store import MemoryStore

WORKER = Path(__file__).with_name("background_worker.py")


def _stopped(db: str, backend: Backend, stop: str, when: str) -> str:
    """Run the worker until it stops (``kill``: SIGKILLed); the agent's session id."""
    done = subprocess.run(
        [sys.executable, str(WORKER), db, backend.name, stop, when],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=str(WORKER.parent),
    )
    expected = -signal.SIGKILL if stop == "kill" else 0
    assert done.returncode == expected, done.stderr[-3000:]
    return done.stdout.split()[0]


def _resumed(db: str, backend: Backend, sid: str) -> tuple[list[Any], list[Any], dict[str, str]]:
    """Resume the agent in this process and let it run what it has: the results its
    model read, its turns' ends, and its children's labels by id."""
    with (
        FakeOpenAI(api_key="k", responder=responder()) as fake,
        Runtime(db, backend=backend) as rt,
    ):
        never = rt.backend.event()  # no child runs here: a run again would block
        rt.models.register(FAST, lambda _o: fast(never))
        rt.models.register(SLOW, lambda _o: slow)
        rt.models.register("m", openai_chat("gpt-test", base_url=fake.base_url, api_key="k"))
        rt.agents.resume(sid)
        assert rt.wait_idle(30)
        results = [r for request in fake.requests for r in results_in(request)]
        ends = [(e.stop_reason, e.output) for e in rt.sessions.turn_ends(sid)]
        labels = {str(row.id): row.label for row in rt.subagents.list_children(sid).rows}
    return results, ends, labels


STOPS = [("kill", "ran"), ("kill", "delivered"), ("close", "ran")]


@pytest.mark.parametrize(("stop", "when"), STOPS)
def test_a_background_run_its_process_stopped_is_reported_once(
    backend: Backend, db: str, stop: str, when: str
) -> None:
    sid = _stopped(db, backend, stop, when)
    results, ends, labels = _resumed(db, backend, sid)
    by_label = {label: cid for cid, label in labels.items()}
    assert set(by_label) == {FAST, SLOW}, labels  # no child was started again
    lost = [r for r in results if r["id"] == by_label[SLOW]]
    assert lost == [
        {
            "id": by_label[SLOW],
            "stop_reason": "cancelled",
            "output": None,
            "error": {"code": ErrorCode.CANCELLED, "message": lost[0]["error"]["message"]},
        }
    ], results
    assert "process stopped" in lost[0]["error"]["message"]
    if when == "ran":
        # The fast result's turn ended before the stop: nothing of it again.
        assert results == lost
        assert ends == [("completed", STARTED), ("completed", GOT), ("completed", GOT)]
    else:
        # Its turn was cut short: it runs again here, the real result, not a stand-in.
        real = [r for r in results if r["id"] == by_label[FAST]]
        assert [(r["stop_reason"], r["output"]) for r in real] == [("completed", "fast done")]
        assert len(results) == 2, results
        assert ends[0] == ("completed", STARTED) and ends[-2:] == [("completed", GOT)] * 2
    # A later activation delivers nothing more: each promise was kept once.
    again, ends_again, _labels = _resumed(db, backend, sid)
    assert again == [] and ends_again == ends


def test_a_one_shot_child_the_runtime_closed_does_not_say_it_runs_again(
    backend: Backend, tmp_path: Any
) -> None:
    """The closing runtime cancels a one-shot child's run for good: its turn's end
    says so, not that its messages run again (its prompt is in no inbox and
    nothing resumes a one-shot child). The run's own signal is never aborted
    here: only the close cancels it."""
    db = str(tmp_path / "db.sqlite")
    with Runtime(db, backend=backend) as rt:
        started = rt.backend.event()

        def child(turn: Any) -> str:
            started.set()
            return slow(turn)

        rt.models.register(SLOW, lambda _o: child)
        request = SubagentStartRequest(
            parent=rt.spawn("echo"), prompt="work", model=SLOW, signal=AbortController().signal
        )
        run = rt.subagents.start("local", request)
        assert started.wait(30)  # its turn runs when the runtime closes
    with Runtime(db, backend=backend) as rt:
        (end,) = rt.sessions.turn_ends(run.id)
    assert end.stop_reason == "cancelled"
    assert end.error is not None and "does not run again" in end.error, end.error


@pytest.mark.parametrize("store", ["memory", "relaxed"])
def test_a_disposed_agents_background_run_is_reported_at_its_next_activation(
    backend: Backend, tmp_path: Any, store: str
) -> None:
    """Disposing the agent cancels its background runs and delivers none of their
    results; its next activation in this runtime says the run stopped, once --
    also where no durable inbox remembers ids (a memory store, relaxed durability)."""
    where = MemoryStore() if store == "memory" else str(tmp_path / "db.sqlite")
    with (
        FakeOpenAI(api_key="k", responder=responder()) as fake,
        Runtime(where, backend=backend, durability="relaxed") as rt,
    ):
        gate = rt.backend.event()
        gate.set()
        rt.models.register(FAST, lambda _o: fast(gate))
        rt.models.register(SLOW, lambda _o: slow)
        rt.models.register("m", openai_chat("gpt-test", base_url=fake.base_url, api_key="k"))
        agent = rt.spawn("m", label="root")
        sid = agent.session_id
        agent.followup("start both")
        assert fake.wait_requests(3, 30)  # the fast result's turn
        assert agent.wait_idle(30)
        agent.dispose()  # the slow run is cancelled with it
        labels = {r.label: str(r.id) for r in rt.subagents.list_children(sid).rows}
        rt.agents.resume(sid)
        assert rt.wait_idle(30)
        results = [r for request in fake.requests for r in results_in(request)]
        assert [(r["id"], r["stop_reason"]) for r in results] == [
            (labels[FAST], "completed"),
            (labels[SLOW], "cancelled"),
        ]
        assert results[1]["error"]["code"] == ErrorCode.CANCELLED
        rt.agents.get(sid).dispose()
        rt.agents.resume(sid)
        assert rt.wait_idle(30)
        assert len(fake.requests) == 4  # nothing more: the stand-in ran
