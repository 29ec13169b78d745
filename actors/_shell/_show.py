"""``subagents show DB SESSION``: one session's header, events and state.

A record that does not decode is a diagnostic in its place, a gap in the seqs
one too, and a database damaged past some rows ends the events with why; the
rest prints (exit 1). A store that fails as a whole fails the command, as does a
session deleted while it is read (``SESSION_NOT_FOUND``, as if it never was).
"""

from __future__ import annotations

import argparse
from typing import Any

from rich.console import Console
from subagents.actors._catalog import session_state_unit
from subagents.protocol import (
    CorruptRecordError,
    ErrorCode,
    SessionHeader,
    SessionId,
    SubagentError,
    event_to_wire,
    header_to_wire,
)
from subagents.store import redacted_url

from ._down import raise_if_down
from ._output import dumps, jsonable

__all__ = ["show"]


def show(args: argparse.Namespace, console: Console, opened: Any) -> int:
    """``subagents show``: print ``args.session`` of the store ``opened`` (closed
    here); the exit status (see ``EXIT_STATUS`` in :mod:`._cli`)."""
    sid = SessionId(args.session)
    diagnostics: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    header: SessionHeader | None = None
    with opened as store:
        try:
            header = store.header(sid)
        except CorruptRecordError as exc:  # the row exists: its events may still decode
            diagnostics.append({"seq": -1, "kind": "corrupt", "detail": str(exc)})
        else:
            if header is None:
                raise SubagentError(
                    f"{redacted_url(args.db)}: no session {sid}", code="SESSION_NOT_FOUND"
                )
        expected = 0  # the next seq: a log has no gaps
        fold = _StateFold()
        try:
            for item in store.scan(sid):
                if item.seq > expected:  # rows are gone
                    last = "" if item.seq == expected + 1 else f" to {item.seq - 1}"
                    gap = f"seq {expected}{last} missing from the log"
                    rows.append({"seq": expected, "corrupt": gap})
                    diagnostics.append({"seq": expected, "kind": "corrupt", "detail": gap})
                expected = item.seq + 1
                if isinstance(item, CorruptRecordError):
                    rows.append({"seq": item.seq, "corrupt": str(item)})
                    diagnostics.append({"seq": item.seq, "kind": "corrupt", "detail": str(item)})
                else:
                    rows.append({"seq": item.seq, **jsonable(event_to_wire(item.event))})
                    fold.step(item.seq, item.event)
        except SubagentError as exc:
            if exc.code != ErrorCode.DATABASE_CORRUPT:
                raise
            # The file is damaged past the rows read so far: print those, and why.
            why = f"no record from here on could be read: {exc}"
            rows.append({"seq": expected, "corrupt": why})
            diagnostics.append({"seq": expected, "kind": "corrupt", "detail": str(exc)})
        inbox_from = len(diagnostics)  # what the state adds: the damaged inbox entries
        state = fold.state(store, sid, None if header is None else header.created_at, diagnostics)
        if header is not None and store.header(sid) is None:
            # Deleted by another process after its header was read: what the scan
            # found is part of a log or none of it, not the session's.
            raise SubagentError(
                f"{redacted_url(args.db)}: no session {sid} (deleted while it was read)",
                code="SESSION_NOT_FOUND",
            )
    status = 1 if diagnostics else 0
    if args.json:
        wire = None if header is None else header_to_wire(header)
        data = {"header": wire, "state": state, "events": rows, "diagnostics": diagnostics}
        print(dumps(data))
        return status
    if header is None:
        console.print(f"session {sid}  [corrupt] header:", diagnostics[0]["detail"], markup=False)
    else:
        console.print(f"session {sid}  label={header.label!r}  origin={header.origin}")
        console.print(f"  depth={header.delegation_depth}", markup=False)
        console.print(f"  parent={header.parent_session}  created={header.created_at.isoformat()}")
    console.print(
        f"  state={state['state']}  last_activity={state['last_activity']}"
        f"  last_turn={state['last_turn']}",
        markup=False,
        highlight=False,
    )
    for row in rows:
        seq = row.pop("seq")
        kind = row.pop("type", "corrupt")
        fields = "  ".join(f"{k}={v!r}" for k, v in row.items() if v is not None)
        console.print(f"{seq:>6}  {kind:<20} {fields}", markup=False, highlight=False)
    for diag in diagnostics[inbox_from:]:
        console.print(f"  [corrupt] inbox: {diag['detail']}", markup=False, highlight=False)
    return status


class _StateFold:
    """The ``session_state`` unit over the events ``show`` prints."""

    def __init__(self) -> None:
        self._raw = session_state_unit.initial()

    def step(self, seq: int, event: Any) -> None:
        self._raw = session_state_unit.step(self._raw, seq, event)

    def state(
        self, store: Any, sid: SessionId, created: Any, diagnostics: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """The session's state as ``--json`` prints it (its inbox read too; an inbox
        entry that does not decode is a diagnostic, as in ``tree``)."""
        from ._tree import damaged_entry, stored_state

        damaged: list[int] = []
        try:
            pending = store.pending(sid, damaged=damaged)
        except SubagentError as exc:  # a damaged inbox: the log alone says the state
            raise_if_down(exc)
            pending, damaged = [], []
        for n in damaged:
            diagnostics.append({"seq": -1, "kind": "corrupt", "detail": damaged_entry(n)})
        return stored_state(store, sid, self._raw, pending, damaged, created).to_json()
