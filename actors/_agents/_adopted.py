"""Top-level agents a sweep adopted: let go once they have been quiet a while.

A top-level agent never settles: the user who spawned or resumed it disposes it.
One this runtime's mail *adopted* -- the sweep found work waiting for a session
nobody held (``AgentRegistry.resume_waiting``), or woke a top-level agent to run
an orphaned child's work below it (``_children/_remote.adopt``) -- has no such
user here. Kept resident, it would hold its lease for the adopting runtime's
life: the adopter accumulates them, and the process that owns the session (a
restarted worker resuming it) meets ``LEASE_HELD`` for ever.

:class:`Adoptions` lets such an agent go -- disposes it, which writes its
checkpoint and releases its lease, so the session's next activation may be in
any process -- once it has been *quiet* for ``grace`` seconds:

* idle: nothing queued, no turn (:attr:`Agent.idle`, since ``idle_since``);
* no continuable child of it in this runtime's Activation index (``children``,
  set by the runtime): a child keeps its parent resident until it settles;
* no work of it outliving its turns (:meth:`hold`: background runs, whose
  results come back as messages);
* no message of it in doubt (``Agent._in_doubt``, and the hand-overs of
  ``SessionService.doubts``).

A message arriving during the grace keeps it: the agent is busy again, and the
grace restarts when it next goes idle (its idle listener re-arms the alarm).
One arriving as it is let go meets the agent's gate, which closes only while
nothing is in flight (``Inbox.close_if_idle``, one atomic step): admitted before,
it keeps the agent; refused after, it goes where a message to a session nobody
holds here goes -- a ``send`` commits it and resumes the session; a message
another process committed is found by the lease's release (``Release.WAITING``)
and the session adopted again. Nothing accepted is lost either way.

An agent this runtime's user asks to resume while it is adopted here is kept
(:meth:`keep`) and handed to the caller: from then on it is the user's, as one
the user spawned or resumed, and never let go this way.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import Any

from subagents.actors._kernel import Alarm, Backend
from subagents.protocol import SessionId, SubagentError

from ._agent import Agent

__all__ = ["Adoptions"]

logger = logging.getLogger("subagents")

#: Sessions let go that a runtime remembers (:meth:`Adoptions.taken_back`).
_LET_GO_MAX = 1024

#: Seconds between looks at an adopted agent kept only by its children (no
#: notice reaches it when a child settles): at least this, at least the grace.
_RECHECK = 1.0


class Adoptions:
    """The adopted top-level agents of one runtime (see the module docstring).
    Thread-safe; ``grace=inf`` keeps every adopted agent (none is let go)."""

    def __init__(self, backend: Backend, grace: float = math.inf) -> None:
        self.grace = grace
        #: ``children(session_id)``: whether a continuable child of it is resident
        #: here (or being materialized): the runtime's, which knows the index.
        self.children: Callable[[SessionId], bool] = lambda _sid: False
        self._lock = threading.Lock()  # held for a dict operation, never a call out
        self._adopted: dict[SessionId, Agent] = {}
        # Sessions let go here, for :meth:`taken_back` (insertion order: the oldest
        # forgotten first past _LET_GO_MAX).
        self._let_go: dict[SessionId, None] = {}
        self._holds: dict[Agent, int] = {}  # work outliving its turns, by agent
        self._alarm = Alarm(backend, self._due, name="subagents-adopted")

    def add(self, agent: Agent) -> None:
        """``agent`` was activated by the sweep, for no user here: let it go once
        quiet (never, with an infinite grace: it waits for a user's :meth:`keep`)."""
        with self._lock:
            if agent._disposed:
                return
            self._adopted[agent.session_id] = agent
        agent.add_dispose_listener(self._forget)
        if self.grace == math.inf:
            return
        agent.add_idle_listener(self._idle)
        self._alarm.at(agent.idle_since + self.grace)  # idle already: due from then

    def adopt_held(self, agent: Agent) -> Callable[[], None]:
        """:meth:`add` ``agent``, held (:meth:`hold`) until the returned release:
        adopted at once, so a user's resume is handed it, but not let go before
        what it was woken for (a child below it) keeps it."""
        release = self.hold(agent)
        self.add(agent)
        return release

    def keep(self, session_id: SessionId) -> Agent | None:
        """The user asked for ``session_id``: if it is adopted here, it stays, and is
        returned (None: not adopted, or let go already -- then it is disposing)."""
        with self._lock:
            return self._adopted.pop(session_id, None)

    def taken_back(self, session_id: SessionId) -> bool:
        """Whether ``session_id`` was let go here (forgotten as it is asked): work
        that waits for it now was committed as it was let go -- its release found
        it -- and this runtime adopts it again, also one that adopts nothing else
        (``Runtime(adopt=False)``: it was asked to run it, by a ``send``)."""
        with self._lock:
            if session_id not in self._let_go:
                return False
            del self._let_go[session_id]
            return True

    def adopted(self, session_id: SessionId) -> bool:
        """Whether the agent of ``session_id`` is live here as an adoption."""
        return session_id in self._adopted

    def hold(self, agent: Agent) -> Callable[[], None]:
        """Keep ``agent`` from being let go until the returned release is called
        (once; later calls do nothing): work it started that outlives its turns.
        Counted for every top-level agent, adopted or not: the sweep may adopt
        one whose first turn starts such work before it is marked."""
        with self._lock:
            self._holds[agent] = self._holds.get(agent, 0) + 1
        once = threading.Lock()

        def release() -> None:
            if not once.acquire(blocking=False):
                return
            with self._lock:  # (none left once the agent was disposed)
                left = max(self._holds.pop(agent, 0) - 1, 0)
                if left:
                    self._holds[agent] = left
            if not left and agent.session_id in self._adopted:
                self._alarm.at(time.monotonic() + self.grace)

        return release

    def close(self) -> None:
        """The runtime closes (it disposes every agent itself): no more let-go."""
        self._alarm.close()

    # -- the alarm's side ------------------------------------------------------------

    def _idle(self, agent: Any) -> None:
        # In the agent's loop, each time it goes idle: due a grace from now.
        if agent.session_id in self._adopted:
            self._alarm.at(agent.idle_since + self.grace)

    def _forget(self, agent: Any) -> None:
        # Disposed (let go, by its user, by the runtime's close): nothing to track.
        sid = agent.session_id
        with self._lock:
            if self._adopted.get(sid) is agent:
                del self._adopted[sid]
            self._holds.pop(agent, None)

    def _due(self) -> None:
        """The alarm: let go every adopted agent quiet for the grace; look again at
        the others when they may be (a busy one's idle listener re-arms it)."""
        now = time.monotonic()
        with self._lock:
            adopted = list(self._adopted.values())
        for agent in adopted:
            if agent._disposed or not agent.idle:
                continue
            due = agent.idle_since + self.grace
            if due > now:
                self._alarm.at(due)
            elif self._kept(agent):
                self._alarm.at(now + max(self.grace, _RECHECK))
            else:
                self.let_go(agent, wait=False)

    def _kept(self, agent: Agent) -> bool:
        """Whether something other than its inbox keeps ``agent`` resident."""
        sid = agent.session_id
        doubts = agent._host.sessions.doubts.held(sid) or agent._in_doubt()
        return bool(agent in self._holds or doubts or self.children(sid))

    def let_go(self, agent: Agent, *, wait: bool) -> bool:
        """Dispose the adopted ``agent`` if it is still adopted and idle (True)."""
        sid = agent.session_id
        with self._lock:  # (the gate's lock is taken inside: never the other way)
            # Kept by the user meanwhile, or gone: it stays. The gate closes only
            # while nothing is in flight: a message admitted before keeps the agent
            # (its idle listener re-arms the alarm), one after is refused (the
            # module docstring says where it goes then).
            if self._adopted.get(sid) is not agent or not agent.close_if_idle():
                return False
            del self._adopted[sid]
            if len(self._let_go) >= _LET_GO_MAX:
                del self._let_go[next(iter(self._let_go))]
            self._let_go[sid] = None
        logger.debug("letting go of %s, adopted and quiet", sid)
        try:
            agent.dispose(wait=wait)  # its checkpoint, then its lease released
        except SubagentError as exc:
            logger.warning("letting go of the adopted %s failed: %s", sid, exc)
        return True
