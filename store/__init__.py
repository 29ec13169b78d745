"""``subagents.store``: durable and live session storage.

Theory of operation. A *session* is a header (its durable identity: id, parent,
origin, delegation-depth floor, creation time, label), an append-only log of
protocol events numbered ``seq = 0, 1, 2, ...`` without gaps, and at most one
checkpoint (an opaque folded-state blob valid through some seq, so a cold resume
need not replay the whole log), plus a projection cache (schema v2): per session
and projection unit, a derived value and the seq it was folded at, droppable at
will since it is rebuilt from the logs. :class:`SessionStore` is the contract; two
implementations ship:

* :class:`MemoryStore`: live only, keeps event objects as given (no encoding),
  one lock, a few microseconds per append. Used for ``Runtime(store=None)`` and as
  the live store beside a durable one.
* :class:`SqliteStore`: one SQLite file in WAL mode, msgpack rows encoded by
  :mod:`subagents.protocol`, concurrent appends group-committed into one
  transaction, every append durable (``synchronous=FULL``) when it returns. Many
  threads and several processes may write to one file.

What the store owns: the bytes on disk, seq assignment, atomicity of a batch,
schema identification and migration (:data:`SCHEMA_VERSION`). What it never
does: interpret events (folding, projections, residency and the tree belong to
the layers above), start threads, or write to a file it has not identified as
its own: a foreign file, or one from a newer version, is refused untouched.

Every failure is a :class:`~subagents.protocol.SubagentError` with a code:
``SESSION_NOT_FOUND``, ``SESSION_EXISTS``, ``CORRUPT_RECORD``
(:class:`~subagents.protocol.CorruptRecordError`, naming session and seq; seq
``-1`` is the header; a row whose key is no session id names it as a
:class:`StoredKey`), ``NOT_A_DATABASE`` (not an SQLite file, or another
application's), ``DATABASE_CORRUPT`` (an SQLite file SQLite finds damaged --
truncated, overwritten pages -- at open or at any later read or write; the
message carries SQLite's text), ``SCHEMA_TOO_NEW``,
``PERSISTENCE_UNAVAILABLE`` (and ``TIMEOUT`` for a write lock held too long by
another process), ``STORE_CLOSED``, ``INVALID_ARGUMENT`` and, for
event content the codec cannot pack, ``ENCODE_ERROR``.
"""

from typing import TYPE_CHECKING

from ._base import LogRecord, SessionStore
from ._committed import StoreStatistics
from ._critical import critical, defer_interrupt, set_interrupt_delivery
from ._durable import Accepted, InboxEntry, Lease, LeaseToken, Listener, NewLease, Release
from ._holders import Holder, holder_ended
from ._keys import StoredKey
from ._location import is_postgres_url, redacted_url
from ._memory import MemoryStore
from ._open import open_store
from ._presence import Presence, presence_ended
from ._promises import Promises
from ._schema import APPLICATION_ID, MIGRATIONS, SCHEMA_VERSION
from ._sqlite import SqliteStore

if TYPE_CHECKING:  # imported lazily at run time (see __getattr__ below)
    from ._pg_schema import PG_SCHEMA_VERSION
    from ._postgres import PgListener, PostgresStore

__all__ = [
    "APPLICATION_ID",
    "MIGRATIONS",
    "PG_SCHEMA_VERSION",
    "SCHEMA_VERSION",
    "Accepted",
    "Holder",
    "InboxEntry",
    "Lease",
    "LeaseToken",
    "Listener",
    "LogRecord",
    "MemoryStore",
    "NewLease",
    "PgListener",
    "PostgresStore",
    "Presence",
    "Promises",
    "Release",
    "SessionStore",
    "SqliteStore",
    "StoreStatistics",
    "StoredKey",
    "critical",
    "defer_interrupt",
    "holder_ended",
    "is_postgres_url",
    "open_store",
    "presence_ended",
    "redacted_url",
    "set_interrupt_delivery",
]

_POSTGRES = frozenset({"PG_SCHEMA_VERSION", "PgListener", "PostgresStore"})


def __getattr__(name: str) -> object:
    # The PostgreSQL store needs psycopg (the ``postgres`` extra): imported on
    # first use, so the rest of the layer works without it.
    if name in _POSTGRES:
        from . import _pg_schema, _postgres

        return getattr(_postgres, name, None) or getattr(_pg_schema, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
