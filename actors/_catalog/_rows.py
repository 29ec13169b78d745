"""What a listing returns: rows, per-child diagnostics, the listing itself."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from subagents.protocol import SessionId
from subagents.store import StoredKey

__all__ = ["ChildRow", "DescendantRow", "Diagnostic", "Listing", "descendant_row"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildRow:
    """One listed child.

    Attributes:
        id: the child's session.
        mode: ``"one-shot"`` or ``"continuable"``.
        label: its durable label (``None`` for an unlabelled one-shot child).
        activity: ``"running"`` while its session is live in this runtime (its
            agent resident: a turn may or may not run), ``"inactive"`` when it is
            found only in the store (settled, ended, or live in another process).
            ``subagents tree`` tells more states apart (``running``, ``waiting``,
            ``settled``...): it reads the store's leases and inboxes.
        has_children: whether it has children of its own (one level, a hint).
        created_at: when its session was created.
    """

    id: SessionId
    mode: str
    label: str | None
    activity: str
    has_children: bool
    created_at: Any


@dataclass(frozen=True, slots=True, kw_only=True)
class DescendantRow:
    """One listed descendant, with its durable parent and root-relative depth: the
    fields of a :class:`ChildRow` (``activity`` as there), plus these.

    Attributes:
        parent_id: its parent's session.
        depth: 1 for the root's children, 2 below them, and so on.
    """

    id: SessionId
    mode: str
    label: str | None
    activity: str
    has_children: bool
    created_at: Any
    parent_id: SessionId
    depth: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Diagnostic:
    """A per-child problem: ``kind`` is ``"corrupt"`` or ``"unavailable"``.

    ``id`` names the session; a stored row whose key is no session id (damaged
    data) is named by its :class:`~subagents.store.StoredKey` (``x'0102'``).
    """

    id: SessionId | StoredKey
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


_new = object.__new__
# The listing builds one row per node from values it checked itself; storing
# through the slot descriptors skips the frozen dataclass's per-field
# object.__setattr__ (half the cost of a row, 100,000 rows in a big listing).
_DESCENDANT_SETTERS: Final = tuple(
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


def descendant_row(*values: Any) -> DescendantRow:
    """A :class:`DescendantRow` from its field values, in declaration order."""
    row = _new(DescendantRow)
    for setter, value in zip(_DESCENDANT_SETTERS, values):
        setter(row, value)
    return row
