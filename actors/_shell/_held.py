"""Whether a live process holds a stored session, as the command line reads it.

A reader that is no runtime has no registry to ask: a session is live somewhere
when its lease is taken and not expired, its holder is no process of this host
that has ended nor one whose presence ended (SQLite: its lock beside the file is
free, in whatever PID namespace it ran), and -- where the store can tell
(PostgreSQL) -- the holder of its
accepted work still listens (``unheard_work``). That is one look: a holder whose
listener is reconnecting at that moment shows its work ``waiting`` (a runtime's
sweep waits a grace before it judges).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from subagents.protocol import SessionId, SubagentError
from subagents.store import Lease, holder_ended

__all__ = ["held_now", "lease_held"]


def _live(lease: Lease | None, now: float) -> bool:
    return (
        lease is not None
        and lease.holder is not None
        and lease.expires > now
        and not holder_ended(lease.holder, lease.wake)
    )


def _now(store: Any) -> float:
    """The store's clock, which leases expire by (a server's, on PostgreSQL)."""
    clock = getattr(store, "clock", None)
    return time.time() if clock is None else float(clock())


def _unheard(store: Any, now: float) -> set[SessionId]:
    """Sessions with accepted work whose holder the store finds unheard (see the
    module docstring); none where it cannot say."""
    ask = getattr(store, "unheard_work", None)
    if ask is None:
        return set()
    try:
        return {sid for sid, _holder in ask(now)}
    except SubagentError:
        return set()


def lease_held(store: Any, sid: object) -> bool:
    """Whether a live process holds ``sid``; True where the store keeps no leases
    or cannot say. A turn a session's log shows open is running only then: its
    process may have ended mid-turn."""
    get = getattr(store, "get_lease", None)
    if get is None or not isinstance(sid, SessionId):
        return True
    try:
        now = _now(store)
        return _live(get(sid), now) and sid not in _unheard(store, now)
    except SubagentError:
        return True


def held_now(store: Any, sids: Sequence[SessionId]) -> set[SessionId] | None:
    """Which of ``sids`` a live process holds, in one read; None where the store
    keeps no leases or cannot say."""
    get = getattr(store, "get_leases", None)
    if get is None:
        return None
    try:
        leases = get(sids) if sids else {}
        now = _now(store)
    except SubagentError:
        return None
    held = {sid for sid, lease in leases.items() if _live(lease, now)}
    return held - _unheard(store, now) if held else held
