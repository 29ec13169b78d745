"""Many persistence inspections in a few statements (a listing of a big store).

One inspection per candidate (:meth:`~._identity.Identities._inspect`) is a log
read and a header read: two round trips a session, which on PostgreSQL were
most of ``subagents tree`` (5,000 uncached sessions, 18 s) -- a read-only reader
never caches what it folded, so every listing paid them again. On an SQL store
(``headers_many``) a chunk of candidates is two statements here; each verdict is
the one the single inspection gives: ``corrupt`` for a log or header that does
not decode or a header re-published since the listing enumerated it, ``gone``
for a session deleted since, ``unavailable`` (every candidate of the chunk) for
a read that failed as a whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any, Final

from subagents.protocol import (
    CorruptRecordError,
    ErrorCode,
    SessionHeader,
    SessionId,
    SubagentError,
)

from ._projections import ProjectionRegistry

__all__ = ["BATCH_FROM", "CHUNK", "Folded", "inspect_chunks"]

#: Fewer candidates than this are inspected one by one (a small listing's few
#: round trips cost less than reading a whole chunk's logs at once).
BATCH_FROM: Final = 16
#: Candidates per chunk: the logs of one chunk are in memory at once.
CHUNK: Final = 500

#: Told of each log folded (id, its records, the raw states): a reader that needs
#: more of a log than its identity (``subagents tree``) folds it once.
Folded = Callable[[SessionId, list[Any], dict[str, Any]], None]

Read = Callable[..., Any]


def _verdict(
    projections: ProjectionRegistry,
    header: SessionHeader,
    log: Any,
    current: Any,
    folded: Folded | None,
) -> tuple[str, Any, Any]:
    """``(verdict, detail, raw identity state)`` of one candidate, as
    :meth:`~._identity.Identities._inspect` decides it from the same two reads."""
    if isinstance(log, CorruptRecordError):
        return "corrupt", str(log), None
    if log is None:
        return "gone", None, None
    if isinstance(current, CorruptRecordError):
        return "corrupt", str(current), None
    if current is None:
        return "gone", None, None
    # The enumerated lifecycle: the whole header (only the depth floor may rise).
    if replace(current, delegation_depth=header.delegation_depth) != header:
        return "corrupt", "the session was re-published while it was being listed", None
    states = projections.fold((r.seq, r.event) for r in log)
    if folded is not None:
        folded(header.id, log, states)
    identity = projections.values(states).get("subagent")
    return "ok", identity, (states.get("subagent"), log)


def inspect_chunks(
    store: Any,
    read: Read,
    signal: Any,
    projections: ProjectionRegistry,
    heads: Sequence[SessionHeader],
    folded: Folded | None = None,
) -> Iterator[tuple[SessionHeader, str, Any, Any]]:
    """``(header, verdict, detail, (raw identity state, log) or None)`` of each of
    ``heads``, a chunk of :data:`CHUNK` read at a time. ``read(fn, signal, *args)``
    runs a read (checked around it); a read of a chunk that fails makes each of its
    candidates ``unavailable`` (the listing's own cancellation is raised)."""
    for start in range(0, len(heads), CHUNK):
        chunk = heads[start : start + CHUNK]
        ids = [h.id for h in chunk]
        try:
            logs = read(store.read_many, signal, ids)
            currents = read(store.headers_many, signal, ids)
        except SubagentError as exc:
            if exc.code == ErrorCode.CANCELLED:
                raise
            failed: str | None = str(exc)
        except Exception as exc:
            failed = repr(exc)
        else:
            failed = None
        if failed is not None:
            for header in chunk:
                yield header, "unavailable", failed, None
            continue
        for header in chunk:
            sid = header.id
            verdict, detail, raw = _verdict(
                projections, header, logs.get(sid), currents.get(sid), folded
            )
            yield header, verdict, detail, raw
