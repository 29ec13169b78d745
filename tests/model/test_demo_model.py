"""``subagents demo --model NAME`` against the fake server (issue 16 point 5): the
model, reached through ``OPENAI_BASE_URL``, builds the demo tree with its tools; a
second run resumes it; without ``--model`` no key is needed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from subagents.actors._kernel._backend import Backend
from subagents.actors._shell._cli import main
from subagents.actors.testing import Answer, FakeCall, FakeOpenAI, FakeRequest


def _lead(request: FakeRequest) -> Answer:
    """A stand-in for a model that follows the lead's system prompt."""
    messages = request.messages
    last = messages[-1]
    if last["role"] == "user" and "Follow up" in last["content"]:
        return Answer(tool_calls=[FakeCall("list_agents", {})])
    if last["role"] == "user":
        return Answer(
            tool_calls=[
                FakeCall(
                    "start_agent",
                    {"prompt": "pykka", "label": "researcher-A", "model": "researcher"},
                ),
                FakeCall(
                    "start_agent", {"prompt": "OTP", "label": "researcher-B", "model": "researcher"}
                ),
                FakeCall(
                    "delegate", {"prompt": "year of OTP", "label": "lookup", "model": "lookup"}
                ),
            ]
        )
    result = json.loads(last["content"])
    if "agents" in result:
        return Answer(
            tool_calls=[
                FakeCall("send_message", {"id": row["id"], "content": "one more detail?"})
                for row in result["agents"]
                if row["mode"] == "continuable"
            ]
        )
    return Answer(content="The team is on it.")


def _responder(request: FakeRequest) -> Answer:
    system = request.messages[0]["content"] if request.messages else ""
    if system.startswith("You lead"):
        return _lead(request)
    return Answer(content=f"answer to {request.messages[-1]['content'][:40]}")


def test_demo_with_a_model_builds_then_resumes(
    tmp_path: Path, backend: Backend, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FakeOpenAI(responder=_responder) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        monkeypatch.setenv("OPENAI_API_KEY", "test-key")
        db = str(tmp_path / "demo.db")
        assert main(["demo", "--db", db, "--backend", backend.name, "--model", "gpt-x"]) == 0
        first = capsys.readouterr().out
        assert "gpt-x builds one" in first
        for label in ("researcher-A", "researcher-B", "lookup"):
            assert label in first
        assert "created: 4 sessions" in first
        asked = len(fake.requests)
        sent = [
            r
            for r in fake.requests
            if r.messages and "one more detail?" in r.messages[-1]["content"]
        ]
        assert len(sent) == 2  # each researcher got the lead's follow-up
        assert all(r.body["model"] == "gpt-x" for r in fake.requests)
        assert main(["demo", "--db", db, "--backend", backend.name, "--model", "gpt-x"]) == 0
        second = capsys.readouterr().out
        assert "cold-resumed researcher-A" in second and "resumed: 4 sessions" in second
        assert len(fake.requests) > asked


def test_demo_with_a_model_but_no_key_is_one_line(
    tmp_path: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code = main(["demo", "--db", str(tmp_path / "d.db"), "--model", "gpt-x"])
    assert code == 2
    assert "OPENAI_API_KEY" in capsys.readouterr().err


def test_model_tree_example_runs_offline(tmp_path: Path) -> None:
    """``examples/model_tree.py --offline``: the model-driven example on the fake server."""
    example = Path(__file__).resolve().parents[2] / "examples" / "model_tree.py"
    out = subprocess.run(
        [sys.executable, str(example), str(tmp_path / "tree.db"), "--offline"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "mailboxes (continuable" in out.stdout and "supervision (continuable" in out.stdout
    assert "root: started 2 researchers [completed, usage {'prompt_tokens'" in out.stdout


def test_a_model_demo_that_reached_no_model_fails_then_goes_on(
    tmp_path: Path, backend: Backend, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model API that refuses the root's request: the demo says so and exits 1
    (it exited 0, "created: 1 sessions", and later runs only resumed that root);
    a later run with the API back gives the root its task again."""
    db = str(tmp_path / "demo.db")
    argv = ["demo", "--db", db, "--backend", backend.name, "--model", "gpt-x"]
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    with FakeOpenAI(responder=lambda _r: Answer(status=400, error="no such model")) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        assert main(argv) == 1
        out = capsys.readouterr().out
        assert "the root's last turn failed" in out and "no such model" in out
    with FakeOpenAI(responder=_responder) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        assert main(argv) == 0
        again = capsys.readouterr().out
        assert "has no answer yet: gpt-x goes on" in again
        assert "created: 4 sessions" in again


def test_a_scripted_demo_resumes_a_tree_a_model_built(
    tmp_path: Path, backend: Backend, capsys: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree ``--model`` built does not have the scripted first run's shape: a
    scripted run resumes it (it took it for unfinished and deleted it)."""
    db = str(tmp_path / "demo.db")
    monkeypatch.setenv("OPENAI_API_KEY", "test-key")
    with FakeOpenAI(responder=_responder) as fake:
        monkeypatch.setenv("OPENAI_BASE_URL", fake.base_url)
        assert main(["demo", "--db", db, "--backend", backend.name, "--model", "gpt-x"]) == 0
    capsys.readouterr()
    assert main(["demo", "--db", db, "--backend", backend.name]) == 0
    out = capsys.readouterr().out
    assert "resuming it" in out and "unfinished" not in out
    assert "researcher-A" in out and "resumed: 4 sessions" in out
