"""Open promises as accepted work: what makes a sweep adopt a session owed a message.

A turn that promises its session a message (a background run's result: the
``message/expected`` event of the runtime) makes the session owe something to its
model even when nothing waits in its inbox. The log keeps the promise, but a
sweep looks for accepted work in the inbox and the leases only, and a log is
not a place to query: so the store also keeps each open promise as a row
``promises(session, message_id)`` (SQLite schema 5, PostgreSQL schema 3), and
:meth:`~._durable.DurableQueues.orphans` counts a session with one as having
accepted work. Its next activation -- a sweep's adoption when its holder died --
delivers the promised message or its stand-in.

The rows are a hint kept beside the log, which stays the truth: the runtime
writes a turn's promises before the turn's end (:meth:`Promises.owe`, ``add``),
drops one when the promised message runs (``drop``), and each activation that
reads the promises from the log drops every row (``clear``): the stand-ins are in
the inbox by then, accepted work of their own. A row the log does not back --
its turn cut short, or written by an older runtime that kept the promise --
costs one adoption, which finds nothing owed and clears it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from subagents.protocol import MessageId, SessionId

from ._validate import check_message_ids, check_session_id, invalid

__all__ = ["OWED_SESSIONS", "PROMISES_DDL", "Promises", "check_owe", "owe_in"]

#: The table (SQLite's; PostgreSQL's names ``bytea`` for ``BLOB``).
PROMISES_DDL: Final = (
    "CREATE TABLE promises (session BLOB NOT NULL, message_id BLOB NOT NULL,"
    " PRIMARY KEY (session, message_id))"
)

#: Sessions owed a message whose lease is free at ``?`` (as ``orphans`` reads leases).
#: Only sessions that exist: a process of the schema before promises deletes a
#: session but not its rows, and a sweep must not find that session every period.
OWED_SESSIONS: Final = (
    "SELECT DISTINCT p.session FROM promises p JOIN sessions s ON s.id = p.session"
    " LEFT JOIN leases l ON l.session = p.session LEFT JOIN holders h ON h.holder = l.holder"
    " WHERE l.session IS NULL OR l.holder IS NULL OR {expiry} <= ?"
)


def check_owe(op: tuple[Any, ...]) -> tuple[SessionId, Any, list[bytes], list[bytes], bool]:
    """The arguments of an ``("owe", session_id, lease, add, drop, clear)`` write op,
    checked: ``(session, lease, add, drop, clear)``, ids as bytes."""
    sid = check_session_id(op[1])
    add = [m.to_bytes() for m in check_message_ids(op[3])] if len(op) > 3 else []
    drop = [m.to_bytes() for m in check_message_ids(op[4])] if len(op) > 4 else []
    clear = op[5] if len(op) > 5 else False
    if type(clear) is not bool:
        raise invalid("clear must be a bool")
    return sid, op[2], add, drop, clear


def owe_in(
    txn: Any,
    session_id: SessionId,
    token: Any,
    add: Sequence[bytes],
    drop: Sequence[bytes],
    clear: bool,
) -> None:
    """Apply an ``owe`` op in an SQL transaction (``txn`` a ``QueueTxn``): fenced by
    the lease ``token``; ``clear`` first, then ``drop``, then ``add``."""
    txn.fence(session_id, token)
    key = session_id.to_bytes()
    conn = txn.conn
    if clear:
        conn.execute("DELETE FROM promises WHERE session = ?", (key,))
    if drop:
        conn.executemany(
            "DELETE FROM promises WHERE session = ? AND message_id = ?",
            [(key, m) for m in drop],
        )
    if add:
        conn.executemany(
            "INSERT INTO promises (session, message_id) VALUES (?, ?) ON CONFLICT DO NOTHING",
            [(key, m) for m in add],
        )


class Promises:
    """The store's side of open promises (see the module docstring). A store that
    keeps them inherits this; the runtime writes promises only to such a store."""

    def owe(
        self,
        session_id: SessionId | str,
        add: Sequence[MessageId] = (),
        drop: Sequence[MessageId] = (),
        *,
        lease: Any = None,
        clear: bool = False,
    ) -> None:
        """Record open promises of ``session_id`` (``add``), forget kept ones
        (``drop``) -- all of them first with ``clear`` -- in one write fenced by
        ``lease`` (``LEASE_LOST``). Also a write op of ``write_many``: ``("owe",
        session_id, lease, add, drop, clear)``."""
        raise NotImplementedError

    def owed(self, session_id: SessionId | str) -> list[MessageId]:
        """The ids of the messages ``session_id`` is owed (its promise rows)."""
        raise NotImplementedError
