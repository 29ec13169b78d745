"""The durable catalog: ``list_children`` and ``list_descendants``.

Theory of operation
-------------------
Listing reads the live session set and the optional persistence directly and
merges their headers, the live side winning (``activity`` is ``running`` for a
live session, ``inactive`` for one found only in persistence). It never consults
Activations, the agent registry or providers, and never loads or resumes a child.

Identity (mode + label) is served by the ``subagent`` projection unit, the single
classification authority:

* live child -- the projection registry's watermark snapshot of its session;
* cold child -- a durable projection-cache row, when its ``seq`` proves it comes
  from the child's own log (at or after ``header.seed_len``, past any fork seed);
  a throwing cache read falls through silently;
* else one persistence inspection (bounded concurrency), folded through the
  registry, whose header must still be the enumerated one (a re-published id
  degrades to a ``corrupt`` diagnostic).

A settled candidate without identity is ``corrupt``; a failed inspection is
``unavailable`` (retried next time); a running candidate without identity yet is
omitted. The caller's signal is checked before and after every persistence read;
any abort raises ``CANCELLED`` and no partial result is returned.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from subagents.actors._kernel._backend import THREADING, Backend
from subagents.actors._kernel._signal import AbortSignal
from subagents.protocol import (
    ErrorCode,
    Event,
    SessionHeader,
    SessionId,
    SubagentError,
    packb,
    unpackb,
)

from ._projections import ProjectionRegistry

if TYPE_CHECKING:
    from subagents.actors._agents._sessions import SessionService
    from subagents.store import SessionStore

__all__ = ["Catalog", "ChildRow", "DescendantRow", "Diagnostic", "Listing"]

logger = logging.getLogger("subagents")

#: How many persistence inspections one listing runs at once.
INSPECTION_CONCURRENCY = 8


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildRow:
    """One listed child."""

    id: SessionId
    mode: str
    label: str | None
    activity: str
    has_children: bool
    created_at: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class DescendantRow:
    """One listed descendant, with its durable parent and root-relative depth."""

    id: SessionId
    mode: str
    label: str | None
    activity: str
    has_children: bool
    created_at: Any
    parent_id: SessionId
    depth: int


_MISS: Any = object()  # no usable cached identity
#: Decoded identities a Catalog remembers, by the exact bytes of their cache row
#: (equal bytes decode to equal identities, so a changed row is decoded anew).
#: Unpacking was a fifth of a warm listing of 100,000; a full memo is cleared.
IDENTITY_CACHE_MAX = 131_072
_new = object.__new__
# The listing builds one row per node from values it checked itself; storing
# through the slot descriptors skips the frozen dataclass's per-field
# object.__setattr__ (half the cost of a row, 100,000 rows in a big listing).
_DESCENDANT_SETTERS = tuple(
    DescendantRow.__dict__[name].__set__
    for name in (
        "id",
        "mode",
        "label",
        "activity",
        "has_children",
        "created_at",
        "parent_id",
        "depth",
    )
)


def _descendant_row(*values: Any) -> DescendantRow:
    """A :class:`DescendantRow` from its field values, in declaration order."""
    row = _new(DescendantRow)
    for setter, value in zip(_DESCENDANT_SETTERS, values):
        setter(row, value)
    return row


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnostic:
    """A per-child problem: ``kind`` is ``"corrupt"`` or ``"unavailable"``."""

    id: SessionId
    kind: str
    detail: str


@dataclass(frozen=True, slots=True)
class Listing:
    """Rows (ordered by ``created_at`` then id) and diagnostics."""

    rows: tuple[Any, ...]
    diagnostics: tuple[Diagnostic, ...]

    def __iter__(self) -> Any:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


class _Index:
    __slots__ = ("broken", "children", "headers", "live", "whole_store")

    def __init__(self, *, whole_store: bool) -> None:
        self.whole_store = whole_store  # every stored header was read (not one family)
        self.headers: dict[SessionId, SessionHeader] = {}
        self.live: set[SessionId] = set()
        self.children: dict[SessionId, list[SessionId]] = {}
        self.broken: dict[SessionId, list[Diagnostic]] = {}  # by parent: undecodable headers


def _check(signal: AbortSignal) -> None:
    if signal.aborted:
        raise SubagentError("listing cancelled", code=ErrorCode.CANCELLED, hint=signal.reason)


class Catalog:
    """Listing over a live session set and optional persistence.

    ``sessions`` may be None for a reader of a database without a runtime (the
    CLI); ``projections`` is the mounted registry.
    """

    def __init__(
        self,
        sessions: SessionService | None,
        persistence: SessionStore | None,
        projections: ProjectionRegistry | None,
        backend: Backend = THREADING,
        *,
        live_store_mounted: bool = True,
    ) -> None:
        self._sessions = sessions
        self._persistence = persistence
        self._projections = projections
        self._backend = backend
        self._live_store_mounted = live_store_mounted
        self._identities: dict[bytes, Any] = {}  # see IDENTITY_CACHE_MAX

    def _require(self) -> ProjectionRegistry:
        if self._projections is None or "subagent" not in self._projections:
            raise SubagentError(
                "no session projection registry is mounted", code=ErrorCode.PROJECTIONS_UNAVAILABLE
            )
        if not self._live_store_mounted:
            raise SubagentError(
                "no session store is mounted", code=ErrorCode.SESSION_STORE_UNAVAILABLE
            )
        return self._projections

    def _read(self, fn: Callable[..., Any], signal: AbortSignal, *args: Any) -> Any:
        _check(signal)
        store = self._persistence
        if store is not None and store.blocking:
            result = self._backend.run_blocking(fn, *args)
        else:
            result = fn(*args)
        _check(signal)
        return result

    # -- the merged corpus ---------------------------------------------------------

    def _index(self, signal: AbortSignal) -> _Index:
        """The whole merged corpus (a tree listing walks all of it)."""
        index = _Index(whole_store=True)
        if self._persistence is not None:
            self._add_persisted(index, self._read(self._persistence.scan_headers, signal))
        self._add_live(index, None)
        return self._link(index)

    def _children_index(self, parent: SessionId, signal: AbortSignal) -> _Index:
        """Only ``parent``'s children and theirs (what ``has_children`` needs): two
        reads of the store's parent index, whatever the size of the store."""
        index = _Index(whole_store=False)
        store = self._persistence
        if store is not None:
            self._add_persisted(index, self._read(store.scan_children, signal, [parent]))
        self._add_live(index, {parent})
        kids = list(index.headers)
        if kids:
            if store is not None:
                self._add_persisted(index, self._read(store.scan_children, signal, kids))
            self._add_live(index, set(kids))
        return self._link(index)

    @staticmethod
    def _add_persisted(index: _Index, items: Iterable[Any]) -> None:
        for item in items:
            if isinstance(item, SessionHeader):
                index.headers[item.id] = item
                continue
            parent = (item.hint or {}).get("parent_session")
            if parent is not None:
                diag = Diagnostic(id=SessionId(item.session_id), kind="corrupt", detail=str(item))
                index.broken.setdefault(SessionId(parent), []).append(diag)

    def _add_live(self, index: _Index, parents: set[SessionId] | None) -> None:
        """Live sessions (all, or those whose parent is in ``parents``) over persisted ones."""
        sessions = self._sessions
        if sessions is None:
            return
        for sid in sessions.live_ids():
            live = sessions.live(sid)
            if live is not None and (parents is None or live.header.parent_session in parents):
                index.headers[sid] = live.header
                index.live.add(sid)

    @staticmethod
    def _link(index: _Index) -> _Index:
        headers: Any = index.headers.values()
        if index.live:  # persistence returns (created_at, id) order; live ones must merge in
            headers = sorted(headers, key=lambda h: (h.created_at, h.id))
        children = index.children
        for header in headers:
            parent = header.parent_session
            if parent is not None:
                siblings = children.get(parent)
                if siblings is None:
                    children[parent] = [header.id]
                else:
                    siblings.append(header.id)
        return index

    @staticmethod
    def _has_children(index: _Index, sid: SessionId) -> bool:
        kids = index.children.get(sid)
        if not kids:  # most nodes of a big tree are leaves: no generator for them
            return False
        headers = index.headers
        return any(headers[c].origin == "subagent" for c in kids)

    # -- identity --------------------------------------------------------------------

    def _live_identity(
        self, projections: ProjectionRegistry, sid: SessionId, signal: AbortSignal
    ) -> Any:
        sessions = self._sessions
        assert sessions is not None

        def read_from(seq: int) -> Iterable[tuple[int, Event]]:
            # Past the watermark a live log may start in persistence (the live tail
            # is trimmed once committed): a persistence read, checked around.
            _check(signal)
            records = sessions.read(sid, seq)
            _check(signal)
            return ((r.seq, r.event) for r in records)

        _, states = projections.snapshot(sid, read_from)
        return projections.values(states).get("subagent")

    def _cache_rows(
        self, ids: list[SessionId], signal: AbortSignal, *, whole_store: bool
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
            except SubagentError as exc:
                if exc.code == ErrorCode.CANCELLED:
                    raise
                rows = None
            except Exception:  # derived data: a broken cache renders no verdict
                rows = None
            if rows is not None:
                lookup: Callable[[SessionId], Any] = rows.get
                return lookup

        def one(sid: SessionId) -> Any:
            try:
                return self._read(store.get_projection, signal, sid, "subagent")
            except SubagentError as exc:
                if exc.code == ErrorCode.CANCELLED:
                    raise
                return None
            except Exception:  # derived data: a broken cache row renders no verdict
                return None

        return one

    def _cached_identity(self, header: SessionHeader, found: Any) -> Any:
        """The cached identity (``None``: cached as absent), or ``_MISS``."""
        if found is None:
            return _MISS
        seq, data = found
        if seq < header.seed_len:
            return _MISS  # folded inside the fork seed: not the child's own identity
        known = self._identities
        value = known.get(data, _MISS)
        if value is not _MISS:
            return value
        try:
            value = unpackb(data)
        except Exception:
            return _MISS
        if value is not None and not (isinstance(value, dict) and "mode" in value):
            return _MISS
        if len(known) >= IDENTITY_CACHE_MAX:
            known.clear()
        known[data] = value
        return value

    def _inspect(
        self, projections: ProjectionRegistry, header: SessionHeader, signal: AbortSignal
    ) -> tuple[str, Any]:
        """``("ok", identity-or-None)``, ``("corrupt", why)`` or ``("unavailable", why)``."""
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
            return "unavailable", str(exc)
        except Exception as exc:
            return "unavailable", repr(exc)
        # The enumerated lifecycle: the whole header (only the depth floor may rise).
        if current is None or replace(current, delegation_depth=header.delegation_depth) != header:
            return "corrupt", "the session was re-published while it was being listed"
        states = projections.fold((r.seq, r.event) for r in records)
        identity = projections.values(states).get("subagent")
        raw = states.get("subagent")
        # Where the identity was folded (a unit that does not say is never cached).
        seq = raw.get("seq", -1) if isinstance(raw, dict) else (records[-1].seq if records else -1)
        putter = getattr(store, "put_projection", None)
        if putter is not None and seq >= header.seed_len:
            try:
                self._read(putter, signal, header.id, "subagent", seq, packb(identity))
            except SubagentError as exc:
                if exc.code == ErrorCode.CANCELLED:
                    raise
            except Exception:
                logger.debug("could not cache the identity of %s", header.id, exc_info=True)
        return "ok", identity

    def _classify(
        self,
        projections: ProjectionRegistry,
        index: _Index,
        heads: list[SessionHeader],
        signal: AbortSignal,
    ) -> tuple[dict[SessionId, Any], list[Diagnostic]]:
        """Identity per candidate (rows to make) and diagnostics.

        Takes the candidates' headers, not their ids: on a 100,000-node tree every
        lookup in the 100,000-entry maps is a likely cache miss, so each row does
        as few of them as it can.
        """
        served: dict[SessionId, Any] = {}
        diagnostics: dict[SessionId, Diagnostic] = {}
        to_inspect: deque[SessionHeader] = deque()
        live = index.live
        cold = [h.id for h in heads if h.id not in live] if live else [h.id for h in heads]
        cache = (
            self._cache_rows(cold, signal, whole_store=index.whole_store)
            if cold
            else (lambda _sid: None)
        )
        cached_identity = self._cached_identity
        for header in heads:
            sid = header.id
            if live and sid in live:
                try:
                    identity = self._live_identity(projections, sid, signal)
                except Exception as exc:  # its log could not be read: like an inspection
                    if isinstance(exc, SubagentError) and exc.code == ErrorCode.CANCELLED:
                        raise
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
            identity = cached_identity(header, cache(sid))
            if identity is _MISS:
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
        signal: AbortSignal,
        served: dict[SessionId, Any],
        diagnostics: dict[SessionId, Diagnostic],
    ) -> None:
        lock = threading.Lock()
        failure: list[BaseException] = []

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
                    if verdict == "ok" and detail is not None:
                        served[header.id] = detail
                    elif verdict == "ok":
                        diagnostics[header.id] = Diagnostic(
                            id=header.id, kind="corrupt", detail="no identity in its log"
                        )
                    else:
                        diagnostics[header.id] = Diagnostic(
                            id=header.id, kind=verdict, detail=str(detail)
                        )

        if len(queue) == 1:
            worker()
        else:
            tasks = [
                self._backend.spawn(worker, name="subagents-inspect")
                for _ in range(min(INSPECTION_CONCURRENCY, len(queue)))
            ]
            for task in tasks:
                task.join()
        if failure:
            raise failure[0]
        _check(signal)

    # -- public ------------------------------------------------------------------------

    def _row(self, index: _Index, sid: SessionId, identity: Any) -> ChildRow:
        return ChildRow(
            id=sid,
            mode=identity["mode"],
            label=identity.get("label"),
            activity="running" if sid in index.live else "inactive",
            has_children=self._has_children(index, sid),
            created_at=index.headers[sid].created_at,
        )

    def list_children(
        self, parent_session_id: SessionId | str, signal: AbortSignal | None = None
    ) -> Listing:
        """Direct session-backed subagent children of ``parent_session_id``."""
        projections = self._require()
        signal = _signal(signal)
        pid = SessionId(parent_session_id)
        _check(signal)
        index = self._children_index(pid, signal)
        headers = index.headers
        heads = [
            h for h in (headers[c] for c in index.children.get(pid, [])) if h.origin == "subagent"
        ]
        served, diagnostics = self._classify(projections, index, heads, signal)
        rows = tuple(self._row(index, h.id, served[h.id]) for h in heads if h.id in served)
        diagnostics.extend(d for d in index.broken.get(pid, ()) if d.id not in index.headers)
        _check(signal)
        return Listing(rows, tuple(diagnostics))

    def list_descendants(
        self, root_session_id: SessionId | str, signal: AbortSignal | None = None
    ) -> Listing:
        """The root's whole tree in stable pre-order, with ``parent_id`` and ``depth``."""
        projections = self._require()
        signal = _signal(signal)
        root = SessionId(root_session_id)
        _check(signal)
        index = self._index(signal)
        headers = index.headers
        children = index.children
        # Pre-order in parallel lists indexed by position (no tuple per node, and a
        # node's parent is a position, not another lookup): on a 100,000-node tree
        # each lookup in a 100,000-entry map is a likely cache miss.
        order: list[SessionHeader] = []
        parent_at: list[int] = []  # position of the parent in ``order``; -1: the root
        depths: list[int] = []
        has_sub: list[bool] = []  # has a child of origin "subagent"
        root_header = headers.get(root)
        root_is_sub = root_header is not None and root_header.origin == "subagent"
        top = children.get(root, [])
        stack_ids: list[SessionId] = list(reversed(top))
        stack_at: list[int] = [-1] * len(top)
        stack_depths: list[int] = [1] * len(top)
        while stack_ids:
            sid = stack_ids.pop()
            at = stack_at.pop()
            depth = stack_depths.pop()
            if sid == root:
                # A cycle through the root in hand-written parent links. (Every
                # other node is reached once: each header has exactly one parent.)
                if root_is_sub and at >= 0:
                    has_sub[at] = True
                continue
            header = headers[sid]
            if at >= 0 and header.origin == "subagent":
                has_sub[at] = True
            here = len(order)
            order.append(header)
            parent_at.append(at)
            depths.append(depth)
            has_sub.append(False)
            kids = children.get(sid)
            if kids:
                stack_ids.extend(reversed(kids))
                stack_at.extend([here] * len(kids))
                stack_depths.extend([depth + 1] * len(kids))
        heads = [h for h in order if h.origin == "subagent"]
        served, diagnostics = self._classify(projections, index, heads, signal)
        if index.broken:
            for node in (root, *(h.id for h in order)):
                diagnostics.extend(
                    d for d in index.broken.get(node, ()) if d.id not in index.headers
                )
        live = index.live
        rows = []
        for header, at, depth, sub in zip(order, parent_at, depths, has_sub):
            sid = header.id
            identity = served.get(sid, _MISS)
            if identity is _MISS:
                continue
            rows.append(
                _descendant_row(
                    sid,
                    identity["mode"],
                    identity.get("label"),
                    "running" if live and sid in live else "inactive",
                    sub,
                    header.created_at,
                    order[at].id if at >= 0 else root,
                    depth,
                )
            )
        _check(signal)
        return Listing(tuple(rows), tuple(diagnostics))


def _signal(signal: AbortSignal | None) -> AbortSignal:
    if signal is None:
        return AbortSignal.never()
    if not isinstance(signal, AbortSignal):
        raise SubagentError("signal must be an AbortSignal", code=ErrorCode.INVALID_ARGUMENT)
    return signal
