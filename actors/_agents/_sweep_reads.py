"""What the mail pickup's sweep asks the store (see :mod:`._mail`): the mail that
waits for this runtime's sessions, and the accepted work nobody will run.

Work nobody runs is an *orphan*: its lease is free (released, or expired), or --
asked apart, so a failure of one question leaves the other's answer -- it is
held by a holder of this host whose process ended. A worker killed with SIGKILL
leaves its leases live until they expire (the lease ttl, 30 s by default); its
siblings on the host, or the worker a supervisor restarts in its place, take its
work up at their next sweep instead (the lease is taken over as a dead holder's,
see :class:`~subagents.store.Holder`). Another host's holder is judged by the
store where it can tell (PostgreSQL: the holder's listening connection is gone,
see :meth:`~subagents.store.PostgresStore.unheard_work`): unheard at every sweep
for :func:`unheard_grace` -- a sweep is made for the grace's end -- its work is
taken up; elsewhere, and for a host that vanished without closing its
connections, the work waits for the lease's expiry.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from subagents.protocol import SessionId
from subagents.store import SessionStore

__all__ = ["SweepReads", "unheard_grace"]

logger = logging.getLogger("subagents")


def unheard_grace(ttl: float) -> float:
    """Seconds a holder must stay unheard before its work is taken up: a sixth of
    the lease ttl (5 s by default), at least a second (a listener reconnects in
    less), at most half the ttl (else the expiry comes first)."""
    return min(max(ttl / 6, 1.0), ttl / 2)


def _taking_up(found: list[tuple[SessionId, str]], gone: Iterable[str], why: str) -> None:
    """Log (INFO) each holder in ``gone`` and how many sessions of ``found`` (``(session,
    holder)``) it leaves: an operator's question is why their sessions moved."""
    counts = Counter(by for _sid, by in found)
    for by in sorted(gone):
        logger.info("lease holder %s %s: taking up its work in %d session(s)", by, why, counts[by])


class SweepReads:
    """Mixed into :class:`~._sessions.SessionService` (which provides the members
    below); each read runs off the hub where the store blocks."""

    persistence: SessionStore | None
    leases: Any  # ._leases.Leases | None

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def waiting(self, holder: str) -> list[SessionId]:
        """Sessions ``holder`` leases that have messages nobody took."""
        store = self.persistence
        assert store is not None
        sessions: list[SessionId] = self._call(store.waiting, holder)
        return sessions

    def orphans(self) -> list[SessionId]:
        """Sessions with accepted work whose lease is free now, by the store's clock
        (nobody will run it)."""
        store, leases = self.persistence, self.leases
        assert store is not None
        assert leases is not None
        sessions: list[SessionId] = self._call(store.orphans, leases.now())
        return sessions

    def abandoned(self) -> list[SessionId]:
        """Sessions with accepted work whose live lease a holder of this host holds
        whose process ended (nobody will run it before the lease expires)."""
        store, leases = self.persistence, self.leases
        assert store is not None
        assert leases is not None
        holder = leases.holder
        held: list[tuple[SessionId, str]] = self._call(store.leased_work, holder.kin, leases.now())
        ended: dict[str, bool] = {}  # asked once a holder (a signal and a read each)
        for _sid, by in held:
            if by not in ended:
                ended[by] = holder.dead(by)
        return [sid for sid, by in held if ended[by]]

    def ended(self) -> list[SessionId]:
        """Sessions with accepted work under the live lease of a holder -- in any PID
        namespace -- whose presence the store finds ended (SQLite: its lock is
        free, see :meth:`~subagents.store.SqliteStore.ended_work`): no grace, the
        kernel let go of the lock as the process ended."""
        store, leases = self.persistence, self.leases
        assert store is not None
        assert leases is not None
        found: list[tuple[SessionId, str]] = self._call(store.ended_work, leases.now())
        _taking_up(found, {by for _sid, by in found}, "has ended (its presence lock is free)")
        return [sid for sid, _by in found]

    def unheard(self, deaf: Callable[[], object] | None = None) -> list[SessionId]:
        """Sessions with accepted work under the live lease of a holder -- of any
        host -- the store found unheard at every sweep for :func:`unheard_grace`
        (its process ended: nobody will run the work before the lease expires).

        ``deaf`` is called when this holder's own work is among what the store
        found: its listening connection is gone from the server though the
        process runs (dropped silently on the way: no FIN reached it), so its
        rings are lost and the others are about to take its sessions.
        """
        store, leases = self.persistence, self.leases
        assert store is not None
        assert leases is not None
        found: list[tuple[SessionId, str]] = self._call(store.unheard_work, leases.now())
        me = leases.holder.id
        if deaf is not None and any(by == me for _sid, by in found):
            deaf()
        grace = unheard_grace(leases.ttl)
        gone = leases.holder.unheard({by for _sid, by in found}, grace)
        _taking_up(found, gone, f"is gone (unheard for {grace:.1f} s)")
        return [sid for sid, by in found if by in gone]

    def recheck_at(self) -> float | None:
        """When (monotonic) a sweep could find an unheard holder's grace over (None:
        none is in question): the mail task sweeps then, not a period later."""
        leases = self.leases
        if leases is None:
            return None
        at: float | None = leases.holder.recheck_at(unheard_grace(leases.ttl))
        return at
