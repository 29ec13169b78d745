"""A repeated ``message_id`` racing its first caller's refusal learns the real outcome.

Under relaxed durability and on a memory store the runtime deduplicates follow-up
ids in memory: the first caller claims the id, and a repeat that finds the claim is
answered with the id (a duplicate, accepted already). The claim used to be made
before the follow-up was accepted -- before the bound was checked, before a cold
child was resumed -- so a repeat racing a first caller that was then refused
(``INBOX_FULL``, a failed resume) was told its message was accepted, though
nothing was and nothing ran. A repeat now waits for the first caller's outcome:
accepted (the id, a duplicate), or refused (it is tried again itself).
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from continuable_kit import CountingStore, Kit, spawn
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, InboxFullError, MessageId, SubagentError
from subagents.store import MemoryStore

CALLERS = 8


@pytest.mark.parametrize("mode", ["memory", "relaxed", "strict"])
def test_repeats_of_one_id_racing_a_refusal_are_all_refused(
    backend: Backend, tmp_path: Path, mode: str, tiny_switch_interval: None
) -> None:
    """Race, 60 rounds: 8 callers released together send one message id to a
    child whose inbox (bounded at one) is full -- its prompt runs, held. Each is
    ``INBOX_FULL``: nothing can be accepted. A caller that found the first one's
    claim of the id was told it was accepted (the id returned) in many rounds,
    relaxed and in memory; nothing of it ever ran. R-BP-*, R-FUP-1."""
    if mode == "memory":
        rt = Runtime(MemoryStore(), backend=backend)
    else:
        rt = Runtime(str(tmp_path / "d.db"), backend=backend, durability=mode)
    kit = Kit(rt)
    try:
        root = kit.root()
        child_id, _ = kit.start(root, [["block", "g"]], label="kid", max_inbox=1)
        assert kit.gate("g").wait_reached(10)
        sub = rt.subagents
        for rnd in range(60):
            mid = MessageId(uuid.uuid4().hex)
            go = rt.backend.event()
            outcomes: list[Any] = []

            def send(
                out: list[Any] = outcomes, go: Any = go, mid: MessageId = mid, rnd: int = rnd
            ) -> None:
                assert go.wait(10)
                try:
                    out.append(sub.followup(root, child_id, f"dup{rnd}", message_id=mid))
                except InboxFullError:
                    out.append("full")

            tasks = [spawn(rt, send) for _ in range(CALLERS)]
            go.set()
            for task in tasks:
                task.result(30)
            assert outcomes == ["full"] * CALLERS, (rnd, outcomes)
        kit.gate("g").release()
        kit.wait_settled("kid")
        assert kit.contents("kid") == [[["block", "g"]]]
    finally:
        kit.close()
        rt.close()


class _FailingRead(CountingStore):
    """Fails one read of ``target``'s log once ``armed``, after ``gate`` lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.target: Any = None
        self.armed = False
        self.gate: Any = None

    def read(self, session_id: Any, from_seq: int = 0) -> Any:
        if self.armed and session_id == self.target:
            self.armed = False
            self.gate.pass_through()
            raise SubagentError("the disk hiccuped", code=ErrorCode.CORRUPT_RECORD)
        return super().read(session_id, from_seq)


def test_a_repeat_racing_a_failed_cold_resume_is_not_told_accepted(backend: Backend) -> None:
    """Race, 8 rounds, memory store: the first follow-up of an id to a settled child
    is held in the child's cold resume (reading its log) and then fails; a second
    follow-up of the same id, started while the first is held, returned the id at
    once -- a message accepted, as it said -- though the first caller's failure
    accepted nothing and nothing ran. Now the repeat waits for that failure, then
    is accepted itself: its id is returned and its turn runs, once. R-FUP-1,
    R-FUP-8, R-FUP-14."""
    store = _FailingRead()
    with Runtime(store, backend=backend) as rt:
        kit = Kit(rt)
        try:
            root = kit.root()
            sub = rt.subagents
            for rnd in range(8):
                label = f"kid{rnd}"
                child_id, _ = kit.start(root, "hello", label=label)
                kit.wait_settled(label)
                gate = kit.gate(f"read{rnd}")
                store.target, store.gate, store.armed = child_id, gate, True
                mid = MessageId(uuid.uuid4().hex)
                first = spawn(
                    rt, lambda c=child_id, m=mid: sub.followup(root, c, "once", message_id=m)
                )
                assert gate.wait_reached(10)
                going = rt.backend.event()

                def repeat(cid: Any = child_id, mid: MessageId = mid, going: Any = going) -> Any:
                    going.set()
                    return sub.followup(root, cid, "once", message_id=mid)

                second = spawn(rt, repeat)
                assert going.wait(10)
                gate.release()
                err = first.error(30)
                assert isinstance(err, SubagentError) and err.code == ErrorCode.CORRUPT_RECORD
                assert second.result(30) == mid
                kit.wait_settled(label)
                assert kit.contents(label) == ["hello", "once"], rnd
        finally:
            kit.close()
