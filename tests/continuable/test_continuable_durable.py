"""Accepted means committed, in one process (L-8, L-10's acceptance half, issue 13).

Under strict durability (SQLite, the default) every message a session accepts is
in its durable inbox when the call that accepted it returns, taken off it by the
end of the turn that ran it; a repeated ``message_id`` queues nothing new; what a
closing runtime did not run stays accepted and runs at the next activation, while
what a drain discards leaves the inbox. Crash replay across processes is in
``tests/durability``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from continuable_kit import Kit
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import (
    ErrorCode,
    MessageEvent,
    ReportEvent,
    SessionId,
    SubagentError,
    TurnStart,
    new_message_id,
)
from subagents.store import SqliteStore


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "sessions.db")


@pytest.fixture
def dkit(backend: Backend, db: str) -> Iterator[Kit]:
    """The scripted kit over a strict SQLite runtime."""
    with Runtime(db, backend=backend) as rt:
        k = Kit(rt)
        yield k
        k.close()


def _pending(rt: Runtime, sid: SessionId) -> list[Any]:
    """The durable inbox of ``sid``, read from a second connection to the file."""
    assert isinstance(rt.store, SqliteStore)
    other = SqliteStore(rt.store.path)
    try:
        return [e.event.content for e in other.pending(sid)]
    finally:
        other.close()


def test_a_followup_is_committed_before_it_returns_and_leaves_with_its_turn(
    dkit: Kit,
) -> None:
    """R-FU-1 under L-8: the id ``followup`` returns is in the child's durable inbox
    before the child runs it, and gone once its turn ended."""
    root = dkit.root()
    dkit.start(root, [["block", "g"]])
    cid = dkit.sid("kid")
    assert dkit.script.notes.has("turn", "kid", [["block", "g"]])
    dkit.rt.subagents.followup(root, cid, "queued")  # behind the blocked turn
    assert _pending(dkit.rt, cid) == [[["block", "g"]], "queued"]
    dkit.gate("g").release()
    dkit.wait_settled("kid")
    assert _pending(dkit.rt, cid) == []
    assert dkit.contents("kid") == [[["block", "g"]], "queued"]


def test_a_followup_to_an_absent_child_is_committed_then_resumed(dkit: Kit) -> None:
    """L-8: the cold-resume path commits before it routes; the resumed activation
    runs it once (it is both pending and the delivery)."""
    root = dkit.root()
    dkit.start(root, "hi")
    dkit.wait_settled("kid")
    mid = dkit.rt.subagents.followup(root, dkit.sid("kid"), "again")
    dkit.wait_settled("kid", epochs=2)
    assert dkit.started_ids("kid")[-1] == mid
    assert dkit.contents("kid") == ["hi", "again"]
    assert _pending(dkit.rt, dkit.sid("kid")) == []


def test_a_repeated_followup_id_queues_nothing(dkit: Kit) -> None:
    """Issue 13 point 3: the same ``message_id`` for the same child, resident or
    absent, returns the same id and runs once."""
    root = dkit.root()
    dkit.start(root, "hi")
    cid = dkit.sid("kid")
    mid = new_message_id()
    for _ in range(3):
        assert dkit.rt.subagents.followup(root, cid, "once", message_id=mid) == mid
    dkit.wait_settled("kid")
    assert dkit.rt.subagents.followup(root, cid, "once", message_id=str(mid)) == mid
    dkit.barrier()
    dkit.wait_settled("kid")
    assert dkit.contents("kid") == ["hi", "once"]
    with pytest.raises(SubagentError) as err:
        dkit.rt.subagents.followup(root, cid, "x", message_id="not-an-id")
    assert err.value.code == ErrorCode.INVALID_ARGUMENT


def test_a_repeated_followup_id_is_remembered_across_runtimes(backend: Backend, db: str) -> None:
    """Dedup survives a restart: a second runtime on the file refuses the id too."""
    mid = new_message_id()
    with Runtime(db, backend=backend) as rt:
        k = Kit(rt)
        root = k.root()
        k.start(root, "hi")
        cid = k.sid("kid")
        rt.subagents.followup(root, cid, "once", message_id=mid)
        k.wait_settled("kid")
        root_id = root.session_id
        k.close()
    with Runtime(db, backend=backend) as rt:
        k = Kit(rt)
        root = rt.agents.resume(root_id, behaviour=k.script.factory(None))
        assert rt.subagents.followup(root, cid, "once", message_id=mid) == mid
        rt.sessions.flush()
        contents = [
            r.event.content for r in rt.sessions.read(cid) if isinstance(r.event, MessageEvent)
        ]
        assert contents == ["hi", "once"]
        k.close()


def test_concurrent_followups_with_one_id_run_once(dkit: Kit, backend: Backend) -> None:
    """The race the store decides: eight callers, one id, twenty rounds -- one turn."""
    root = dkit.root()
    dkit.start(root, "hi")
    cid = dkit.sid("kid")
    for round_ in range(20):
        mid = new_message_id()
        results: list[Any] = []

        def send(mid: Any = mid, round_: int = round_, results: list[Any] = results) -> None:
            results.append(dkit.rt.subagents.followup(root, cid, round_, message_id=mid))

        tasks = [backend.spawn(send) for _ in range(8)]
        for t in tasks:
            t.join(30)
        assert results == [mid] * 8
    dkit.wait_settled("kid")
    assert dkit.contents("kid") == ["hi", *range(20)]


def test_an_idempotent_start_returns_the_same_child(dkit: Kit, backend: Backend) -> None:
    """Issue 13 point 3 for ``start_continuable``: concurrent and repeated starts with
    one id create one child (its id derives from the parent and the message id)."""
    root = dkit.root()
    mid = new_message_id()
    spec = ContinuableStartSpec(
        parent=root, provider="local", prompt="p", label="kid", model="cmd", message_id=mid
    )
    handles: list[Any] = []
    tasks = [
        backend.spawn(lambda: handles.append(dkit.rt.subagents.start_continuable(spec)))
        for _ in range(6)
    ]
    for t in tasks:
        t.join(30)
    assert len(set(handles)) == 1 and handles[0].message_id == mid
    cid = handles[0].child_id
    dkit.script.ids["kid"] = cid
    dkit.wait_settled("kid")
    assert dkit.rt.subagents.start_continuable(spec) == handles[0]
    assert dkit.contents("kid") == ["p"]
    assert dkit.epochs("kid") == 1
    other = dkit.rt.subagents.start_continuable(
        ContinuableStartSpec(parent=root, provider="local", prompt="p", label="kid2", model="cmd")
    )
    assert other.child_id != cid


def test_a_report_is_committed_to_the_parents_inbox(dkit: Kit) -> None:
    """L-8 for reports: a quiet report waits in the parent's durable inbox until the
    parent turn that sees it ends; a repeated report id delivers nothing new."""
    root = dkit.root()
    dkit.start(root, [["report", "quiet", "progress"]])
    assert dkit.script.notes.wait_for(lambda items: any(n[0] == "reported" for n in items))
    dkit.wait_settled("kid")
    assert _pending(dkit.rt, root.session_id) == ["progress"]
    root.followup("next")
    assert root.wait_idle(10)
    dkit.rt.sessions.flush()
    assert _pending(dkit.rt, root.session_id) == []
    reports = [e for e in dkit.log(str(root.session_id)) if isinstance(e, ReportEvent)]
    assert [r.content for r in reports] == ["progress"]


def test_a_drain_discards_and_a_close_keeps(backend: Backend, db: str) -> None:
    """What a drain discards leaves the durable inbox; what a closing runtime did not
    run stays accepted and runs, once, at the next activation (issue 13: "even a
    clean exit with queued work"), and the turn it cancelled runs again as a
    redelivery."""
    with Runtime(db, backend=backend) as rt:
        k = Kit(rt)
        root = k.root()
        k.start(root, [["block", "g"]])
        cid = k.sid("kid")
        assert k.script.notes.has("turn", "kid", [["block", "g"]])
        rt.subagents.followup(root, cid, "dropped")
        rt.subagents.drain_continuable_descendants([root])
        k.wait_settled("kid")
        rt.sessions.flush()
        assert _pending(rt, cid) == []
        k.close()
    with Runtime(db, backend=backend) as rt:
        k = Kit(rt)
        top = rt.spawn("cmd", label="top")
        top.followup([["block", "h"]])
        assert k.script.notes.has("turn", "top", [["block", "h"]])
        top.followup("kept")
        top_id = top.session_id
        assert _pending(rt, top_id) == [[["block", "h"]], "kept"]
        rt.close()  # cancels the blocked turn; "kept" never ran
        assert _pending(rt, top_id) == [[["block", "h"]], "kept"]
        k.close()
    with Runtime(db, backend=backend) as rt:
        k = Kit(rt)
        k.gate("h").release()
        top = rt.agents.resume(top_id)  # (the first sweep may have adopted it: handed over)
        assert top.wait_idle(10)
        rt.sessions.flush()
        log = [r.event for r in rt.sessions.read(top_id)]
        starts = [e for e in log if isinstance(e, TurnStart)]
        contents = [e.content for e in log if isinstance(e, MessageEvent)]
        # The cancelled turn runs again, as a redelivery; "kept" runs once.
        assert contents == [[["block", "h"]], [["block", "h"]], "kept"]
        assert [s.redelivered for s in starts] == [False, True, False]
        assert _pending(rt, top_id) == []
        k.close()
