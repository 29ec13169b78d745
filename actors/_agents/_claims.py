"""One activation of a session at a time, in this runtime.

Making a persisted session live (a resume, a send to a cold session, a parent
resumed for a follow-up by its id) takes the session's lease before anything
else. The store lets a holder take its own lease again at the next epoch, so two
activations of one session racing in one runtime both "won" it: the later one
then failed to attach (``SESSION_EXISTS``) and gave the lease up, leaving the
earlier agent live with a lease that no longer existed (``LEASE_LOST`` on its
next write), and messages accepted in between ran twice or were refused after
they had run. An agent disposing without waiting (``dispose(wait=False)``) is
the same race against its own release, which comes later, in its actor's
``on_stop``.

So an activation first *claims* the session here, before its lease is touched:
while one is in flight, or the session's previous agent is still disposing, a
second caller waits for it (up to :data:`CLAIM_WAIT` seconds) and then finds the
agent live, or claims the session itself. Callers that must not wait (the
registry actor, a fresh session's creation) are refused at once with
``SESSION_EXISTS``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from subagents.protocol import ErrorCode, SessionId, SubagentError

from ._agent import Agent
from ._host import AgentHost

__all__ = ["CLAIM_WAIT", "SessionClaims", "live_here", "runtime_closed"]

#: How long a second activation of a session waits for the first (or for the
#: previous agent's disposal) before it is refused with ``SESSION_EXISTS``.
CLAIM_WAIT = 30.0


class SessionClaims:
    """Sessions being activated, and agents still disposing, by session id.

    Shares the agent registry's lock: a claim is decided against the registered
    agents in the same critical section.
    """

    __slots__ = ("_activating", "_host", "_live", "_lock", "stopping")

    def __init__(self, host: AgentHost, lock: Any, live: dict[SessionId, Agent]) -> None:
        self._host = host
        self._lock = lock
        self._live = live
        #: In flight: the claim's waiters' event (``None`` until one waits).
        self._activating: dict[SessionId, Any] = {}
        #: Left the registry and still disposing: each leaves as its disposal ends.
        self.stopping: dict[SessionId, Agent] = {}

    def claim(self, sid: SessionId, *, wait: bool = True) -> Agent | None:
        """Claim ``sid`` for an activation here (``None``: the caller activates it,
        then calls :meth:`unclaim`), or return its agent, live meanwhile.

        Raises:
            SubagentError: ``SESSION_EXISTS`` when another activation or disposal
                here has not ended (at once with ``wait=False``, else after
                :data:`CLAIM_WAIT` seconds); ``WRONG_THREAD`` where this thread may
                not wait.
        """
        deadline: float | None = None
        while True:
            wait_for: Callable[[float], object]
            with self._lock:
                agent = self._live.get(sid)
                if agent is not None:
                    return agent
                if sid in self._activating:
                    event = self._activating[sid]
                    if event is None:
                        event = self._activating[sid] = self._host.backend.event()
                    wait_for = event.wait
                    what = "being activated"
                elif (old := self.stopping.get(sid)) is not None and not old.session.released:
                    # (Once its session is released, what is left of its disposal --
                    # its dispose listeners: a child's epoch ending, which may
                    # activate it again at once -- does not hold the session.)
                    wait_for = old.wait_disposed
                    what = "still disposing its previous agent"
                elif self._host.sessions.live(sid) is not None:
                    wait_for = _never  # opened and not yet registered: being created
                    what = "being created"
                else:
                    self._activating[sid] = None
                    return None
            now = time.monotonic()
            if deadline is None:
                deadline = now + CLAIM_WAIT
            if not wait or wait_for is _never or now >= deadline:
                raise SubagentError(f"session {sid} is {what} here", code=ErrorCode.SESSION_EXISTS)
            self._host.check_thread()
            wait_for(deadline - now)

    def unclaim(self, sid: SessionId) -> None:
        """The activation of ``sid`` ended (its agent registered, or it failed)."""
        with self._lock:
            event = self._activating.pop(sid, None)
        if event is not None:
            event.set()

    def wait_none(self, timeout: float) -> bool:
        """Wait until no activation is in flight (True), or ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if not self._activating:
                    return True
                sid, event = next(iter(self._activating.items()))
                if event is None:
                    event = self._activating[sid] = self._host.backend.event()
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            event.wait(left)

    def drop(self, sid: SessionId) -> Any:
        """:meth:`unclaim` inside the registry's lock (registering in the same step):
        returns the waiters' event, for the caller to set once out of it."""
        return self._activating.pop(sid, None)

    def left(self, agent: Agent) -> None:
        """``agent`` left the registry to dispose (under the registry's lock)."""
        self.stopping[agent.session_id] = agent

    def released(self, agent: Agent) -> None:
        """``agent`` finished disposing: its session may be activated again."""
        with self._lock:
            if self.stopping.get(agent.session_id) is agent:
                del self.stopping[agent.session_id]


def _never(_timeout: float) -> object:  # pragma: no cover - never called
    raise AssertionError("not waited for")


def runtime_closed() -> SubagentError:
    """``RUNTIME_CLOSED``: what an activation, or a call the closed runtime's actors
    would answer, gets once the runtime closes."""
    return SubagentError("the runtime was closed", code=ErrorCode.RUNTIME_CLOSED)


def live_here(sid: SessionId) -> SubagentError:
    """``SESSION_EXISTS``: an activation of ``sid`` (a ``resume``, a create) met the
    agent live in this runtime -- as one is after a ``send`` or a follow-up by id
    resumed it here, or the sweep adopted it -- so the message says where it is."""
    return SubagentError(
        f"an agent for {sid} is live in this runtime: agents.get(session_id) returns it",
        code=ErrorCode.SESSION_EXISTS,
        hint={"session_id": sid},
    )
