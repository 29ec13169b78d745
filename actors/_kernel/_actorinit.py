"""What ``pykka.Actor.__init__`` sets, without what our runtimes throw away.

pykka's constructor makes a ``threading.Event`` for ``actor_stopped`` (a condition,
a lock and a deque) that the gevent runtime replaced at once with a gevent event,
and a ``uuid.uuid4()`` for the actor's urn (16 bytes from the OS and a ``UUID``
object, built and formatted for one string). Both runtimes' actors set the same
four fields here instead, the urn in the same form (``urn:uuid:`` and a version-4
UUID) counted up from a random start. The body copied is pinned by
:data:`._pykka.INIT_SOURCE_SHA256`.
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import pykka

__all__ = ["init_actor", "new_urn"]

# Version 4 and the RFC 4122 variant, as uuid.uuid4() sets them.
_CLEAR = ~((0xF000 << 64) | (0xC000 << 48)) & ((1 << 128) - 1)
_SET = (0x4000 << 64) | (0x8000 << 48)


class _Urns:
    """Process-unique version-4 UUIDs: a random 128-bit start counted up (a urn only
    has to be unique among this process's actors: the registry is per process)."""

    __slots__ = ("_counter",)

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self._counter = itertools.count(int.from_bytes(os.urandom(16), "big") >> 1)

    def new(self) -> str:
        # next() on itertools.count is atomic under the GIL.
        h = "%032x" % (next(self._counter) & _CLEAR | _SET)
        return f"urn:uuid:{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


_urns = _Urns()
# A forked child's actors must not repeat the parent's urns.
os.register_at_fork(after_in_child=_urns.reset)
#: ``urn:uuid:`` and a version-4 UUID, as ``uuid.uuid4().urn`` gives.
new_urn = _urns.new


def init_actor(actor: pykka.Actor, stopped: Any) -> None:
    """Set ``actor``'s urn, inbox, ``actor_stopped`` (``stopped``) and ref: the body
    of ``pykka.Actor.__init__`` with the runtime's own stopped event."""
    actor.actor_urn = new_urn()
    actor.actor_inbox = actor._create_actor_inbox()
    actor.actor_stopped = stopped
    actor._actor_ref = pykka.ActorRef(actor)
