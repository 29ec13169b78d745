"""Finding a provider's placement, and the parent's side of a placed child's
follow-up and release (see :mod:`._placed` for the stand-in itself)."""

from __future__ import annotations

import logging
import os
import urllib.parse
from collections.abc import Callable
from typing import Any

from subagents.actors._agents import kept
from subagents.protocol import (
    ContinuableDescriptor,
    ErrorCode,
    SessionHeader,
    SessionId,
    SubagentError,
    trusted_message,
    try_fold_subagent_descriptor,
)
from subagents.store import is_postgres_url, redacted_url

from ._placed import PlacedChild, Placement

__all__ = [
    "PlacementLookup",
    "check_same_store",
    "followup_placed",
    "placement_of",
    "release_placed",
]

logger = logging.getLogger("subagents")


def check_same_store(provider: Any, store: Any) -> None:
    """``INVALID_ARGUMENT`` when ``provider`` places its children on hosts that open
    another store than ``store`` (its ``placement.store``: a path, or a
    ``postgresql://`` URL): their starts would be accepted and never run. The
    same SQLite file by another spelling, or the same PostgreSQL schema, is the
    same store; what cannot be told apart is let through."""
    placement = getattr(provider, "placement", None)
    where = getattr(placement, "store", None)
    if not isinstance(where, str) or store is None:
        return
    here = getattr(store, "path", None) or getattr(store, "url", None)
    if not isinstance(here, str):
        return
    if is_postgres_url(where) != is_postgres_url(here):
        same = False
    elif is_postgres_url(where):
        same = _schema_of(where) == _schema_of(here)
    else:
        same = os.path.realpath(where) == os.path.realpath(here)
    if not same:
        raise SubagentError(
            f"provider {getattr(provider, 'name', '?')!r} places its children on hosts of"
            f" {redacted_url(where)!r}, not this runtime's store {redacted_url(here)!r}",
            code=ErrorCode.INVALID_ARGUMENT,
        )


def _schema_of(url: str) -> str | None:
    values = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query).get("schema")
    return values[0] if values else None


class PlacementLookup:
    """Which children are placed, and how: from the provider that created them.

    ``names`` and ``get`` are the provider registry's. A child's provider is read
    from its descriptor -- only while some registered provider places children --
    and remembered (a bounded memory: past :data:`_REMEMBER` children it starts
    over).
    """

    def __init__(
        self, names: Callable[[], list[str]], get: Callable[[str], Any], sessions: Any
    ) -> None:
        self._names = names
        self._get = get
        self._sessions = sessions
        self._known: dict[SessionId, tuple[ContinuableDescriptor, SessionHeader] | None] = {}

    @staticmethod
    def placement(provider: Any) -> Placement | None:
        """The provider's placement, or None when it runs children here."""
        placement: Placement | None = getattr(provider, "placement", None)
        return placement

    def of(
        self, child_id: SessionId
    ) -> tuple[Placement, ContinuableDescriptor, SessionHeader] | None:
        """The placement of ``child_id``, its descriptor and header, or None (it
        runs here)."""
        if not any(self.placement(self._get(n)) is not None for n in self._names()):
            return None
        if child_id in self._known:
            known = self._known[child_id]
        else:
            known = self._descriptor(child_id)
            if len(self._known) >= _REMEMBER:
                self._known.clear()
            self._known[child_id] = known
        if known is None:
            return None
        placement = self.placement(self._get(known[0].provider))
        return None if placement is None else (placement, *known)

    def _descriptor(
        self, child_id: SessionId
    ) -> tuple[ContinuableDescriptor, SessionHeader] | None:
        header = self._sessions.header(child_id)
        if header is None:
            return None
        records = self._sessions.read(child_id, header.seed_len)
        fold = try_fold_subagent_descriptor(r.event for r in records)
        descriptor = fold.descriptor
        if fold.verdict == "ok" and isinstance(descriptor, ContinuableDescriptor):
            return descriptor, header
        return None


_REMEMBER = 65536


def placement_of(provider: Any, sessions: Any) -> Placement | None:
    """The placement of a provider a continuable child is started through, or
    None (it runs here).

    Raises:
        SubagentError: ``PERSISTENCE_UNAVAILABLE`` when it places children and the
            runtime's store is not durable with strict durability: a host can only
            run what is committed.
    """
    placement = PlacementLookup.placement(provider)
    if placement is not None and not (sessions.strict and sessions.leases is not None):
        raise SubagentError(
            f"provider {provider.name!r} places children on other hosts: it needs a durable"
            " store shared with them and durability='strict'",
            code=ErrorCode.PERSISTENCE_UNAVAILABLE,
        )
    return placement


def followup_placed(sessions: Any, child: PlacedChild, delivery: Any) -> bool:
    """A follow-up to a resident placed child: committed to its durable inbox, taken
    by nobody, then admitted (True: accepted, or a duplicate). False: the child
    is retiring; the delivery is marked committed, for the registry to route."""
    event = trusted_message(delivery.message_id, delivery.content, delivery.source)
    limit = child.header.max_inbox
    (accepted,) = sessions.accept(child.session_id, (event,), limit=limit)
    if accepted.duplicate:
        delivery.duplicate = True
        return True
    delivery.committed = True
    delivery.accepted_at = accepted.at
    try:
        return child.admit_followup(delivery.content, delivery.source, delivery.message_id, True)
    except BaseException as exc:  # refused (drained): nothing stays accepted ...
        if kept(sessions, child.session_id, delivery.message_id, exc, accepted.at):
            return True  # ... unless it is not ours to take back (see kept)
        delivery.committed = False
        raise


def release_placed(activations: list[Any], cause: str) -> None:
    """Release the placed children among ``activations`` now, deepest first (the
    runtime closes: their hosts keep nothing resident for a parent that left)."""
    placed = [a for a in activations if isinstance(a.agent, PlacedChild)]  # settling too
    for act in sorted(placed, key=lambda a: a.depth, reverse=True):
        act.agent.release(cause)
