"""The sweep's question about this host's holders (``DurableQueues.leased_work``).

A worker killed with SIGKILL leaves its leases live until they expire (30 s by
default): a sibling's sweep found its accepted work only then. Now the sweep
also asks the store which sessions with accepted work -- messages not done, or
promises open -- hold a live lease of a holder of this host, and adopts those
whose holder's process ended (``tests/durability/test_dead_holder_sweep.py``).
The contract is the same on every store (R-DUR-*: memory, SQLite, PostgreSQL).
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import MakeEvents, MakeHeader
from subagents.protocol import ErrorCode, MessageId, SubagentError
from subagents.store import Holder, SessionStore

NOW = 1_000.0
HOST = "box~1.2:"  # a holder id is ``host:pid:nonce``


def _session(
    store: SessionStore, make_header: MakeHeader, holder: str | None, expires: float = NOW + 30
) -> Any:
    h = make_header()
    store.create_session(h)
    if holder is not None:
        store.acquire_lease(h.id, holder, now=NOW, expires=expires)
    return h.id


def test_only_live_leases_of_the_hosts_holders_over_accepted_work_are_listed(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """Listed: pending messages or an open promise under a live lease (by its own
    expiry or its holder's heartbeat) of a holder starting with the prefix. Not
    listed: another host's, an expired lease, no lease, nothing pending (done)."""
    mine = _session(store, make_header, HOST + "7:a")
    store.accept(mine, make_events(2))
    owed = _session(store, make_header, HOST + "8:b")
    store.owe(owed, [MessageId("a" * 32)])
    beat = _session(store, make_header, HOST + "9:c", expires=NOW + 1)
    store.accept(beat, make_events(1))
    store.renew_leases(HOST + "9:c", NOW + 40)  # its heartbeat keeps it live
    other_host = _session(store, make_header, "elsewhere:7:a")
    store.accept(other_host, make_events(1))
    expired = _session(store, make_header, HOST + "7:d", expires=NOW + 5)
    store.accept(expired, make_events(1))
    done = _session(store, make_header, HOST + "7:e")
    (message,) = make_events(1)
    store.accept(done, [message])
    store.complete(done, [message.message_id])
    idle = _session(store, make_header, HOST + "7:f")
    unleased = _session(store, make_header, None)
    store.accept(unleased, make_events(1))  # an orphan already: not this question's

    found = store.leased_work(HOST, NOW + 10)
    assert sorted(found) == sorted(
        [(mine, HOST + "7:a"), (owed, HOST + "8:b"), (beat, HOST + "9:c")]
    )
    assert idle not in {sid for sid, _ in found}
    assert store.leased_work(HOST, NOW + 40) == []  # every lease lapsed
    assert store.leased_work("elsewhere:", NOW + 10) == [(other_host, "elsewhere:7:a")]


def test_the_prefix_is_matched_as_written(
    store: SessionStore, make_header: MakeHeader, make_events: MakeEvents
) -> None:
    """A host name's ``_`` and ``%`` (SQL's wildcards) and ``!`` (the escape) are
    its own characters: a prefix matches only holders that begin with it."""
    odd = "a_b%c!d:"
    exact = _session(store, make_header, odd + "1:x")
    store.accept(exact, make_events(1))
    for lookalike in ("aXbYcZd:1:x", "a_bYc!d:1:x", "a_b%c!!d:1:x", "A_B%C!D:1:x"):
        store.accept(_session(store, make_header, lookalike), make_events(1))
    assert store.leased_work(odd, NOW) == [(exact, odd + "1:x")]


def test_bad_arguments_are_typed(store: SessionStore) -> None:
    for args in ((None, NOW), (HOST, "now"), (HOST, float("nan"))):
        with pytest.raises(SubagentError) as err:
            store.leased_work(*args)  # type: ignore[arg-type]
        assert err.value.code == ErrorCode.INVALID_ARGUMENT


def test_this_hosts_holders_share_the_prefix() -> None:
    """A holder's id starts with :attr:`Holder.kin`, which names this host alone."""
    a, b = Holder(), Holder()
    assert a.id.startswith(a.kin) and b.id.startswith(a.kin) and a.kin == b.kin
    assert a.kin.endswith(":") and a.kin.count(":") == 1
