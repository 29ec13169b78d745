"""Helpers of the refused-delivery tests: a store that refuses retractions, a
model that notes each turn with its context, and a session's next activation.

``refuse_retractions`` installs a trigger on ``DELETE FROM inbox`` for one
session (SQLite or PostgreSQL): a retraction then fails with the store's own
error, while marking a row done or giving it back still works.
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


def refuse_retractions(db: str, session: SessionId) -> None:
    """Make the store refuse to delete any inbox row of ``session`` (a real store
    error for a retraction; marking a row done or giving it back still works)."""
    key = session.to_bytes().hex()
    if db.startswith("postgresql"):
        import psycopg

        base, schema = _pg(db)
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(
                f'CREATE OR REPLACE FUNCTION "{schema}".keep_inbox()'
                " RETURNS trigger LANGUAGE plpgsql AS $$"
                f" BEGIN IF OLD.session = '\\x{key}'::bytea THEN"
                " RAISE EXCEPTION 'injected retraction failure'; END IF; RETURN OLD; END $$"
            )
            conn.execute(
                f'CREATE TRIGGER keep_inbox BEFORE DELETE ON "{schema}".inbox'
                f' FOR EACH ROW EXECUTE FUNCTION "{schema}".keep_inbox()'
            )
        return
    with sqlite3.connect(db) as conn:
        conn.execute(
            "CREATE TRIGGER keep_inbox BEFORE DELETE ON inbox"
            f" WHEN OLD.session = X'{key}'"
            " BEGIN SELECT RAISE(ABORT, 'injected retraction failure'); END"
        )
    conn.close()


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
