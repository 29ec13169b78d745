"""A turn's history around a damaged log row, on both backends and both stores.

An agent brought back around a row that does not decode -- resumed with
``damaged="skip"``, or normally when the row sits behind its checkpoint --
runs its later turns: ``turn.history`` holds the rows that decode, in order,
the damaged one left out (logged once per agent, naming its seq), where every
later turn used to fail ``CORRUPT_RECORD`` before the behaviour (or the model)
was asked. A session whose damage nobody accepted still refuses a resume.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from pgcluster import outside_sql
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import FakeOpenAI
from subagents.protocol import (
    AgentOptionsEvent,
    ErrorCode,
    Event,
    MessageEvent,
    SessionId,
    SubagentDescriptorEvent,
    SubagentError,
    TurnStart,
)
from subagents.store import open_store

pytestmark = pytest.mark.timeout(90)

GARBAGE = b"\xc1\xc1"  # 0xc1 is never used by msgpack


class Recorder:
    """A behaviour that keeps each turn's history and answers with its content."""

    def __init__(self) -> None:
        self.histories: dict[Any, tuple[Event, ...]] = {}

    def __call__(self, turn: Any) -> Any:
        self.histories[turn.content] = turn.history
        return turn.content


def _damage(db: str, sid: SessionId, seq: int, *, checkpoint: bool) -> None:
    """Garble the event at ``seq``; without ``checkpoint`` take the session's
    checkpoint away too (as a crash leaves none): a resume then reads the row."""
    n = outside_sql(
        db, "UPDATE events SET body = ? WHERE session = ? AND seq = ?", GARBAGE, sid.to_bytes(), seq
    )
    assert n == 1
    if not checkpoint:
        assert outside_sql(db, "DELETE FROM checkpoints WHERE session = ?", sid.to_bytes()) == 1


def _build(db: str, backend: Backend, register: Any, model: str) -> tuple[SessionId, int]:
    """A top-level agent of ``model`` with two finished turns (its disposal at the
    runtime's close checkpoints it); the seq of its first ``message`` event."""
    with Runtime(db, backend=backend) as rt:
        register(rt)
        agent = rt.spawn(model, label="victim")
        agent.followup("first")
        agent.followup("second")
        assert agent.wait_idle(20)
        rt.sessions.flush()
        records = rt.sessions.read(agent.session_id)
    seq = next(r.seq for r in records if isinstance(r.event, MessageEvent))
    return agent.session_id, seq


def _expected(db: str, sid: SessionId, before: str) -> tuple[list[Event], list[int]]:
    """The model history the store holds before the turn of the message
    ``before`` (its ``turn/start``): the events of the rows that decode, in
    order; and the seqs that do not."""
    with open_store(db) as store:
        rows = list(store.scan(sid))
    good = [r for r in rows if not isinstance(r, SubagentError)]
    mid = next(
        r.event.message_id
        for r in good
        if isinstance(r.event, MessageEvent) and r.event.content == before
    )
    cut = next(r.seq for r in good if isinstance(r.event, TurnStart) and mid in r.event.message_ids)
    events = [
        r.event
        for r in good
        if r.seq < cut and not isinstance(r.event, (SubagentDescriptorEvent, AgentOptionsEvent))
    ]
    return events, [r.seq for r in rows if isinstance(r, SubagentError)]


def _messages(history: Any) -> list[Any]:
    return [e.content for e in history if isinstance(e, MessageEvent)]


def _history_warnings(caplog: pytest.LogCaptureFixture, seq: int) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING
        and "history" in r.getMessage()
        and f"seq {seq}" in r.getMessage()
    ]


def test_a_turn_after_a_skip_resume_reads_the_rows_that_decode(
    backend: Backend, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """R-ERR-1, R-FUP-8: refused by an ordinary resume (the damage is past any
    checkpoint), the session resumed with ``damaged="skip"`` runs its next turns;
    each turn's history is the log's decodable rows before it, in order, the
    damaged row absent (the log-only records too: R-DESC-7)."""
    rec = Recorder()

    def register(rt: Runtime) -> None:
        rt.models.register("hist", lambda _o: rec, replace=True)

    sid, seq = _build(db, backend, register, "hist")
    _damage(db, sid, seq, checkpoint=False)
    with Runtime(db, backend=backend) as rt:
        register(rt)
        with pytest.raises(SubagentError) as info:
            rt.agents.resume(sid)  # nobody accepted the damage: still refused
        assert info.value.code == ErrorCode.CORRUPT_RECORD
        agent = rt.agents.resume(sid, damaged="skip")
        assert agent.damaged_seqs == (seq,)
        agent.followup("third")
        agent.followup("fourth")
        assert agent.wait_idle(20)
    expected, damaged = _expected(db, sid, "third")
    assert damaged == [seq]
    assert list(rec.histories["third"]) == expected
    assert _messages(rec.histories["third"]) == ["second"]
    assert _messages(rec.histories["fourth"]) == ["second", "third"]
    assert _expected(db, sid, "fourth")[0] == list(rec.histories["fourth"])


def test_a_turn_after_damage_behind_the_checkpoint_reads_the_rows_that_decode(
    backend: Backend, db: str, caplog: pytest.LogCaptureFixture
) -> None:
    """R-ERR-1, R-FUP-8: a row damaged behind the checkpoint does not stop an
    ordinary resume, nor the turns after it: their history leaves the row out,
    and the damage is logged once for the agent (naming the seq), not each turn."""
    rec = Recorder()

    def register(rt: Runtime) -> None:
        rt.models.register("hist", lambda _o: rec, replace=True)

    sid, seq = _build(db, backend, register, "hist")
    _damage(db, sid, seq, checkpoint=True)
    caplog.set_level(logging.WARNING, logger="subagents")
    with Runtime(db, backend=backend) as rt:
        register(rt)
        agent = rt.agents.resume(sid)
        assert agent.damaged_seqs == ()
        for content in ("third", "fourth", "fifth"):
            agent.followup(content)
        assert agent.wait_idle(20)
    expected, damaged = _expected(db, sid, "third")
    assert damaged == [seq]
    assert list(rec.histories["third"]) == expected
    assert _messages(rec.histories["fifth"]) == ["second", "third", "fourth"]
    assert len(_history_warnings(caplog, seq)) == 1, caplog.text


@pytest.mark.parametrize("case", ["skip", "behind-checkpoint"])
def test_a_model_agent_resumed_around_damage_asks_its_model(
    backend: Backend, db: str, case: str
) -> None:
    """R-ERR-1, R-FUP-8: an ``openai_chat`` agent resumed around a damaged message
    row completes its next turn, and the request its model gets holds the
    messages that survive (the damaged one's left out)."""
    with FakeOpenAI(api_key="test-key") as fake:

        def register(rt: Runtime) -> None:
            from subagents.actors import openai_chat

            rt.models.register(
                "m", openai_chat("gpt-test", base_url=fake.base_url, api_key="test-key")
            )

        sid, seq = _build(db, backend, register, "m")
        _damage(db, sid, seq, checkpoint=case != "skip")
        with Runtime(db, backend=backend) as rt:
            register(rt)
            if case == "skip":
                agent = rt.agents.resume(sid, damaged="skip")
                assert agent.damaged_seqs == (seq,)
            else:
                agent = rt.agents.resume(sid)
            before = len(fake.requests)
            agent.followup("third")
            assert agent.wait_idle(20)
            rt.sessions.flush()
            asked = fake.requests[before:]
        with open_store(db) as store:
            ends = [
                r.event
                for r in store.scan(sid)
                if not isinstance(r, SubagentError) and type(r.event).__name__ == "TurnEnd"
            ]
    assert ends[-1].stop_reason == "completed", ends[-1].error
    assert ends[-1].output == "echo: third"
    assert len(asked) == 1
    sent = asked[0].messages
    assert [m["content"] for m in sent if m["role"] == "user"] == ["second", "third"]
    assert [m["content"] for m in sent if m["role"] == "assistant"] == [
        "echo: first",
        "echo: second",
    ]
