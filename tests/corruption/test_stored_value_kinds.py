"""Stored values of the wrong kind stay local to their session (SQLite).

SQLite keeps whatever a column is given: a damaged file, or one another program
wrote, may hold text where the store wrote an integer, a number where it wrote
bytes, an integer no 64 bits can follow. Each is a typed error of its own
session (``CORRUPT_RECORD``) -- never a ``TypeError``, ``ValueError``,
``OverflowError`` or ``MemoryError`` out of a public call, a traceback from the
CLI, or the failure of another session's write that shared its group commit.
"""

from __future__ import annotations

import datetime as dt
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from pgcluster import outside_sql
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors._shell._cli import main
from subagents.protocol import (
    ErrorCode,
    MessageEvent,
    SessionHeader,
    SessionId,
    SubagentError,
    new_message_id,
    new_session_id,
)
from subagents.store import SqliteStore, open_store

pytestmark = pytest.mark.timeout(120)

_INT64_MAX = 2**63 - 1


def _sql(db: Path, script: str, *params: Any) -> None:
    conn = sqlite3.connect(db)
    try:
        if params:
            conn.execute(script, params)
        else:
            conn.executescript(script)
        conn.commit()
    finally:
        conn.close()


def _event() -> MessageEvent:
    return MessageEvent(message_id=new_message_id(), content="more")


def test_a_damaged_session_fails_only_its_own_write_in_a_shared_batch(tmp_path: Path) -> None:
    """R-ERR-1: one ``write_many`` batch appends to A, whose last seq is at the
    64-bit limit, and to a healthy B. A's append fails ``CORRUPT_RECORD``; B's
    commits. The whole batch used to fail with a bare ``OverflowError``. Then
    20 rounds of two threads appending to A and B at once: B never fails."""
    import threading

    path = tmp_path / "s.db"
    now = dt.datetime.now(dt.UTC)
    with SqliteStore(str(path)) as store:
        a, b = new_session_id(), new_session_id()
        for sid in (a, b):
            store.create_session(
                SessionHeader(
                    id=sid, parent_session=None, origin="user", delegation_depth=0, created_at=now
                )
            )
            store.append(sid, [_event()])
    _sql(path, "UPDATE events SET seq = ? WHERE session = ?", _INT64_MAX, a.to_bytes())
    with SqliteStore(str(path)) as store:
        out = store.write_many([("append", a, [_event()]), ("append", b, [_event()])])
        assert isinstance(out[0], SubagentError) and out[0].code == ErrorCode.CORRUPT_RECORD
        assert out[1] == [1]
        results: dict[str, Any] = {}
        for _ in range(20):
            barrier = threading.Barrier(2)

            def go(name: str, sid: Any, barrier: Any = barrier) -> None:
                barrier.wait()
                try:
                    results[name] = store.append(sid, [_event()])
                except Exception as exc:  # the outcome is the test
                    results[name] = exc

            threads = [threading.Thread(target=go, args=x) for x in (("A", a), ("B", b))]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            assert isinstance(results["B"], list), results["B"]
            assert isinstance(results["A"], SubagentError), results["A"]
            assert results["A"].code == ErrorCode.CORRUPT_RECORD
        assert len(store.read(b)) == 22


def _worker(turn: Any) -> Any:
    return f"worked {turn.content}"


def _boss(turn: Any) -> Any:
    if turn.content == "hire":
        cid, _ = turn.subagents.start_continuable("local", "x", label="kid", model="worker")
        return str(cid)
    return "ok"


def _register(rt: Runtime) -> None:
    rt.models.register("worker", lambda _o: _worker, replace=True)
    rt.models.register("boss", lambda _o: _boss, replace=True)


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str, str]:
    """A store with two trees (root and a child each, a few turns); the damage
    goes to the first: the other stays healthy."""
    path = tmp_path_factory.mktemp("kinds") / "base.db"
    ids = []
    with Runtime(str(path)) as rt:
        _register(rt)
        for label in ("root", "other"):
            root = rt.spawn("boss", label=label)
            root.followup("hire")
            assert rt.wait_idle(10)
            kid = rt.sessions.turn_ends(root.session_id)[-1].output
            rt.subagents.followup(root, kid, "t1")
            root.followup("hello")
            assert rt.wait_idle(10)
            ids.append((root.session_id, kid))
    (root_id, kid), (other, _) = ids
    return path, root_id.to_bytes().hex(), kid, str(other)


_LAST_INBOX = "n = (SELECT max(n) FROM inbox WHERE session = x'{R}')"
CASES = {
    "checkpoint seq text": (
        "UPDATE checkpoints SET seq = 'abc' WHERE session = x'{K}'",
        "followup",
    ),
    "checkpoint data text": (
        "UPDATE checkpoints SET data = 'zz' WHERE session = x'{K}'",
        "followup",
    ),
    "checkpoint next_turn text": ("checkpoint:next_turn", "followup"),
    "checkpoint context no list": ("checkpoint:context", "followup"),
    "inbox epoch text": (
        f"UPDATE inbox SET done = 0, epoch = 'e' WHERE session = x'{{R}}' AND {_LAST_INBOX}",
        "resume",
    ),
    "inbox n text": (
        f"UPDATE inbox SET done = 0, n = 'q' WHERE session = x'{{R}}' AND {_LAST_INBOX}",
        "resume",
    ),
    "lease epoch text": ("UPDATE leases SET epoch = 'abc' WHERE session = x'{R}'", "resume"),
    "lease epoch at the limit": (
        f"UPDATE leases SET epoch = {_INT64_MAX} WHERE session = x'{{R}}'",
        "resume",
    ),
    "lease holder blob": (
        "UPDATE leases SET holder = x'ff00', expires = 1e12 WHERE session = x'{R}'",
        "resume",
    ),
    "lease wake blob": (
        "UPDATE leases SET holder = 'h', expires = 1e12, wake = x'00ff' WHERE session = x'{R}'",
        "send",
    ),
    "holder expiry text": (
        "INSERT INTO holders VALUES ('ghost', 'never');"
        " UPDATE leases SET holder = 'ghost', expires = 0 WHERE session = x'{R}'",
        "resume",
    ),
    "event seq text": ("UPDATE events SET seq = 'x' WHERE session = x'{R}' AND seq = 2", "resume"),
    "header text": ("UPDATE sessions SET header = 'not a header' WHERE id = x'{R}'", "resume"),
    "header a huge integer": (
        f"UPDATE sessions SET header = {2**50} WHERE id = x'{{R}}'",
        "resume",
    ),
}


def _damage_checkpoint(db: Path, kid: str, field: str) -> None:
    from subagents.protocol import packb, unpackb

    conn = sqlite3.connect(db)
    key = bytes.fromhex(kid)
    (data,) = conn.execute("SELECT data FROM checkpoints WHERE session = ?", (key,)).fetchone()
    state = unpackb(data)
    state[field] = "7" if field == "next_turn" else 5
    conn.execute("UPDATE checkpoints SET data = ? WHERE session = ?", (packb(state), key))
    conn.commit()
    conn.close()


@pytest.mark.parametrize("case", list(CASES))
def test_a_value_of_the_wrong_kind_is_a_typed_error_of_its_session(
    backend: Backend, base: tuple[Path, str, str, str], tmp_path: Path, case: str
) -> None:
    """R-ERR-1: each damage, then the public call that reads it (a resume, a send,
    a follow-up by the parent's id): it succeeds (a damaged checkpoint is ignored,
    a damaged inbox entry skipped) or raises a typed error -- and the other tree
    still runs, ``roots()`` lists it, and neither ``subagents tree`` nor ``show``
    prints a traceback."""
    path, root, kid, other = base
    db = tmp_path / "damaged.db"
    shutil.copy(path, db)
    script, call = CASES[case]
    if script.startswith("checkpoint:"):
        _damage_checkpoint(db, kid, script.split(":")[1])
    else:
        _sql(db, script.format(R=root, K=kid))
    with Runtime(str(db), backend=backend) as rt:
        _register(rt)
        try:
            if call == "resume":
                rt.agents.resume(root)
            elif call == "send":
                rt.agents.send(root, "x")
            else:
                rt.subagents.followup(root, kid, "by id")
        except SubagentError as exc:
            assert exc.code in (ErrorCode.CORRUPT_RECORD, ErrorCode.LEASE_HELD), exc
        rt.agents.send(other, "still here")
        assert rt.wait_idle(10)
        assert rt.sessions.turn_ends(other)[-1].output == "ok"
        assert other in [str(h.id) for h in rt.agents.roots()]
    for command in (["tree", str(db)], ["show", str(db), root]):
        assert main(command) in (0, 1), command  # a diagnostic, not an exception


@pytest.mark.parametrize("field", ["next_turn", "context", "descriptor"])
def test_a_checkpoint_of_the_wrong_shape_is_ignored(backend: Backend, db: str, field: str) -> None:
    """R-ERR-1, on SQLite and PostgreSQL: a child's checkpoint that decodes but
    holds a field of the wrong kind (a text turn counter, a context that is no
    list, a descriptor that is no map) is ignored like one that does not decode:
    the follow-up by the parent's id resumes the child from its whole log, its
    turns numbered on. It raised ``TypeError`` out of the follow-up, and again in
    the mail task's adoption."""
    from subagents.protocol import packb, unpackb

    with Runtime(db, backend=backend) as rt:
        _register(rt)
        root = rt.spawn("boss", label="root")
        root.followup("hire")
        assert rt.wait_idle(10)
        kid = rt.sessions.turn_ends(root.session_id)[-1].output
        rt.subagents.followup(root, kid, "t1")
        assert rt.wait_idle(10)
        root_id = root.session_id
    with open_store(db) as store:
        found = store.get_checkpoint(kid)
        assert found is not None
        state = unpackb(found[1])
    state[field] = {"next_turn": "7", "context": 5, "descriptor": [1]}[field]
    outside_sql(
        db,
        "UPDATE checkpoints SET data = ? WHERE session = ?",
        packb(state),
        SessionId(kid).to_bytes(),
    )
    with Runtime(db, backend=backend) as rt:
        _register(rt)
        rt.subagents.followup(str(root_id), kid, "after")
        assert rt.wait_idle(10)
        ends = rt.sessions.turn_ends(kid)
        assert [e.turn for e in ends] == [0, 1, 2]
        assert ends[-1].output == "worked after"
