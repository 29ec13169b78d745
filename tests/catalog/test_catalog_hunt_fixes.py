"""Catalog fixes: a session deleted while it is listed."""

from __future__ import annotations

import datetime as _dt

from catalog_kit import T0, continuable, write_child
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.store import SqliteStore


def _at(n: int) -> _dt.datetime:
    return T0 + _dt.timedelta(seconds=n)


def test_a_session_deleted_while_listed_is_left_out(tmp_path, backend: Backend) -> None:
    """R-LIST-16: a child deleted (by another process) between the header read and
    its inspection no longer exists: no row, no diagnostic (it was ``unavailable``,
    ``SESSION_NOT_FOUND``); its sibling is listed."""
    path = str(tmp_path / "del.db")
    with SqliteStore(path) as store:
        root = write_child(store, None, [], origin="user")
        doomed = write_child(store, root.id, [continuable("doomed")], created_at=_at(1))
        keeper = write_child(store, root.id, [continuable("keeper")], created_at=_at(2))

    class Deleting(SqliteStore):
        def read(self, session_id, from_seq=0):  # type: ignore[no-untyped-def]
            if session_id == doomed.id:
                with SqliteStore(path) as other:
                    other.delete_session(doomed.id)
            return super().read(session_id, from_seq)

    with Runtime(Deleting(path), backend=backend) as rt:
        listing = rt.subagents.list_descendants(root.id)
        assert [x.id for x in listing.rows] == [keeper.id] and listing.diagnostics == ()
