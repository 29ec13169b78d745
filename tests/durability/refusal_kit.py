"""Helpers of the refused-write tests: a store that refuses one session's rows, a
model that notes each turn with its context, and a session's next activation.

``refuse`` installs a trigger on one table for one session (SQLite or
PostgreSQL): the write then fails with the store's own error, as a server
restart or a constraint would make it fail; ``allow`` takes it away.
``refuse_retractions`` is the one on ``DELETE FROM inbox``: a retraction fails,
while marking a row done or giving it back still works.
"""

from __future__ import annotations

import sqlite3
from typing import Any

from durability_kit import Noted
from subagents.actors import Runtime
from subagents.protocol import ErrorCode, SessionId, SubagentError


def _pg(db: str) -> tuple[str, str]:
    base, _, schema = db.partition("?schema=")
    return base, schema


def refuse(
    db: str,
    session: SessionId,
    *,
    table: str,
    op: str = "INSERT",
    name: str = "refuse",
    also: str = "",
    what: str = "write",
) -> None:
    """Make the store refuse ``op`` (``INSERT``, ``UPDATE``, ``DELETE``) on the
    ``table`` rows of ``session``: a trigger ``name`` raises the store's own error,
    "injected ``what`` failure". ``also``: a further condition on the row, SQL
    both stores read (`` AND NEW.holder IS NULL``)."""
    key = session.to_bytes().hex()
    row = "OLD" if op == "DELETE" else "NEW"
    message = f"injected {what} failure"
    if db.startswith("postgresql"):
        import psycopg

        base, schema = _pg(db)
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(
                f'CREATE OR REPLACE FUNCTION "{schema}".{name}()'
                " RETURNS trigger LANGUAGE plpgsql AS $$"
                f" BEGIN IF {row}.session = '\\x{key}'::bytea{also} THEN"
                f" RAISE EXCEPTION '{message}'; END IF; RETURN {row}; END $$"
            )
            conn.execute(
                f'CREATE TRIGGER {name} BEFORE {op} ON "{schema}".{table}'
                f' FOR EACH ROW EXECUTE FUNCTION "{schema}".{name}()'
            )
        return
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(
            f"CREATE TRIGGER {name} BEFORE {op} ON {table}"
            f" WHEN {row}.session = X'{key}'{also}"
            f" BEGIN SELECT RAISE(ABORT, '{message}'); END"
        )
    conn.close()


def allow(db: str, *, table: str, name: str = "refuse") -> None:
    """Take the trigger :func:`refuse` installed away: the store takes the rows again."""
    if db.startswith("postgresql"):
        import psycopg

        base, schema = _pg(db)
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP TRIGGER {name} ON "{schema}".{table}')
        return
    conn = sqlite3.connect(db)
    with conn:
        conn.execute(f"DROP TRIGGER {name}")
    conn.close()


def refuse_retractions(db: str, session: SessionId) -> None:
    """Make the store refuse to delete any inbox row of ``session`` (a real store
    error for a retraction; marking a row done or giving it back still works)."""
    refuse(db, session, table="inbox", op="DELETE", name="keep_inbox", what="retraction")


class Seen(Noted):
    """``Noted``, with each turn's context (the quiet reports it took)."""

    def register(self, rt: Runtime, name: str, model: str = "note") -> None:
        def factory(_options: Any) -> Any:
            def on_turn(turn: Any) -> Any:
                for message in turn.context:
                    self.add((name, ("context", message.content), turn.redelivered))
                self.add((name, turn.content, turn.redelivered))
                return turn.content

            return on_turn

        rt.models.register(model, factory, replace=True)


def resumed(rt: Runtime, session_id: SessionId) -> Any:
    """``session_id`` resumed in ``rt`` -- unless its sweep adopted it first."""
    try:
        return rt.agents.resume(session_id)
    except SubagentError as exc:
        found = rt.agents.get(session_id)
        if exc.code != ErrorCode.SESSION_EXISTS or found is None:
            raise
        return found
