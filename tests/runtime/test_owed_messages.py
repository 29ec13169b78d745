"""Messages a session is owed (``Turn.expect``, ``message/expected``): a promise
counts once its turn ended and does not run again, is kept by the message of its
id, and an activation delivers the stand-in of each one still open, once (L-8:
nothing promised is lost when the activation that held it ends)."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
from subagents.actors import Runtime, Turn
from subagents.actors._agents import KEPT
from subagents.actors._agents._expected import checkpointed, fold_owed, to_checkpoint
from subagents.actors._agents._resume import CUT_SHORT
from subagents.actors._kernel._backend import Backend
from subagents.protocol import (
    ExpectedEvent,
    MessageEvent,
    MessageId,
    MessageSource,
    SessionId,
    TurnEnd,
    TurnStart,
    new_message_id,
)
from subagents.store import LogRecord, MemoryStore

AT = dt.datetime(2026, 1, 2, tzinfo=dt.UTC)
A, B = MessageId("a" * 32), MessageId("b" * 32)
CHILD = SessionId("c" * 32)


def STRICT(mids: tuple[MessageId, ...], end: TurnEnd | None) -> bool:
    """Strict durability: a turn cut short or kept runs again."""
    return end is None or end.error in (CUT_SHORT, KEPT)


def NEVER(mids: tuple[MessageId, ...], end: TurnEnd | None) -> bool:
    """No durable inbox (a memory store): nothing runs again."""
    return False


def _log(*events: Any) -> list[LogRecord]:
    return [LogRecord(seq=n, event=e) for n, e in enumerate(events)]


def _promise(mid: MessageId) -> ExpectedEvent:
    source = MessageSource(kind="child", session_id=CHILD)
    return ExpectedEvent(message_id=mid, content={"stand-in": str(mid)}, source=source)


def _turn(
    n: int, *inside: Any, error: str | None = None, ended: bool = True, of: tuple[Any, ...] = ()
) -> list[Any]:
    end = [TurnEnd(turn=n, at=AT, stop_reason="completed", error=error)] if ended else []
    return [TurnStart(turn=n, at=AT, message_ids=of), *inside, *end]


def test_a_promise_counts_once_its_turn_ended_until_its_message_ran() -> None:
    ran = MessageEvent(message_id=A, content=1)
    log = _log(*_turn(0, _promise(A), _promise(B)), *_turn(1, ran))
    assert list(fold_owed(log, 0, {}, STRICT)) == [B]
    assert fold_owed(log[:3], 0, {}, STRICT) == {}  # its turn has not ended


@pytest.mark.parametrize("error", [CUT_SHORT, KEPT])
def test_a_turn_that_runs_again_makes_its_promises_anew(error: str) -> None:
    log = _log(*_turn(0, _promise(A), error=error))
    assert fold_owed(log, 0, {}, STRICT) == {}
    assert list(fold_owed(log, 0, {}, NEVER)) == [A]  # nothing runs again
    open_turn = _log(*_turn(0, _promise(A), ended=False))
    assert fold_owed(open_turn, 0, {}, STRICT) == {}
    assert list(fold_owed(open_turn, 0, {}, NEVER)) == [A]


def test_relaxed_a_turn_runs_again_where_its_message_is_in_the_inbox() -> None:
    """Under relaxed durability a turn cut short (or kept) runs again only where its
    message came from the durable inbox, still pending there: the fold asks of each
    such turn's own messages (the resume's ``_runs_again`` reads the inbox)."""
    inboxed, plain = MessageId("1" * 32), MessageId("2" * 32)

    def pending(mids: tuple[MessageId, ...], end: TurnEnd | None) -> bool:
        return STRICT(mids, end) and inboxed in mids

    log = _log(
        *_turn(0, _promise(A), error=KEPT, of=(inboxed,)),
        *_turn(1, _promise(B), error=KEPT, of=(plain,)),
    )
    assert list(fold_owed(log, 0, {}, pending)) == [B]


def test_a_fork_seed_promises_nothing_and_a_checkpoint_keeps_what_is_open() -> None:
    log = _log(*_turn(0, _promise(A)), *_turn(1, _promise(B)))
    assert list(fold_owed(log, 3, {}, STRICT)) == [B]  # the first turn is the seed
    kept = checkpointed({"expected": to_checkpoint(fold_owed(log, 0, {}, STRICT))})
    assert kept == {A: _promise(A), B: _promise(B)}
    ran = _log(*_turn(2, MessageEvent(message_id=B, content=2)))
    assert list(fold_owed(ran, 0, kept, STRICT)) == [A]


@pytest.mark.parametrize("kept", [False, True])
def test_an_activation_delivers_the_stand_in_of_an_open_promise_once(
    backend: Backend, kept: bool
) -> None:
    """``kept``: the promised message arrived before the agent went: no stand-in."""
    promised = new_message_id()
    seen: list[Any] = []

    def behaviour(turn: Turn) -> str:
        seen.append((turn.messages[0].message_id, turn.content))
        if turn.content == "promise":
            turn.expect(promised, "the stand-in", MessageSource(kind="host"))
        return "ok"

    with Runtime(MemoryStore(), backend=backend) as rt:
        rt.models.register("b", lambda _o: behaviour)
        agent = rt.spawn("b")
        sid = agent.session_id
        agent.followup("promise")
        if kept:
            agent.followup("the real one", message_id=promised)
        assert agent.wait_idle(20)
        agent.dispose()
        for _ in range(2):  # the second activation delivers nothing more
            rt.agents.resume(sid)
            assert rt.wait_idle(20)
            rt.agents.get(sid).dispose()
    delivered = [content for mid, content in seen if mid == promised]
    assert delivered == (["the real one"] if kept else ["the stand-in"])
