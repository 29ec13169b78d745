"""Group ``postgres``: the PostgreSQL store against raw psycopg, on one real server.

* durable acceptance -- 1 and 16 producer threads calling ``followup`` on one agent
  of a strict runtime on a :class:`~subagents.store.PostgresStore` (each call
  returns after its message committed; concurrent calls share a transaction),
  against raw psycopg writing the same rows into the same table (the store's
  inbox, its indexes included), on one connection: one row per commit (1
  producer) or the ideal group commit of as many rows per commit as there are
  producers. The ``turns running`` rows accept while the agent runs each message
  (the follow-up throughput: acceptance and turns sharing the server);
* a follow-up across processes, p50: this process ``send`` s to a session another
  process holds; the holder wakes on ``NOTIFY``, runs the turn and answers on a
  datagram socket; beside the same round trip in one process.

The server: ``SUBAGENTS_BENCH_POSTGRES_URL`` (or ``SUBAGENTS_TEST_POSTGRES_URL``)
when set, else a throwaway cluster (``tests/pgcluster.py``) started for the group
and removed after. Without a PostgreSQL server the group's rows are skipped with
a note. Every measurement writes into a schema of its own.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from subagents.protocol import encode_event, new_message_id, new_session_id, trusted_message

from bench._harness import Context, Row, best_of_each, group
from bench._renewal import HOLDER, UPDATE_ALL, hold_leases, renewal_rows
from bench.durability_bench import (
    PAYLOAD,
    accept_rate,
    acceptance_rows,
    cross_process_round_trip,
    in_process_round_trip,
    round_trip_rows,
)

_INSERT = (
    "INSERT INTO inbox (session, n, message_id, body, epoch, accepted_at)"
    " VALUES (%s, %s, %s, %s, %s, %s)"
)


@contextmanager
def _server(ctx: Context) -> Iterator[str | None]:
    url = os.environ.get("SUBAGENTS_BENCH_POSTGRES_URL") or os.environ.get(
        "SUBAGENTS_TEST_POSTGRES_URL"
    )
    if url:
        yield url
        return
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    try:
        import pgcluster
    finally:
        sys.path.pop(0)
    try:
        # Its own directory (the server user must reach it), watched: a killed run leaves none.
        cluster = pgcluster.start(owner_pid=os.getpid())
    except RuntimeError as exc:
        ctx.log(f"postgres: no server ({exc}); rows skipped")
        yield None
        return
    try:
        yield cluster.url
    finally:
        cluster.destroy()


def _schema(url: str) -> str:
    """``url`` naming a new schema of its own."""
    sep = "&" if "?" in url else "?"
    return f"{url}{sep}schema=b_{uuid.uuid4().hex[:16]}"


def _raw(url: str, n: int, batch: int) -> float:
    """Raw psycopg writing the same rows into the same table: a store's inbox (its
    schema, its indexes), ``batch`` rows per transaction, one connection (rows/s)."""
    from subagents.store import PostgresStore

    store = PostgresStore(_schema(url), pool_size=1)  # the schema, and nothing else
    try:
        with store.connect() as conn:
            body = encode_event(trusted_message(new_message_id(), PAYLOAD, None))
            key = new_session_id().to_bytes()
            start = time.perf_counter()
            for j in range(0, n, batch):
                with conn.transaction():
                    cur = conn.cursor(binary=True)
                    cur.executemany(
                        _INSERT,
                        [
                            (key, i + 1, new_message_id().to_bytes(), body, 1, 0.0)
                            for i in range(j, min(n, j + batch))
                        ],
                    )
            return n / (time.perf_counter() - start)
    finally:
        store.close()


@group("postgres")
def postgres_group(ctx: Context) -> list[Row]:
    rows: list[Row] = []
    with _server(ctx) as url:
        if url is None:
            return rows
        for producers, per, target in ((1, 400, None), (16, 100, 0.3)):
            size = ctx.size(per, 5)
            rows_n = ctx.size(400, 30) if producers == 1 else ctx.size(3200, 160)
            rates = best_of_each(
                1 if ctx.quick else 3,
                lambda: _raw(url, rows_n, producers),
                lambda: accept_rate(_schema(url), producers, size, running=False),
                lambda: accept_rate(_schema(url), producers, size, running=True),
            )
            rows += acceptance_rows("psycopg", "postgresql", producers, rates, target)
        n = ctx.size(300, 20)
        local = in_process_round_trip(_schema(url), n)
        remote, _idle = cross_process_round_trip(ctx, n, _schema(url))
        rows += round_trip_rows(
            "postgresql", local, remote, "follow-up across processes (NOTIFY), p50"
        )
        rows += _renewal(url, ctx.size(20_000, 500), 1 if ctx.quick else 5)
    return rows


def _renewal(url: str, n: int, rounds: int) -> list[Row]:
    from subagents.store import PostgresStore

    with PostgresStore(_schema(url)) as store, store.connect() as conn:
        hold_leases(store, n)

        def update_all(expires: float) -> int:
            with conn.transaction():
                return conn.execute(UPDATE_ALL.replace("?", "%s"), (expires, HOLDER)).rowcount

        return renewal_rows(store, n, "postgresql", update_all, rounds)
