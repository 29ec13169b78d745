"""Who each listed child is: its durable identity, from the ``subagent`` unit only.

The projection fold is the single classification authority; nothing here parses
a descriptor. Per candidate, in order:

* a live child -- the projection registry's watermark snapshot of its session;
* a cold child -- a durable projection-cache row, when its ``seq`` proves it comes
  from the child's own log (at or after ``header.seed_len``, past any fork seed);
  a throwing cache read renders no verdict and falls through silently;
* else one persistence inspection (``INSPECTION_CONCURRENCY`` at a time; many of
  them a chunk of logs and headers per two statements, :mod:`._batch`), folded
  through the registry, whose header must still be the enumerated one (a
  re-published id degrades to a ``corrupt`` diagnostic); its identity is cached
  (a writable store).

A settled candidate without identity is ``corrupt``; a failed inspection is
``unavailable`` (retried next time); a running candidate without identity yet is
omitted, and so is one deleted since it was enumerated (its log or header gone:
``SESSION_NOT_FOUND``), which no longer exists and is not damaged.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any, Final

from subagents.protocol import (
    ErrorCode,
    Event,
    SessionHeader,
    SessionId,
    SubagentError,
    packb,
    unpackb,
)
from subagents.store import SessionStore

from ._batch import BATCH_FROM, Folded, inspect_chunks
from ._corpus import Corpus, LiveSessions
from ._projections import ProjectionRegistry
from ._rows import Diagnostic
from ._runner import Runner, SignalLike, check

__all__ = ["IDENTITY_CACHE_MAX", "INSPECTION_CONCURRENCY", "MISS", "Identities", "cancelled"]

logger = logging.getLogger("subagents")

#: How many persistence inspections one listing runs at once.
INSPECTION_CONCURRENCY = 8
#: Decoded identities a catalog remembers, by the exact bytes of their cache row
#: (equal bytes decode to equal identities, so a changed row is decoded anew).
#: Unpacking was a fifth of a warm listing of 100,000; a full memo is cleared.
IDENTITY_CACHE_MAX = 131_072
MISS: Final[Any] = object()  # no usable cached identity

Read = Callable[..., Any]  # read(fn, signal, *args): a persistence read, checked around


def cancelled(exc: BaseException) -> bool:
    """Whether ``exc`` is the listing's own cancellation (never swallowed)."""
    return isinstance(exc, SubagentError) and exc.code == ErrorCode.CANCELLED


class Identities:
    """Classifies listing candidates (see the module docstring)."""

    def __init__(
        self,
        sessions: LiveSessions | None,
        persistence: SessionStore | None,
        runner: Runner,
        read: Read,
    ) -> None:
        self._sessions = sessions
        self._persistence = persistence
        self._runner = runner
        self._read = read
        self._known: dict[bytes, Any] = {}  # see IDENTITY_CACHE_MAX
        #: Told of each log an inspection folded (see :data:`~._batch.Folded`).
        self.folded: Folded | None = None

    def _live(self, projections: ProjectionRegistry, sid: SessionId, signal: SignalLike) -> Any:
        sessions = self._sessions
        assert sessions is not None

        def read_from(seq: int) -> Iterable[tuple[int, Event]]:
            # Past the watermark a live log may start in persistence (the live tail
            # is trimmed once committed): a persistence read, checked around.
            check(signal)
            records = sessions.read(sid, seq)
            check(signal)
            return ((r.seq, r.event) for r in records)

        live = sessions.live(sid)
        if live is None:  # it left the live set since the listing found it: fold it whole
            states = projections.fold(read_from(0))
        else:
            _, states = projections.snapshot(live, read_from)
        return projections.values(states).get("subagent")

    def _cache_rows(
        self, ids: list[SessionId], signal: SignalLike, *, whole_store: bool
    ) -> Callable[[SessionId], Any]:
        """A lookup of cached identity rows: one read for a big listing (of every row
        when the listing covers the store anyway, else of ``ids``' rows), per id for
        a small one."""
        store = self._persistence
        if store is None:
            return lambda _sid: None
        if len(ids) >= 64:
            try:
                if whole_store:
                    rows = self._read(store.get_projections, signal, "subagent")
                else:
                    rows = self._read(store.get_projections_of, signal, "subagent", ids)
            except Exception as exc:  # derived data: a broken cache renders no verdict
                if cancelled(exc):
                    raise
                rows = None
            if rows is not None:
                lookup: Callable[[SessionId], Any] = rows.get
                return lookup

        def one(sid: SessionId) -> Any:
            try:
                return self._read(store.get_projection, signal, sid, "subagent")
            except Exception as exc:  # derived data: a broken cache row renders no verdict
                if cancelled(exc):
                    raise
                return None

        return one

    def _cached(self, header: SessionHeader, found: Any) -> Any:
        """The cached identity (``None``: cached as absent), or :data:`MISS`."""
        if found is None:
            return MISS
        seq, data = found
        if seq < header.seed_len:
            return MISS  # folded inside the fork seed: not the child's own identity
        known = self._known
        value = known.get(data, MISS)
        if value is not MISS:
            return value
        try:
            value = unpackb(data)
        except Exception:
            return MISS
        if value is not None and not _identity_shaped(value):
            return MISS  # derived data gone wrong: the log decides
        if len(known) >= IDENTITY_CACHE_MAX:
            known.clear()
        known[data] = value
        return value

    def _inspect(
        self, projections: ProjectionRegistry, header: SessionHeader, signal: SignalLike
    ) -> tuple[str, Any]:
        """``("ok", identity-or-None)``, ``("corrupt", why)``, ``("unavailable", why)`` or
        ``("gone", None)`` (deleted since it was enumerated: no row, no diagnostic)."""
        store = self._persistence
        assert store is not None
        try:
            records = self._read(store.read, signal, header.id, 0)
            current = self._read(store.header, signal, header.id)
        except SubagentError as exc:
            if exc.code == ErrorCode.CANCELLED:
                raise
            if exc.code == ErrorCode.CORRUPT_RECORD:
                return "corrupt", str(exc)
            if exc.code == ErrorCode.SESSION_NOT_FOUND:
                return "gone", None
            return "unavailable", str(exc)
        except Exception as exc:
            return "unavailable", repr(exc)
        if current is None:
            return "gone", None
        # The enumerated lifecycle: the whole header (only the depth floor may rise).
        if replace(current, delegation_depth=header.delegation_depth) != header:
            return "corrupt", "the session was re-published while it was being listed"
        states = projections.fold((r.seq, r.event) for r in records)
        if self.folded is not None:
            self.folded(header.id, records, states)
        identity = projections.values(states).get("subagent")
        op = self._cache_op(header, states.get("subagent"), records, identity)
        if op is not None:
            self._remember([op], signal)
        return "ok", identity

    def _cache_op(
        self, header: SessionHeader, raw: Any, records: list[Any], identity: Any
    ) -> tuple[Any, ...] | None:
        """The write that caches an inspected identity (``write_many``'s op), or
        None: a read-only store, or a fold that cannot prove it postdates a seed."""
        store = self._persistence
        if getattr(store, "read_only", False) or not hasattr(store, "put_projection"):
            return None
        # Where the identity was folded (a unit that does not say is never cached).
        seq = raw.get("seq", -1) if isinstance(raw, dict) else (records[-1].seq if records else -1)
        if seq < header.seed_len:
            return None
        return ("projection", header.id, "subagent", seq, packb(identity))

    def _remember(self, ops: list[tuple[Any, ...]], signal: SignalLike) -> None:
        """Write cache ops (one batch); never raises but for the listing's
        cancellation: the cache is derived data."""
        store = self._persistence
        try:
            if len(ops) == 1:
                _, sid, unit, seq, data = ops[0]
                self._read(store.put_projection, signal, sid, unit, seq, data)  # type: ignore[union-attr]
            elif ops:
                self._read(store.write_many, signal, ops)  # type: ignore[union-attr]
        except Exception as exc:
            if cancelled(exc):
                raise
            logger.debug("could not cache %d identities", len(ops), exc_info=True)

    def classify(
        self,
        projections: ProjectionRegistry,
        corpus: Corpus,
        heads: list[SessionHeader],
        signal: SignalLike,
    ) -> tuple[dict[SessionId, Any], list[Diagnostic]]:
        """Identity per candidate (rows to make) and diagnostics.

        Takes the candidates' headers, not their ids: on a 100,000-node tree every
        lookup in the 100,000-entry maps is a likely cache miss, so each row does
        as few of them as it can.
        """
        served: dict[SessionId, Any] = {}
        diagnostics: dict[SessionId, Diagnostic] = {}
        to_inspect: deque[SessionHeader] = deque()
        live = corpus.live
        cold = [h.id for h in heads if h.id not in live] if live else [h.id for h in heads]
        if corpus.identities is not None:
            cache: Callable[[SessionId], Any] = corpus.identities.get
        elif cold:
            cache = self._cache_rows(cold, signal, whole_store=corpus.whole_store)
        else:
            cache = lambda _sid: None  # noqa: E731
        cached = self._cached
        for header in heads:
            sid = header.id
            if live and sid in live:
                try:
                    identity = self._live(projections, sid, signal)
                except Exception as exc:  # its log could not be read: like an inspection
                    if cancelled(exc):
                        raise
                    if (
                        self._persistence is not None
                        and isinstance(exc, SubagentError)
                        and exc.code == ErrorCode.SESSION_NOT_FOUND
                    ):
                        continue  # deleted since the listing found it (a start rolled back)
                    corrupt = (
                        isinstance(exc, SubagentError) and exc.code == ErrorCode.CORRUPT_RECORD
                    )
                    diagnostics[sid] = Diagnostic(
                        id=sid, kind="corrupt" if corrupt else "unavailable", detail=str(exc)
                    )
                    continue
                if identity is not None:
                    served[sid] = identity
                continue  # a running candidate without identity yet is omitted
            identity = cached(header, cache(sid))
            if identity is MISS:
                if self._persistence is not None:
                    to_inspect.append(header)
            elif identity is None:
                diagnostics[sid] = Diagnostic(
                    id=sid, kind="corrupt", detail="no identity in its log"
                )
            else:
                served[sid] = identity
        if to_inspect:
            self._inspect_all(projections, to_inspect, signal, served, diagnostics)
        if not diagnostics:
            return served, []
        return served, [diagnostics[h.id] for h in heads if h.id in diagnostics]

    def _inspect_all(
        self,
        projections: ProjectionRegistry,
        queue: deque[SessionHeader],
        signal: SignalLike,
        served: dict[SessionId, Any],
        diagnostics: dict[SessionId, Diagnostic],
    ) -> None:
        lock = threading.Lock()
        failure: list[BaseException] = []

        def verdict_of(header: SessionHeader, verdict: str, detail: Any) -> None:
            if verdict == "ok" and detail is not None:
                served[header.id] = detail
            elif verdict == "ok":
                live = self._sessions
                if live is not None and live.live(header.id) is not None:
                    return  # live since the listing's snapshot: running, no identity yet
                diagnostics[header.id] = Diagnostic(
                    id=header.id, kind="corrupt", detail="no identity in its log"
                )
            elif verdict != "gone":  # a deleted candidate is left out
                diagnostics[header.id] = Diagnostic(id=header.id, kind=verdict, detail=str(detail))

        store = self._persistence
        if len(queue) >= BATCH_FROM and hasattr(store, "headers_many"):
            # A big listing: a few statements per chunk, not two per candidate.
            found = inspect_chunks(store, self._read, signal, projections, list(queue), self.folded)
            ops: list[tuple[Any, ...]] = []
            for header, verdict, detail, raw in found:
                op = None if raw is None else self._cache_op(header, raw[0], raw[1], detail)
                if op is not None:
                    ops.append(op)
                verdict_of(header, verdict, detail)
            self._remember(ops, signal)  # one commit for them all, not one each
            check(signal)
            return

        def worker() -> None:
            while True:
                with lock:
                    if not queue or failure:
                        return
                    header = queue.popleft()
                try:
                    verdict, detail = self._inspect(projections, header, signal)
                except BaseException as exc:
                    with lock:
                        failure.append(exc)
                    return
                with lock:
                    verdict_of(header, verdict, detail)

        if len(queue) == 1:
            worker()
        else:
            tasks = [
                self._runner.spawn(worker, name="subagents-inspect")
                for _ in range(min(INSPECTION_CONCURRENCY, len(queue)))
            ]
            for task in tasks:
                task.join()
        if failure:
            raise failure[0]
        check(signal)


def _identity_shaped(value: Any) -> bool:
    """Whether a cached identity is one a listing can serve: a mode of the two, a
    label that is text or none (a damaged row is a miss, not a row of garbage)."""
    return (
        isinstance(value, dict)
        and value.get("mode") in ("one-shot", "continuable")
        and (value.get("label") is None or type(value.get("label")) is str)
    )
