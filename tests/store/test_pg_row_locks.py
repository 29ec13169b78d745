"""PostgreSQL's row locks where SQLite's one write lock ordered two writers (R-S7,
R-DUR: two processes on one store never both hold a session; nothing accepted
is left behind).

Each race is forced: one store's writer stops inside its transaction right after
a chosen statement (``_Pause``), the other store's call runs meanwhile, then the
first goes on. Many rounds each.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import psycopg
import pytest
from conftest import MakeEvents, MakeHeader
from subagents.protocol import ErrorCode, SubagentError
from subagents.store import PostgresStore
from subagents.store._durable import Lease
from subagents.store._pg_txn import PgConn

pytestmark = pytest.mark.timeout(120)


class _Pause:
    """``store``'s writer stops after its next statement ``match`` accepts, until
    :meth:`go`; ``reached`` is set when it stopped."""

    def __init__(self, store: PostgresStore, match: Callable[[str], bool]) -> None:
        self.reached = threading.Event()
        self._go = threading.Event()
        self._armed = True
        self._store, self._match = store, match

    def __call__(self, original: Any) -> Any:
        def execute(conn: PgConn, sql: str, params: Any = (), /) -> Any:
            cursor = original(conn, sql, params)
            if self._armed and conn is self._store._writer.conn and self._match(sql):
                self._armed = False
                self.reached.set()
                assert self._go.wait(60)
            return cursor

        return execute

    def go(self) -> None:
        self._go.set()


@pytest.fixture
def pause(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., _Pause]]:
    original = PgConn.execute
    pauses: list[_Pause] = []

    def make(store: PostgresStore, match: Callable[[str], bool]) -> _Pause:
        p = _Pause(store, match)
        monkeypatch.setattr(PgConn, "execute", p(original))
        pauses.append(p)
        return p

    yield make
    for p in pauses:
        p.go()  # never leave a writer stopped


def _blocked_or_done(url: str, thread: threading.Thread) -> None:
    """Return once ``thread`` finished or some backend waits on a lock (a deadline
    poll for another connection's progress, not an ordering sleep)."""
    with psycopg.connect(url.split("?")[0], autocommit=True) as admin:
        deadline = time.monotonic() + 30
        while thread.is_alive() and time.monotonic() < deadline:
            waiting = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
            ).fetchone()
            if waiting is not None and waiting[0]:
                return
            thread.join(0.005)


def _in_thread(
    out: dict[str, Any], key: str, fn: Callable[..., Any], *args: Any
) -> threading.Thread:
    """``out[key] = fn(*args)`` (or its SubagentError) in a thread of its own."""

    def run() -> None:
        try:
            out[key] = fn(*args)
        except SubagentError as exc:
            out[key] = exc

    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_renewal_and_a_takeover_are_never_both_told_they_hold_the_session(
    pg_url: str, make_header: MakeHeader, pause: Callable[..., _Pause]
) -> None:
    """Holder A stalled past its heartbeat; B's takeover has read the expired
    heartbeat when A's renewal comes. Either A's renewal lists the session and B
    is refused, or B holds it and A's renewal lists it no more -- never both."""
    with PostgresStore(pg_url) as a, PostgresStore(pg_url) as b:
        for round_ in range(5):
            t0 = 1000.0 * (round_ + 1)
            h = make_header()
            a.create_session(h)
            a.acquire_lease(h.id, "A", now=t0, expires=t0 + 30)
            a.renew_leases("A", t0 + 30)
            stop = pause(b, lambda sql: sql.startswith("SELECT l.holder, l.epoch"))
            out: dict[str, Any] = {}
            taker = _in_thread(
                out, "b", partial(b.acquire_lease, now=t0 + 31, expires=t0 + 61), h.id, "B"
            )
            assert stop.reached.wait(30)
            renewer = _in_thread(out, "a", a.renew_leases, "A", t0 + 61)
            _blocked_or_done(pg_url, renewer)
            stop.go()
            taker.join(60)
            renewer.join(60)
            assert not taker.is_alive() and not renewer.is_alive()
            took = isinstance(out["b"], Lease)
            kept = h.id in out["a"]
            assert took != kept, (out["a"], out["b"])
            if not took:
                assert out["b"].code == ErrorCode.LEASE_HELD


def test_a_withdrawal_takes_an_acceptance_committed_meanwhile_with_it(
    pg_url: str, make_header: MakeHeader, make_events: MakeEvents, pause: Callable[..., _Pause]
) -> None:
    """Another process accepts a follow-up into a session being withdrawn (or
    deleted): the session goes whole, leaving no inbox row of no session -- which
    every sweep would list as an orphan for ever."""
    with PostgresStore(pg_url) as a, PostgresStore(pg_url) as b:
        for round_ in range(6):
            h = make_header()
            (prompt,) = make_events(1)
            a.create_session(h, inbox=[prompt])
            stop = pause(b, lambda sql: sql.startswith("INSERT INTO inbox"))
            out: dict[str, Any] = {}
            accepting = _in_thread(out, "accept", b.accept, h.id, make_events(1))
            assert stop.reached.wait(30)
            if round_ % 2:
                removing = _in_thread(out, "gone", a.delete_session, h.id)
            else:
                removing = _in_thread(out, "gone", a.withdraw, h.id, prompt.message_id)
            _blocked_or_done(pg_url, removing)
            stop.go()
            accepting.join(60)
            removing.join(60)
            assert not accepting.is_alive() and not removing.is_alive()
            assert not a.exists(h.id)
            assert h.id not in a.orphans(time.time())
            with pytest.raises(SubagentError) as info:
                a.pending(h.id)
            assert info.value.code == ErrorCode.SESSION_NOT_FOUND
