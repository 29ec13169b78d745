"""What :class:`~subagents.store.SqliteStore` adds for runtimes in other PID or
network namespaces (containers sharing the file): a listener in the file's
meeting place, and the accepted work of holders whose presence ended (see
:mod:`._presence`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

from subagents.protocol import SessionId

from ._base import store_closed
from ._cells import stored_session_id
from ._presence import Presence, clear_stale, meeting_place, presence_ended
from ._queue_reads import WORK_LEASES
from ._queue_txn import EXPIRY
from ._validate import check_seconds

__all__ = ["SqlitePresence"]

#: Accepted work under a live lease whose wake address is a socket file's path.
_PATH_WORK: Final = f"{WORK_LEASES} WHERE l.wake LIKE '/%' AND {EXPIRY} > ?"
#: The wake addresses (of those asked: ``{}``) a live lease records.
_LIVE_WAKES: Final = (
    "SELECT DISTINCT l.wake FROM leases l LEFT JOIN holders h ON h.holder = l.holder"
    " WHERE l.wake IN ({}) AND l.holder IS NOT NULL AND " + EXPIRY + " > ?"
)


class SqlitePresence:
    """Mixed into :class:`~subagents.store.SqliteStore` (which provides the members
    below)."""

    path: str
    read_only: bool
    _closed: bool

    if TYPE_CHECKING:  # (first in the store's bases: these must not shadow its own)

        def _query(self, sql: str, params: tuple[Any, ...]) -> list[Any]: ...
        def clock(self) -> float: ...

    def listen(self) -> Presence | None:
        """This runtime's presence in the file's meeting place, ``<path>-wake/`` (see
        :mod:`subagents.store._presence`): a doorbell any process using the file
        reaches -- from another network namespace too -- and a lock whose end tells
        them this process ended. None where there can be none (a read-only store,
        a folder that cannot be written, a path too long for a socket). Clears the
        files of ended presences no live lease names any more."""
        if self._closed:
            raise store_closed(self)
        if self.read_only:
            return None
        directory = meeting_place(self.path)
        clear_stale(directory, self._live_wakes)
        return Presence.open(directory)

    def _live_wakes(self, addresses: Iterable[str]) -> set[str]:
        asked = list(addresses)
        found: set[str] = set()
        for at in range(0, len(asked), 500):  # (SQLite's bound on parameters)
            chunk = asked[at : at + 500]
            sql = _LIVE_WAKES.format(", ".join("?" * len(chunk)))
            found.update(r[0] for r in self._query(sql, (*chunk, self.clock())))
        return found

    def ended_work(self, now: float) -> list[tuple[SessionId, str]]:
        """``(session, holder)`` of accepted work under a lease live at ``now`` whose
        holder's presence ended (its lock is free: its process is gone, on any
        PID namespace of this kernel). Each such lease's acquisition finds it free
        (``acquire_lease``, given ``dead``) -- no grace: a lock is not a guess."""
        at = check_seconds(now, "now")
        rows = self._query(_PATH_WORK, (at,))
        ended: dict[str, bool] = {}  # asked once a presence
        found: list[tuple[SessionId, str]] = []
        for key, holder, wake in rows:
            sid = stored_session_id(key)
            if sid is None or type(holder) is not str:
                continue  # a damaged row: left out, the others answered
            if wake not in ended:
                ended[wake] = presence_ended(wake)
            if ended[wake]:
                found.append((sid, holder))
        return found
