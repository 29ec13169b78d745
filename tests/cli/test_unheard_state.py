"""``subagents tree`` / ``show`` on PostgreSQL: a turn whose holder the server no
longer hears is ``waiting``, not ``running`` (issue 17 point 2's states; issue
13: a worker of another host that was killed).

The holder names another host, so no pid check judges it; its listener's
connection (``store/_pg_listen.py``) is what says it runs. While it listens, the
open turn is ``running``; once that connection is gone, the turn is one whose
process ended: ``waiting`` (it runs again at the next activation), as it shows
at once for a dead holder of the reader's own host.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from typing import Any

import pytest
from subagents.actors._shell._cli import main
from subagents.protocol import (
    MessageEvent,
    SessionHeader,
    TurnStart,
    new_message_id,
    new_session_id,
)
from subagents.store import PostgresStore

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


def test_a_turn_whose_holder_is_unheard_is_waiting(
    pg_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    sid = new_session_id()
    with PostgresStore(pg_url) as store:
        listener = store.listen()
        try:
            store.create_session(
                SessionHeader(id=sid, parent_session=None, origin="user", delegation_depth=0,
                              created_at=T0)
            )  # fmt: skip
            now = store.clock()
            store.acquire_lease(
                sid, "another-host~0.0:7:a", now=now, expires=now + 3600, wake=listener.address
            )
            mid = new_message_id()
            store.accept(sid, [MessageEvent(message_id=mid, content="first")])
            store.append(
                sid,
                [
                    TurnStart(turn=0, at=T0, message_ids=(mid,)),
                    MessageEvent(message_id=mid, content="first"),
                ],
            )
            assert _state(capsys, pg_url, str(sid)) == ("running", "running")
        finally:
            listener.close()
        end = time.monotonic() + 10
        while (state := _state(capsys, pg_url, str(sid))) != ("waiting", "waiting"):
            assert time.monotonic() < end, state  # the server ends its session moments later
            time.sleep(0.05)
