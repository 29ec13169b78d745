"""The subagent service's reads: its catalog listings and a child's statistics.

Part of :class:`~._service.SubagentService` (a mixin): the durable catalog is
read through one :class:`~subagents.actors._catalog.Catalog` per runtime, made
for the mounted session store and projections and kept while they stay mounted.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from subagents.actors._agents import AgentRegistry, SessionService
from subagents.actors._catalog import Catalog, Listing, ProjectionRegistry
from subagents.actors._kernel import AbortSignal, Backend, Telemetry
from subagents.protocol import SessionId

from ._child_stats import ChildStatistics, child_statistics
from ._continuation import ContinuationManager
from ._validate import check_signal

__all__ = ["CatalogReads", "ServiceContext"]


class ServiceContext(Protocol):
    """The mount points the service reads per operation (a ``Runtime`` is one)."""

    @property
    def agents(self) -> AgentRegistry: ...
    @property
    def sessions(self) -> SessionService: ...
    @property
    def session_projections(self) -> ProjectionRegistry | None: ...
    @property
    def backend(self) -> Backend: ...
    @property
    def telemetry(self) -> Telemetry | None: ...


class CatalogReads:
    """Mixed into :class:`~._service.SubagentService` (which sets the members below)."""

    _ctx: ServiceContext
    _continuation: ContinuationManager
    _check_thread: Callable[[], None]
    _check_process: Callable[[], None]
    # (sessions, projections, the Catalog for them): made by the first read.
    _catalog_for: tuple[Any, Any, Catalog] | None = None

    def _catalog(self, signal: Any) -> Catalog:
        """The runtime's one catalog, for its mounted session store and projections."""
        check_signal(signal)
        ctx = self._ctx
        sessions: SessionService | None = getattr(ctx, "sessions", None)
        if sessions is not None:
            sessions.check_kept()  # closed, no store: its children ended with it
        projections = ctx.session_projections
        cached = self._catalog_for
        if cached is None or cached[0] is not sessions or cached[1] is not projections:
            catalog = Catalog(
                sessions,
                sessions.persistence if sessions is not None else None,
                projections,
                ctx.backend,
                live_store_mounted=sessions is not None,
            )
            self._catalog_for = cached = (sessions, projections, catalog)
        return cached[2]

    # -- the durable catalog -----------------------------------------------------------

    def list_children(
        self, parent_session_id: SessionId | str, signal: AbortSignal | None = None
    ) -> Listing:
        """Direct session-backed subagents of a session, without loading them.

        Rows carry ``id``, ``mode``, ``label``, ``activity`` (``running`` /
        ``inactive``), ``has_children`` and ``created_at``, ordered by creation then
        id; ``diagnostics`` name children that are ``corrupt`` or ``unavailable``.

        Raises:
            SubagentError: ``CANCELLED``, ``SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE``,
                ``SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE``, ``INVALID_ARGUMENT``,
                ``STORE_CLOSED`` (the runtime closed).
        """
        self._check_thread()
        return self._catalog(signal).list_children(parent_session_id, signal)

    def statistics(self, child_id: SessionId | str) -> ChildStatistics:
        """A continuable child as this runtime sees it (see :class:`ChildStatistics`).

        Raises:
            SubagentError: ``INVALID_ARGUMENT``, ``SESSION_NOT_FOUND``.
        """
        self._check_process()
        return child_statistics(self._continuation, self._ctx.sessions, child_id)

    def list_descendants(
        self, root_session_id: SessionId | str, signal: AbortSignal | None = None
    ) -> Listing:
        """The root's complete session tree in stable pre-order (adds ``parent_id``, ``depth``).

        Raises:
            SubagentError: as :meth:`list_children`.
        """
        self._check_thread()
        return self._catalog(signal).list_descendants(root_session_id, signal)
