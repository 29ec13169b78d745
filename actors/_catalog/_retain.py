"""What a session leaves behind when it leaves the live set: its cached identity.

A listing of a cold child reads its identity from the durable projection cache
before it inspects the log; this writes that row when a session stops being live,
so a settled child is listed without reading its log.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from subagents.protocol import SessionHeader, SessionId

from ._projections import ProjectionRegistry

__all__ = ["retain_identity"]

logger = logging.getLogger("subagents")


class _Leaving(Protocol):
    projection_mark: Any

    @property
    def id(self) -> SessionId: ...
    @property
    def header(self) -> SessionHeader: ...


class _Sessions(Protocol):
    def read(self, session_id: SessionId, from_seq: int = 0) -> list[Any]: ...
    def cache_projection(
        self, live: Any, unit: str, seq: int, value: Any, *, shaped: bool = False
    ) -> None: ...


def retain_identity(
    sessions: _Sessions,
    persistent: bool,
    projections: ProjectionRegistry | None,
    live: _Leaving,
    descriptor: Any = None,
) -> None:
    """Cache ``live``'s identity (when persistent).

    A continuable child knows its descriptor (appended at creation, right after any
    fork seed, so at ``seed_len``): no log is read, and settling costs the same
    however long the log is. Other subagent sessions fold their (short) one-shot
    logs through the registry. Never raises: the cache is derived data.
    """
    if projections is None:
        return
    try:
        if persistent and "subagent" in projections:
            if descriptor is not None:
                value = {"mode": descriptor.mode, "label": descriptor.label}
                sessions.cache_projection(
                    live, "subagent", live.header.seed_len, value, shaped=True
                )
            elif live.header.origin == "subagent":
                _fold_and_cache(sessions, projections, live)
    except Exception:
        logger.exception("caching the identity of %s failed", live.id)


def _fold_and_cache(sessions: _Sessions, projections: ProjectionRegistry, live: _Leaving) -> None:
    def read_from(start: int) -> Any:
        return ((r.seq, r.event) for r in sessions.read(live.id, start))

    seq, states = projections.snapshot(live, read_from)
    raw = states.get("subagent")
    # The built-in unit records where its identity was decided; another unit's
    # value cannot prove it postdates a fork seed, so it is not cached.
    at = raw.get("seq") if isinstance(raw, dict) else (seq if raw is None else None)
    if seq >= 0 and isinstance(at, int) and at >= live.header.seed_len:
        sessions.cache_projection(live, "subagent", at, projections.values(states)["subagent"])
