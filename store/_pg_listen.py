"""A runtime's ``LISTEN`` channel on PostgreSQL, and who still listens.

A runtime on PostgreSQL listens on a channel of its own (its leases' ``wake``
address, ``pg:<channel>``) on a connection of its own, which it keeps open for as
long as it runs and reopens at once when it drops. That connection is also how
other processes -- on any host -- can tell it still runs: it names itself after
its channel (``application_name``), and ``pg_stat_activity`` shows every session
of the server by that name, to every role. A process that ended (a SIGKILL, an
OOM kill, a crash) closed its socket with it, and the server ended its session:
its name is gone within moments. Only a host that vanished (no FIN ever sent)
leaves its session until TCP gives up; then its leases' expiry decides, as for
every other case.

Only a channel named ``subagents_heard_...`` may be judged by that: a listener
gives its channel that name only when its own session shows it (a connection
pooler that rewrites or hides the name, or a server that does not report it,
would make a live process look gone), and a runtime of an earlier version names
its channels ``subagents_<hex>`` -- never judged. The judging itself -- unheard at
every look for a grace period, never at one look -- is the holder's
(:meth:`~subagents.store.Holder.unheard`): a listener that lost its connection
reconnects within moments.
"""

from __future__ import annotations

import contextlib
from typing import Any, Final

import psycopg

from ._forked import track
from ._queue_reads import WORK_LEASES
from ._queue_txn import EXPIRY

__all__ = ["HEARD", "UNHEARD_WORK", "PgListener"]

#: How a channel that others may judge by its connection begins.
HEARD: Final = "subagents_heard_"
#: ``(session, holder)`` of accepted work (as ``orphans`` counts it) under a live
#: lease whose holder's channel is of the judged form (the ``LIKE`` pattern, a
#: parameter) and whose name no session of the server shows.
UNHEARD_WORK: Final = (
    f"{WORK_LEASES} WHERE l.wake LIKE ? ESCAPE '!' AND {EXPIRY} > ? AND NOT EXISTS"
    " (SELECT 1 FROM pg_stat_activity a WHERE a.application_name = substr(l.wake, 4))"
)
#: The ``LIKE`` pattern of a judged wake address.
HEARD_WAKE: Final = "pg:" + HEARD.replace("_", "!_") + "%"


def _named(conn: psycopg.Connection[Any], name: str) -> bool:
    """Name ``conn``'s session ``name`` (and never end it for idling: a listener
    waits for as long as it runs); True when the server shows it by that name.
    Refused statements are no failure (the connection still listens): False."""
    try:
        conn.execute("SELECT set_config('application_name', %s, false)", (name,))
        with contextlib.suppress(psycopg.Error):  # (a server before 14 has no such setting)
            conn.execute("SET idle_session_timeout = 0")
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE pid = pg_backend_pid() AND application_name = %s",
            (name,),
        ).fetchone()
    except psycopg.Error:  # (pg_stat_activity not readable: a revoked grant)
        if conn.broken:
            raise  # lost: the caller tries again at the next reconnect
        return False
    return bool(row is not None and row[0] == 1)


class PgListener:
    """A ``LISTEN`` channel on a connection of its own (a holder's wake-up address).

    ``fileno()`` is the socket to wait on (None while disconnected); after it is
    readable, :meth:`receive` returns the payloads rung, never blocking. Used by
    one task at a time. A lost connection makes :meth:`receive` return None (rings
    may have been missed: the caller sweeps) and is reopened by :meth:`reconnect`,
    which blocks while it connects (on gevent: off the hub).

    The connection is named after the channel (see the module docstring). A
    ``channel`` of the judged form that its first connection does not show by
    that name -- or that could not connect at all -- is renamed to the plain
    form before anyone learns it: ``address`` is the name it listens on.
    """

    def __init__(self, connect: Any, channel: str) -> None:
        self.channel = channel
        self._connect = connect
        self._conn: psycopg.Connection[Any] | None = None
        self._closed = False
        self._open(first=True)
        self.address = f"pg:{self.channel}"
        track(self)

    def __repr__(self) -> str:
        return f"<PgListener pg:{self.channel}>"

    def _forked(self) -> None:
        """In the child of a fork: the parent's channel; never read nor closed here."""
        self._conn = None
        self._closed = True

    def _plain(self) -> None:
        """Nobody may judge this channel by its connection (see the class docstring)."""
        if self.channel.startswith(HEARD):
            self.channel = "subagents_" + self.channel[len(HEARD) :]

    def _open(self, first: bool = False) -> bool:
        try:
            conn = self._connect()
        except psycopg.Error:
            if first:
                self._plain()
            return False
        try:
            if not _named(conn, self.channel) and first:
                self._plain()  # (its session keeps the other name: nobody judges by it)
            conn.execute(f'LISTEN "{self.channel}"')
        except psycopg.Error:  # (a hot standby refuses it): tried again at reconnect
            conn.close()  # else one connection left open a reconnect, until no slot is left
            return False
        self._conn = conn
        return True

    def fileno(self) -> int | None:
        """The connection's socket (readable when a notification may be waiting), or ``None``."""
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            return None
        return int(conn.pgconn.socket)

    def receive(self) -> list[bytes] | None:
        """The payloads waiting (never blocks); None when the connection is lost."""
        if self._closed:
            return []
        conn = self._conn
        if conn is None:
            return None
        out: list[bytes] = []
        try:
            pgconn = conn.pgconn
            pgconn.consume_input()
            while (note := pgconn.notifies()) is not None:
                try:
                    out.append(bytes.fromhex(note.extra.decode()))
                except ValueError:
                    continue  # not one of ours
        except psycopg.Error:
            conn.close()
            self._conn = None
            return None
        return out

    def reconnect(self) -> bool:
        """Reopen a lost connection (blocks while connecting); True when listening."""
        if self._closed:
            return False
        return self._conn is not None or self._open()

    def drop(self) -> None:
        """Let the connection go, as lost (:meth:`fileno` is None, :meth:`reconnect`
        reopens it): the server no longer shows it -- a NAT, a firewall or a
        failover dropped it on the way, and nothing reached this socket to say so."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def close(self) -> None:
        """Stop listening and close its connection. Idempotent."""
        self._closed = True
        if self._conn is not None:
            self._conn.close()
            self._conn = None
