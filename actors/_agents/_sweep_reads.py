"""What the mail pickup's sweep asks the store (see :mod:`._mail`): the mail that
waits for this runtime's sessions, and the accepted work nobody will run.

Work nobody runs is an *orphan*: its lease is free (released, or expired), or --
asked apart, so a failure of one question leaves the other's answer -- it is
held by a holder of this host whose process ended. A worker killed with SIGKILL
leaves its leases live until they expire (the lease ttl, 30 s by default); its
siblings on the host, or the worker a supervisor restarts in its place, take its
work up at their next sweep instead (the lease is taken over as a dead holder's,
see :class:`~subagents.store.Holder`). Another host's holders cannot be judged:
their work waits for the expiry.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from subagents.protocol import SessionId
from subagents.store import SessionStore

__all__ = ["SweepReads"]


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
