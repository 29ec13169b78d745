"""The schema of :class:`~._postgres.PostgresStore`: identification, versions, errors.

A subagents store on PostgreSQL is one *schema* (a namespace, ``subagents`` by
default) of a database. Its ``subagents_schema`` table holds one row: the
application name and the version. :data:`PG_MIGRATIONS` is the migration hook,
as for SQLite: ``PG_MIGRATIONS[n]`` takes version ``n`` to ``n + 1``, in one
transaction with the version bump, under a transaction-level advisory lock on the
schema's name (processes opening one store at once migrate it once).

Identification happens before anything is written (:func:`classify`): a schema
that does not exist or holds no table is new; one with our ``subagents_schema``
row is ours (refused with ``SCHEMA_TOO_NEW`` when newer than this code); any
other is foreign (``NOT_A_DATABASE``) and left untouched.

Version 1 holds the tables of SQLite's version 3 (the SQLite store's history
before it did not exist here): ``sessions``, ``events``, ``checkpoints``,
``projection_cache``, ``inbox``, ``leases``, with the same columns, keys and
indexes; ids are ``bytea`` (16 bytes), times ``bigint`` microseconds or
``double precision`` seconds. Version 2 adds SQLite's version 4: ``holders``,
one lease heartbeat per holder; version 3 SQLite's version 5: ``promises``.

SQL is written with ``?``/``?N`` placeholders, once for both stores;
:func:`translate` turns it into psycopg's ``%s`` and the parameter order.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Final, Literal

import psycopg
import psycopg.errors
from subagents.protocol import ErrorCode, SubagentError

from ._promises import PROMISES_DDL

__all__ = [
    "PG_MIGRATIONS",
    "PG_SCHEMA_VERSION",
    "classify",
    "migrate",
    "pg_error",
    "reorder",
    "translate",
]

APPLICATION: Final = "subagents"


def _v0_to_v1(conn: psycopg.Connection[Any]) -> None:
    for statement in (
        "CREATE TABLE sessions (id bytea PRIMARY KEY, parent bytea, origin text NOT NULL,"
        " depth bigint NOT NULL, created_at bigint NOT NULL, header bytea NOT NULL)",
        "CREATE INDEX sessions_by_parent ON sessions (parent, created_at, id)",
        "CREATE INDEX sessions_by_created ON sessions (created_at, id)",
        "CREATE TABLE events (session bytea NOT NULL, seq bigint NOT NULL,"
        " body bytea NOT NULL, PRIMARY KEY (session, seq))",
        "CREATE TABLE checkpoints (session bytea PRIMARY KEY, seq bigint NOT NULL,"
        " data bytea NOT NULL)",
        "CREATE TABLE projection_cache (session bytea NOT NULL, unit text NOT NULL,"
        " seq bigint NOT NULL, data bytea NOT NULL, PRIMARY KEY (session, unit))",
        "CREATE TABLE inbox (session bytea NOT NULL, n bigint NOT NULL,"
        " message_id bytea NOT NULL, body bytea NOT NULL, epoch bigint,"
        " done smallint NOT NULL DEFAULT 0, accepted_at double precision NOT NULL,"
        " PRIMARY KEY (session, n))",
        "CREATE UNIQUE INDEX inbox_by_message ON inbox (session, message_id)",
        "CREATE INDEX inbox_by_id ON inbox (message_id)",
        "CREATE INDEX inbox_pending ON inbox (session, n) WHERE done = 0",
        "CREATE TABLE leases (session bytea PRIMARY KEY, holder text, epoch bigint NOT NULL,"
        " expires double precision NOT NULL, wake text)",
        "CREATE INDEX leases_by_holder ON leases (holder)",
    ):
        conn.execute(statement)


def _v1_to_v2(conn: psycopg.Connection[Any]) -> None:
    # One heartbeat per lease holder, as SQLite's version 4 (see ``_schema.py``).
    conn.execute(
        "CREATE TABLE holders (holder text PRIMARY KEY, expires double precision NOT NULL)"
    )


def _v2_to_v3(conn: psycopg.Connection[Any]) -> None:
    # Open promises, as SQLite's version 5 (see ``_promises.py``).
    conn.execute(PROMISES_DDL.replace("BLOB", "bytea"))


#: ``PG_MIGRATIONS[n]`` migrates version ``n`` to ``n + 1``; append, never edit.
PG_MIGRATIONS: Final[tuple[Callable[[psycopg.Connection[Any]], None], ...]] = (
    _v0_to_v1,
    _v1_to_v2,
    _v2_to_v3,
)
#: The PostgreSQL schema version this code reads and writes.
PG_SCHEMA_VERSION: Final = len(PG_MIGRATIONS)


def _where(schema: str) -> str:
    return f"schema {schema!r}"


def _not_ours(schema: str, why: str) -> SubagentError:
    return SubagentError(
        f"{_where(schema)} is not a subagents store ({why}); it was left untouched",
        code=ErrorCode.NOT_A_DATABASE,
        hint={"schema": schema},
    )


def _too_new(schema: str, version: int) -> SubagentError:
    return SubagentError(
        f"{_where(schema)} has schema version {version}; this code supports up to"
        f" {PG_SCHEMA_VERSION} (upgrade subagents); it was left untouched",
        code=ErrorCode.SCHEMA_TOO_NEW,
        hint={"schema": schema, "version": version, "supported": PG_SCHEMA_VERSION},
    )


def classify(conn: psycopg.Connection[Any], schema: str) -> tuple[Literal["new", "ours"], int]:
    """``("new", 0)`` or ``("ours", version)`` for ``schema``, reading only.

    Raises:
        SubagentError: ``NOT_A_DATABASE`` (a foreign schema), ``SCHEMA_TOO_NEW``.
    """
    tables = {
        row[0]
        for row in conn.execute(
            "SELECT tablename FROM pg_catalog.pg_tables WHERE schemaname = %s", (schema,)
        ).fetchall()
    }
    if not tables:
        return ("new", 0)
    if "subagents_schema" not in tables:
        raise _not_ours(schema, f"it holds {len(tables)} tables and no subagents_schema")
    try:
        row = conn.execute(
            f'SELECT application, version FROM "{schema}".subagents_schema'
        ).fetchone()
    except psycopg.errors.UndefinedColumn:  # a table of that name, not ours
        raise _not_ours(schema, "its subagents_schema table is not ours") from None
    if row is None or row[0] != APPLICATION or type(row[1]) is not int:
        raise _not_ours(schema, f"subagents_schema names {row[0] if row else None!r}")
    version = row[1]
    if version > PG_SCHEMA_VERSION:
        raise _too_new(schema, version)
    return ("ours", version)


def migrate(conn: psycopg.Connection[Any], schema: str) -> int:
    """Bring ``schema`` to :data:`PG_SCHEMA_VERSION`; returns the steps applied.

    ``conn`` is in autocommit mode; each step is its own transaction under an
    advisory lock, re-classifying the schema first.
    """
    applied = 0
    while True:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"subagents:{schema}",))
            kind, version = classify(conn, schema)
            if kind == "new":
                conn.execute(f'CREATE SCHEMA IF NOT EXISTS "{schema}"')
                conn.execute(
                    f'CREATE TABLE "{schema}".subagents_schema'
                    " (application text NOT NULL, version integer NOT NULL)"
                )
                conn.execute(
                    f'INSERT INTO "{schema}".subagents_schema VALUES (%s, 0)', (APPLICATION,)
                )
            if version == PG_SCHEMA_VERSION:
                return applied
            conn.execute(f'SET LOCAL search_path TO "{schema}"')
            PG_MIGRATIONS[version](conn)
            conn.execute("UPDATE subagents_schema SET version = %s", (version + 1,))
        applied += 1


_PLACEHOLDER: Final = re.compile(r"\?(\d*)")
_translated: dict[str, tuple[str, tuple[int, ...] | None]] = {}


def translate(sql: str) -> tuple[str, tuple[int, ...] | None]:
    """``(psycopg sql, order)``: ``?`` and ``?N`` become ``%s``; ``order`` lists which
    given parameter each ``%s`` takes (None: the given order). Cached per string."""
    done = _translated.get(sql)
    if done is not None:
        return done
    order: list[int] = []

    def sub(match: re.Match[str]) -> str:
        order.append(int(match.group(1)) - 1 if match.group(1) else len(order))
        return "%s"

    text = _PLACEHOLDER.sub(sub, sql.replace("%", "%%"))
    result = (text, None if order == list(range(len(order))) else tuple(order))
    if len(_translated) < 4096:
        _translated[sql] = result
    return result


def reorder(order: tuple[int, ...] | None, params: Sequence[Any]) -> Sequence[Any]:
    """``params`` in the order :func:`translate` gave."""
    return params if order is None else [params[i] for i in order]


def pg_error(exc: BaseException, what: str = "session store") -> SubagentError:
    """A PostgreSQL failure as a :class:`SubagentError`: ``TIMEOUT`` for a lock or
    statement timeout, else ``PERSISTENCE_UNAVAILABLE`` (server down, connection
    lost, disk full...). ``what`` is what was being done or used, as the message's
    subject: "``{what}`` failed: ...". The original is the cause."""
    if isinstance(exc, (psycopg.errors.LockNotAvailable, psycopg.errors.QueryCanceled)):
        err = SubagentError(f"{what} timed out waiting for a lock: {exc}", code=ErrorCode.TIMEOUT)
    else:
        err = SubagentError(f"{what} failed: {exc}", code=ErrorCode.PERSISTENCE_UNAVAILABLE)
    err.__cause__ = exc
    return err
