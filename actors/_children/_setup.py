"""Setup contributions: deployment capabilities composed into continuable children.

``register_continuable_setup(contribution)`` adds a callable that is run with
each newly materialized child's *unpublished* scope (a :class:`ContinuableScope`)
and may return a release callable. New grants wait for the next Activation;
disposing the registration revokes it from every scope that holds it before
``dispose()`` returns; a scope is released (every release run, newest first)
when its agent is disposed -- at settlement, or by a rolled-back materialization.

Contributions and releases are user code: they run in the thread that
materializes, revokes or disposes, never inside an actor of the runtime and never
under a lock. Each scope keeps its installations under a small lock that is only
held to move a release callable in or out, so a revocation racing an
installation or a release runs each release exactly once.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from subagents.actors._agents import Agent, check_tool_fn
from subagents.protocol import ErrorCode, SubagentError

__all__ = ["ContinuableScope", "Contribution", "SetupRegistration", "SetupRegistry"]

logger = logging.getLogger("subagents")

Contribution = Callable[["ContinuableScope"], "Callable[[], object] | None"]


def _run_release(release: Callable[[], object] | None, what: str) -> None:
    if release is None:
        return
    try:
        release()
    except Exception:
        logger.exception("%s a setup contribution failed", what)


class SetupRegistration:
    """Returned by ``register_continuable_setup``; ``dispose()`` revokes at once."""

    def __init__(self, registry: SetupRegistry, contribution: Contribution) -> None:
        self._registry = registry
        self.contribution = contribution
        self.revoked = False

    def dispose(self) -> None:
        """Revoke from every child that holds it (idempotent)."""
        self._registry._revoke(self)


class ContinuableScope:
    """The unpublished scope of a continuable child that setup contributions extend."""

    __slots__ = ("_closed", "_lock", "_releases", "agent", "child_id", "parent_session")

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.child_id = agent.session_id
        self.parent_session = agent.parent_session
        self._lock = threading.Lock()
        self._releases: dict[SetupRegistration, Callable[[], object] | None] = {}
        self._closed = False

    def add_tool(self, name: str, fn: Callable[..., Any]) -> Callable[[], None]:
        """Give this child a tool ``fn(turn, ...)``; returns its remover.

        Raises:
            SubagentError: ``INVALID_ARGUMENT`` for an empty name, or a ``fn`` that
                is not callable or cannot take the turn first.
        """
        if type(name) is not str or not name or not callable(fn):
            raise SubagentError(
                "a tool is a non-empty name and a callable", code=ErrorCode.INVALID_ARGUMENT
            )
        check_tool_fn(fn, name)
        tools = self.agent.extra_tools
        tools[name] = fn
        return lambda: tools.pop(name, None) and None

    def _install(self, registration: SetupRegistration) -> None:
        returned = registration.contribution(self)
        release = returned if callable(returned) else None
        with self._lock:
            if not registration.revoked and not self._closed:
                self._releases[registration] = release
                return
        _run_release(release, "undoing")  # revoked (or released) meanwhile

    def _revoke(self, registration: SetupRegistration) -> None:
        with self._lock:
            if registration not in self._releases:
                return
            release = self._releases.pop(registration)
        _run_release(release, "revoking")

    def _release_all(self) -> None:
        with self._lock:
            self._closed = True
            releases = list(self._releases.values())
            self._releases.clear()
        for release in reversed(releases):
            _run_release(release, f"releasing ({self.child_id})")


class SetupRegistry:
    """The registered contributions and the scopes that hold them. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._registrations: list[SetupRegistration] = []
        self._scopes: set[ContinuableScope] = set()

    def register(self, contribution: Any) -> SetupRegistration:
        """Add ``contribution(scope)`` for every child materialized from now on.

        Raises:
            SubagentError: ``INVALID_ARGUMENT`` for a non-callable.
        """
        if not callable(contribution):
            raise SubagentError(
                "a setup contribution is callable(scope)", code=ErrorCode.INVALID_ARGUMENT
            )
        registration = SetupRegistration(self, contribution)
        with self._lock:
            self._registrations.append(registration)
        return registration

    def install(self, agent: Agent) -> ContinuableScope | None:
        """Run every contribution on ``agent``'s new scope; released when it is disposed.

        None when nothing is registered: a grant registered later waits for the
        next Activation, so the child needs no scope (about half a KiB each, for
        10,000 resident children). A contribution that raises propagates (the
        materialization rolls back, and disposing the agent releases what was
        installed so far).
        """
        with self._lock:
            registrations = list(self._registrations)
            if not registrations:
                return None
            scope = ContinuableScope(agent)
            self._scopes.add(scope)
        agent.add_dispose_listener(lambda _agent: self._release(scope))
        for registration in registrations:
            scope._install(registration)
        return scope

    def _release(self, scope: ContinuableScope) -> None:
        with self._lock:
            self._scopes.discard(scope)
        scope._release_all()

    def _revoke(self, registration: SetupRegistration) -> None:
        with self._lock:
            if registration.revoked:
                return
            registration.revoked = True
            self._registrations.remove(registration)
            scopes = list(self._scopes)
        for scope in scopes:
            scope._revoke(registration)
