"""A rolling upgrade keeps a session's promised messages (``message/expected``):
an older runtime -- one from before promises -- that resumed the session and let
it go wrote a checkpoint without them (it keeps the event verbatim, but not the
checkpoint's ``expected``); this runtime's next activation still delivers the
stand-in of each promise still open, once, from the log behind that checkpoint
(L-8: nothing promised is lost when the activation that held it ends; R-DUR-*:
one store shared by processes of two versions, SQLite and PostgreSQL). The older
runtime's checkpoint row is a recorded fixture (``tests/fixtures/README.md``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from subagents.actors import Runtime, Turn
from subagents.actors._kernel._backend import Backend
from subagents.protocol import unpackb
from subagents.store import open_store

OLDER = Path(__file__).parents[1] / "fixtures" / "checkpoint_older_runtime.msgpack"
PROMISED = "ab" * 16  # the id the fixture's log promises


def _runtime(db: str, backend: Backend, seen: list[Any]) -> Runtime:
    def behaviour(turn: Turn) -> str:
        seen.append(turn.content)
        if turn.content == "promise":
            turn.expect(PROMISED, "STAND-IN")
        return "ok"

    rt = Runtime(db, backend=backend)
    rt.models.register("m", lambda _o: behaviour)
    return rt


def test_a_promise_behind_an_older_runtimes_checkpoint_is_delivered_once(
    db: str, backend: Backend
) -> None:
    seen: list[Any] = []
    with _runtime(db, backend, seen) as rt:
        agent = rt.spawn("m", label="root")
        sid = agent.session_id
        agent.followup("promise")
        assert agent.wait_idle(30)
    # The older runtime resumed the session and closed: its checkpoint, at the same
    # seq, replaced the one that carried the promise.
    store = open_store(db)
    try:
        seq, data = store.get_checkpoint(sid) or (None, b"")
        assert seq == 4 and unpackb(data)["expected"]  # this runtime's kept it
        store.put_checkpoint(sid, 4, OLDER.read_bytes())
    finally:
        store.close()
    for message in ("after", "again"):  # the stand-in comes once, then never again
        with _runtime(db, backend, seen) as rt:
            rt.agents.resume(sid).followup(message)
            assert rt.wait_idle(30)
    assert seen == ["promise", "STAND-IN", "after", "again"]


def test_a_checkpoint_always_says_which_promises_are_open(db: str, backend: Backend) -> None:
    """None open is written as such (an empty ``expected``): a checkpoint without it
    is an older runtime's, whose log is read behind it."""
    seen: list[Any] = []
    with _runtime(db, backend, seen) as rt:
        agent = rt.spawn("m", label="root")
        sid = agent.session_id
        agent.followup("hello")
        assert agent.wait_idle(30)
    store = open_store(db)
    try:
        found = store.get_checkpoint(sid)
    finally:
        store.close()
    assert found is not None and unpackb(found[1])["expected"] == []
