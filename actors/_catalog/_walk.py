"""The pre-order walk behind ``list_descendants``, damaged parent links included.

:class:`Walk` visits a root's tree in stable pre-order, in parallel lists indexed
by position (no tuple per node, and a node's parent is a position, not another
lookup: on a 100,000-node tree each lookup in a 100,000-entry map is a likely
cache miss). Damaged data stays local:

* a session whose stored header does not decode has no node, but its children
  (whose own headers name it) are walked after the rest, each subtree in
  pre-order, the top rows naming the broken session as ``parent_id``; the broken
  session itself is a ``corrupt`` diagnostic of its parent (:class:`~._corpus.Corpus`);
* a parent-link cycle through the root is walked once (the root never below
  itself) and is a ``corrupt`` diagnostic of the root naming the loop.
"""

from __future__ import annotations

from subagents.protocol import SessionHeader, SessionId

from ._corpus import Corpus
from ._rows import Diagnostic

__all__ = ["Walk"]

_NO_LOOP = -2


class Walk:
    """A root's tree in pre-order: ``order[i]`` is a node, ``parent_at[i]`` the
    position of its parent (``-1``: the root; below ``-1``: the broken session
    ``virtual[-2 - at]``), ``depths[i]`` its depth, ``has_sub[i]`` whether it has
    a child of origin ``subagent``."""

    __slots__ = ("depths", "has_sub", "loop_at", "order", "parent_at", "root", "virtual")

    def __init__(self, corpus: Corpus, root: SessionId) -> None:
        self.root = root
        self.order: list[SessionHeader] = []
        self.parent_at: list[int] = []
        self.depths: list[int] = []
        self.has_sub: list[bool] = []
        #: Broken sessions walked through: ``(id, parent position, depth)``.
        self.virtual: list[tuple[SessionId, int, int]] = []
        self.loop_at = _NO_LOOP  # where a parent-link cycle closes back to the root
        top = corpus.children.get(root, [])
        self._walk(corpus, top, -1, 1)
        if corpus.broken:
            self._below_broken(corpus)

    def _walk(self, corpus: Corpus, top: list[SessionId], at0: int, depth0: int) -> None:
        headers = corpus.headers
        children = corpus.children
        root = self.root
        header = headers.get(root)
        root_is_sub = header is not None and header.origin == "subagent"
        order, parent_at, depths, has_sub = self.order, self.parent_at, self.depths, self.has_sub
        stack_ids: list[SessionId] = list(reversed(top))
        stack_at: list[int] = [at0] * len(top)
        stack_depths: list[int] = [depth0] * len(top)
        while stack_ids:
            sid = stack_ids.pop()
            at = stack_at.pop()
            depth = stack_depths.pop()
            if sid == root:
                # A cycle through the root in hand-written parent links. (Every
                # other node is reached once: each header has exactly one parent.)
                if root_is_sub and at >= 0:
                    has_sub[at] = True
                self.loop_at = at
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

    def _below_broken(self, corpus: Corpus) -> None:
        """Walk the children of every broken session met, until none is left."""
        broken = corpus.broken
        expanded = {self.root}
        frontier: list[tuple[SessionId, int, int]] = [(self.root, -1, 0)]  # id, at, depth
        seen_order = seen_virtual = 0
        while True:
            order, virtual = self.order, self.virtual
            frontier += [
                (h.id, i, self.depths[i])
                for i, h in enumerate(order[seen_order:], seen_order)
                if h.id in broken
            ]
            frontier += [
                (v, -2 - i, d)
                for i, (v, _at, d) in enumerate(virtual[seen_virtual:], seen_virtual)
                if v in broken
            ]
            seen_order, seen_virtual = len(order), len(virtual)
            if not frontier:
                return
            batch, frontier = frontier, []
            for node, at, depth in batch:
                for diag in corpus.diagnostics_of(node):
                    sid = diag.id
                    if not isinstance(sid, SessionId) or sid in expanded:
                        continue
                    kids = corpus.children.get(sid)
                    if kids:
                        expanded.add(sid)
                        virtual.append((sid, at, depth + 1))
                        self._walk(corpus, kids, -1 - len(virtual), depth + 2)

    def parent_id(self, at: int) -> SessionId:
        """The id of the node at position ``at`` (see the class docstring)."""
        if at >= 0:
            return self.order[at].id
        return self.root if at == -1 else self.virtual[-2 - at][0]

    def diagnostics(self, corpus: Corpus) -> list[Diagnostic]:
        """The broken sessions below the walked nodes, and a loop through the root."""
        out: list[Diagnostic] = []
        if corpus.broken:
            nodes = (self.root, *(h.id for h in self.order), *(v[0] for v in self.virtual))
            for node in nodes:
                out.extend(corpus.diagnostics_of(node))
        if self.loop_at != _NO_LOOP:
            chain = [self.root]
            at = self.loop_at
            while at != -1:
                chain.append(self.parent_id(at))
                at = self.parent_at[at] if at >= 0 else self.virtual[-2 - at][1]
            chain.append(self.root)
            detail = "its parent links loop back to it: " + " -> ".join(chain)
            out.append(Diagnostic(id=self.root, kind="corrupt", detail=detail))
        return out
