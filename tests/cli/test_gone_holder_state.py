"""``subagents tree`` / ``show``: a turn whose holder the store finds gone is
``waiting``, not ``running`` (issue 17 point 2's states; issue 13: a worker of
another host, or of another container on the same SQLite file, that was killed).

The holder names another host, so no pid check judges it. On PostgreSQL its
listener's connection (``store/_pg_listen.py``) is what says it runs: while it
listens, the open turn is ``running``; once that connection is gone, the turn is
one whose process ended: ``waiting`` (it runs again at the next activation), as
it shows at once for a dead holder of the reader's own host. On SQLite its
presence lock in ``<db>-wake/`` (``store/_presence.py``) says it: once its
process is killed the turn is ``waiting`` at once (the kernel let go of the lock
as the process ended).
"""

from __future__ import annotations

import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from subagents.actors._shell._cli import main
from subagents.protocol import (
    MessageEvent,
    SessionHeader,
    SessionId,
    TurnStart,
    new_message_id,
    new_session_id,
)
from subagents.store import PostgresStore, SqliteStore

pytestmark = pytest.mark.timeout(60)

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def _state(capsys: pytest.CaptureFixture[str], db: str, sid: str) -> tuple[str, str]:
    """The session's state in ``tree --json`` and in ``show --json``."""
    capsys.readouterr()
    assert main(["tree", db, "--json"]) == 0
    (entry,) = [e for e in json.loads(capsys.readouterr().out) if e["id"] == sid]
    assert main(["show", db, sid, "--json"]) == 0
    shown: dict[str, Any] = json.loads(capsys.readouterr().out)["state"]
    return entry["state"], shown["state"]


def _open_turn(store: Any, wake: str) -> SessionId:
    """A session whose first turn is open, under a live lease of another host's
    holder whose wake address is ``wake``."""
    sid = new_session_id()
    store.create_session(
        SessionHeader(id=sid, parent_session=None, origin="user", delegation_depth=0,
                      created_at=T0)
    )  # fmt: skip
    now = store.clock()
    store.acquire_lease(sid, "another-host~0.0:7:a", now=now, expires=now + 3600, wake=wake)
    mid = new_message_id()
    store.accept(sid, [MessageEvent(message_id=mid, content="first")])
    opened = TurnStart(turn=0, at=T0, message_ids=(mid,))
    store.append(sid, [opened, MessageEvent(message_id=mid, content="first")])
    return sid


def test_a_turn_whose_holder_is_unheard_is_waiting(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with PostgresStore(pg_url) as store:
        listener = store.listen()
        try:
            sid = _open_turn(store, listener.address)
            assert _state(capsys, pg_url, str(sid)) == ("running", "running")
        finally:
            listener.close()
        end = time.monotonic() + 10
        while (state := _state(capsys, pg_url, str(sid))) != ("waiting", "waiting"):
            assert time.monotonic() < end, state  # the server ends its session moments later
            time.sleep(0.05)


#: Takes a presence on the file it is given, prints its address, waits for stdin.
HOLDER = Path(__file__).parents[1] / "store" / "presence_holder.py"


def test_a_turn_whose_holders_presence_ended_is_waiting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "s.db")
    proc = subprocess.Popen(
        [sys.executable, str(HOLDER), db], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().strip()
        assert address.startswith(db + "-wake/")
        with SqliteStore(db) as store:
            sid = _open_turn(store, address)
        assert _state(capsys, db, str(sid)) == ("running", "running")
        proc.kill()
        proc.wait()
        assert _state(capsys, db, str(sid)) == ("waiting", "waiting")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
