"""Lease holders: who holds a session's lease, and whether a holder has ended (its
lease then counts as gone at once, rather than at its expiry): a holder of this
host by its pid; one of any host whose store can tell it no longer listens
(:meth:`Holder.unheard`) once it stayed unheard for a grace period.

A holder's id is ``host:pid:nonce``, ``host`` naming this machine's name and --
where there is one -- its boot and the PID namespace its pids belong to: a pid
means something only there (two workers of one host name in different PID
namespaces, containers sharing the host's network, must not judge each other by
it). Nothing here needs the actor runtime: the command line's readers use it.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Iterable

from ._presence import presence_ended

__all__ = ["Holder", "holder_ended"]


def _host() -> str:
    """This host as lease holders name it: its name, and -- where there is one --
    the boot and PID namespace its pids belong to. A holder's pid means something
    only there: two workers of one host name in different PID namespaces (a
    container sharing the host's network) must not judge each other by it."""
    name = socket.gethostname().replace(":", "_")
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()[:8]
        space = os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return name
    return f"{name}~{boot}.{space}"


_HOST = _host()
#: What every holder id of this host starts with.
_KIN = f"{_HOST}:"


class Holder:
    """A lease holder's identity: ``host:pid:nonce``; and who else is known dead.

    Thread-safe: its judgements are replaced whole, never changed in place.
    """

    __slots__ = ("_gone", "_unheard", "id", "pid")

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.id = f"{_HOST}:{self.pid}:{uuid.uuid4().hex[:12]}"
        # Holders the store found unheard at every look since (monotonic seconds),
        # and those of them unheard for the grace period: judged gone.
        self._unheard: dict[str, float] = {}
        self._gone: frozenset[str] = frozenset()

    def __repr__(self) -> str:
        return f"<Holder {self.id}>"

    @property
    def kin(self) -> str:
        """The prefix of every holder id of this host (whose processes :meth:`dead`
        can judge): what :meth:`DurableQueues.leased_work` is asked for."""
        return _KIN

    def dead(self, other: str, wake: str | None = None) -> bool:
        """True when ``other`` is a holder of this host whose process has ended, one
        whose presence at ``wake`` (its lease's wake address) ended, or one
        :meth:`unheard` judged gone at its last judgement."""
        return other != self.id and (other in self._gone or holder_ended(other, wake))

    def unheard(
        self, found: Iterable[str], grace: float, now: float | None = None
    ) -> frozenset[str]:
        """Judge the holders a store found unheard now (``found``: see
        ``DurableQueues.unheard_work``), and return those gone: found at every look
        for ``grace`` seconds (``now``: monotonic, read when None). A holder heard
        at a look -- or found with no work -- starts again: a listener that lost its
        connection reconnects within moments, and a live process must not lose its
        sessions for a blip. A judgement replaces the last one."""
        at = time.monotonic() if now is None else now
        last = self._unheard
        unheard = {h: last.get(h, at) for h in found if h != self.id}
        self._unheard = unheard
        self._gone = gone = frozenset(h for h, since in unheard.items() if at - since >= grace)
        return gone

    def recheck_at(self, grace: float) -> float | None:
        """When (monotonic) the next judgement could find another holder gone: the
        first unheard holder's grace ends then (None: no holder is in question)."""
        due = [since + grace for h, since in self._unheard.items() if h not in self._gone]
        return min(due) if due else None


def holder_ended(holder: str, wake: str | None = None) -> bool:
    """True when ``holder`` (a lease holder's id) names a process of this host that
    has ended -- or awaits its reaping --, or when ``wake`` (its lease's wake
    address) is a presence whose process ended (see
    :meth:`~subagents.store.SqliteStore.listen`: in any PID namespace); False for
    this process, and when nothing can be said (another host's, an id of another
    form, an address without a presence)."""
    if presence_ended(wake):
        return True
    host, _, rest = holder.partition(":")
    pid_text, _, _nonce = rest.partition(":")
    if host != _HOST or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False  # another runtime of this process: it is alive
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # someone else's: alive, unless it ended and awaits its reaping
    return _unreaped(pid)


def _unreaped(pid: int) -> bool:
    """Whether ``pid`` ended and only awaits its parent's ``wait`` (a zombie, which
    ``kill(pid, 0)`` still finds: a supervisor that kills a worker and resumes its
    sessions before reaping it). Where there is no ``/proc``, it counts as alive."""
    # (A main thread that exited on its own while other threads run shows "Z" too;
    # no Python process does that. The threads of a killed one may still be
    # tearing down as its main thread shows "Z": it is dead all the same.)
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    end = stat.rfind(b")")  # the command name, in parentheses, may hold anything
    return stat[end + 2 : end + 3] in (b"Z", b"X")
