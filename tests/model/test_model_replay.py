"""A model turn a crash cut short runs again (R-DUR): its side-effecting tool calls,
made again with the same arguments at the same place in the turn, take effect
once -- each carries a message id derived from the turn's message, the call's
place and its name and arguments, and the runtime deduplicates by message id.
One child ``w``, one message "more" in it (R-CONT-1, R-FUP)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from replay_script import CHILD, responder
from subagents.actors import Runtime, openai_chat
from subagents.actors._kernel._backend import Backend
from subagents.actors._model._openai import REDELIVERED_NOTE
from subagents.actors.testing import Answer, FakeOpenAI

WORKER = Path(__file__).with_name("model_replay_worker.py")


def test_a_replayed_turn_starts_and_messages_its_child_once(
    backend: Backend, tmp_path: Any
) -> None:
    db = str(tmp_path / "db.sqlite")
    done = subprocess.run(
        [sys.executable, str(WORKER), db, backend.name],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=str(WORKER.parent),
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    sid = done.stdout.split()[0]
    answers = responder(Answer(content="done"))
    with FakeOpenAI(api_key="k", responder=answers) as fake, Runtime(db, backend=backend) as rt:
        rt.models.register(CHILD, lambda _o: lambda turn: "noted")
        rt.models.register("m", openai_chat("gpt-test", base_url=fake.base_url, api_key="k"))
        rt.agents.resume(sid)
        assert rt.wait_idle(20)
        ends = rt.sessions.turn_ends(sid)
        assert [(e.stop_reason, e.output) for e in ends] == [
            ("failed", None),
            ("completed", "done"),
        ]
        rows = rt.subagents.list_children(sid).rows
        assert [r.label for r in rows] == ["w"], rows
        # The model is told its turn runs again, in the replayed turn's requests:
        # in their one system message, first.
        told = [
            [i for i, m in enumerate(r.messages) if REDELIVERED_NOTE in (m["content"] or "")]
            for r in fake.requests
        ]
        assert [0] in told and all(t in ([], [0]) for t in told), told
        assert rt.wait_idle(20)
        outputs = [e.output for e in rt.sessions.turn_ends(rows[0].id)]
        assert outputs == ["noted", "noted"], outputs  # "watch", then "more" once
