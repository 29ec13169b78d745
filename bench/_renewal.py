"""Lease renewal at scale: what a runtime holding many resident sessions pays every
``lease_ttl / 3`` (the ``durability`` and ``postgres`` groups' renewal rows).

Not a group module: the two groups import it. The baseline is the renewal of
schema versions before the heartbeat -- one ``UPDATE`` of every lease row the
holder has -- run with the same driver on the same rows.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable
from typing import Any

from subagents.protocol import SessionHeader, new_session_id
from subagents.store import SessionStore

from bench._harness import Row, compare

#: The renewal of the schema versions before the heartbeat: every lease row.
UPDATE_ALL = "UPDATE leases SET expires = ? WHERE holder = ?"

_T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
#: The holder every lease of the workload names.
HOLDER = "bench-holder"


def hold_leases(store: SessionStore, n: int) -> None:
    """``n`` top-level sessions created with a lease ``bench-holder`` holds."""
    expires = time.time() + 3600
    ops: list[Any] = [
        (
            "create",
            SessionHeader(
                id=new_session_id(),
                parent_session=None,
                origin="user",
                delegation_depth=0,
                created_at=_T0,
            ),
            (),
            (HOLDER, expires, None),
        )
        for _ in range(n)
    ]
    for i in range(0, n, 2000):
        store.write_many(ops[i : i + 2000])


def renewal_rows(
    store: SessionStore,
    n: int,
    store_name: str,
    update_all: Callable[[float], int],
    rounds: int,
) -> list[Row]:
    """Best of ``rounds`` renewals of ``n`` held leases, against ``update_all(expires)``
    (the per-row ``UPDATE`` through a raw connection, returning its row count), the
    two taken in turn (seconds in, milliseconds out)."""
    ours: list[float] = []
    raw: list[float] = []
    for k in range(rounds):
        expires = time.time() + 7200 + k
        start = time.perf_counter()
        count = store.renew_lease_count(HOLDER, expires)
        ours.append(time.perf_counter() - start)
        assert count == n, (count, n)
        start = time.perf_counter()
        updated = update_all(expires)
        raw.append(time.perf_counter() - start)
        assert updated == n, (updated, n)

    def best(workload: str, samples: list[float]) -> Row:
        return Row(
            workload=workload, backend="-", store=store_name, value=min(samples) * 1000,
            unit="ms", better="lower",
        )  # fmt: skip

    base = best(f"raw UPDATE of {n} lease rows (renewal before the heartbeat)", raw)
    mine = best(f"lease renewal, {n} held", ours)
    return [base, compare(mine, base, target=0.25)]
