"""A model turn a crash cut short runs again, and its model delegates again: the
one-shot child runs once (L-8: the replay; R-ONE-7: one result). The replayed
``delegate`` carries the message id derived from its place in the turn (as
``start_agent`` does), so the start finds the earlier child: killed *after* that
child's run completed, the call returns its recorded result and nothing runs
again; killed *during* it, the child runs once more -- and one child completed
for the call, not two."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from delegate_script import CHILD, counter, responder
from subagents.actors import Runtime, openai_chat
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Answer, FakeOpenAI

WORKER = Path(__file__).with_name("delegate_replay_worker.py")


def _killed(db: str, backend: Backend, when: str, marks: str) -> str:
    """Run the worker (it SIGKILLs itself ``when``); the agent's session id."""
    done = subprocess.run(
        [sys.executable, str(WORKER), db, backend.name, when, marks],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(WORKER.parent),
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    return done.stdout.split()[0]


def _lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return f.read().split()


@pytest.mark.parametrize("when", ["after", "during"])
def test_a_replayed_turn_delegates_once(backend: Backend, tmp_path: Any, when: str) -> None:
    db, marks = str(tmp_path / "db.sqlite"), str(tmp_path / "marks")
    sid = _killed(db, backend, when, marks)
    worker = _lines(marks)
    assert len(worker) == 1, worker  # the child's run began in the killed process
    with (
        FakeOpenAI(api_key="k", responder=responder(Answer(content="done"))) as fake,
        Runtime(db, backend=backend) as rt,
    ):
        rt.models.register(CHILD, lambda _o: counter(marks))
        rt.models.register("m", openai_chat("gpt-test", base_url=fake.base_url, api_key="k"))
        rt.agents.resume(sid)
        assert rt.wait_idle(20)
        ends = rt.sessions.turn_ends(sid)
        assert [(e.stop_reason, e.output) for e in ends] == [
            ("failed", None),
            ("completed", "done"),
        ]
        results = [
            json.loads(m["content"])
            for r in fake.requests
            for m in r.messages
            if m.get("role") == "tool"
        ]
        assert len(results) == 1, results  # the replayed delegate's result
        (result,) = results
        rows = rt.subagents.list_children(sid).rows
        completed = [
            r.id
            for r in rows
            if [e.stop_reason for e in rt.sessions.turn_ends(r.id)] == ["completed"]
        ]
        assert completed == [result["id"]], (rows, result)
        assert result["stop_reason"] == "completed"
        if when == "after":
            # Its recorded result, as the original call returned it; nothing ran again.
            assert result["output"] == f"counted by {worker[0]}"
            assert _lines(marks) == worker
            assert [r.id for r in rows] == [result["id"]]
        else:
            # Cut short: it ran once more, here; the cut-short child stays, not completed.
            assert result["output"] == f"counted by {os.getpid()}"
            assert _lines(marks) == [*worker, str(os.getpid())]
            assert len(rows) == 2 and all(r.label == "counter" for r in rows)
