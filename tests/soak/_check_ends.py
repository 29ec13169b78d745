"""The checker's end-state invariants (``check.py``): every accepted message ran
for good, and no lease outlived a clean close.

* An accepted send, follow-up or start prompt whose every logged turn was cut
  short or kept by a closing runtime (its messages run again) never ran for good,
  though it left the inbox: lost after it was logged (the ``accepted but never
  ran/logged`` check sees only that it was logged somewhere).
* A process whose last side record is ``closed`` closed every runtime it made
  (they are made one after another), and the recovery closes its own: a lease
  still held by one of them was never released (another host would wait for it
  to expire; no sweep of this host would take its work up while the pid lives).
"""

from __future__ import annotations

import collections
from typing import Any

from _check_reports import CUT
from subagents.protocol import MessageEvent, SessionId, TurnEnd, TurnStart

__all__ = ["check_finished", "check_leases"]


def check_finished(
    oks: list[dict[str, Any]], logs: dict[str, list[tuple[int, Any]]], bad: list[str]
) -> None:
    """Each accepted message (not a report: ``check_reports``) is in a turn that
    ended for good -- completed, failed by its behaviour, interrupted or discarded --
    as a turn's message or steered into one."""
    ends: dict[tuple[str, str], list[str | None]] = collections.defaultdict(list)
    for sid, evs in logs.items():
        mids_of: dict[int, set[str]] = {}
        current: int | None = None
        for _seq, ev in evs:
            if isinstance(ev, TurnStart):
                current = ev.turn
                mids_of[ev.turn] = {str(m) for m in ev.message_ids}
            elif isinstance(ev, MessageEvent) and current is not None:
                mids_of[current].add(str(ev.message_id))  # steered into it
            elif isinstance(ev, TurnEnd):
                for m in mids_of.pop(ev.turn, ()):
                    ends[(sid, m)].append(ev.error)
                current = None
        for mids in mids_of.values():  # never ended: not for good
            for m in mids:
                ends[(sid, m)].append(CUT[0])
    for r in oks:
        if r["op"] == "report":
            continue
        key = (r["target"], r["mid"])
        errors = ends.get(key)
        if errors and all(e in CUT for e in errors):
            bad.append(
                f"accepted but never ran for good: {r['op']} {key} by {r['proc']}"
                f" ({len(errors)} turns, each cut short or kept)"
            )


def check_leases(recs: list[dict[str, Any]], store: Any, bad: list[str]) -> None:
    """No lease is held by a process that closed every runtime it made."""
    last: dict[str, dict[str, Any]] = {}
    for r in recs:
        pid = str(r["pid"])
        if pid not in last or r["c"] > last[pid]["c"]:
            last[pid] = r
    clean = {
        pid for pid, r in last.items() if r["k"] == "closed" or r["proc"].startswith("recover.")
    }
    ids = [h.id for h in store.all_headers()]
    for sid, lease in store.get_leases(ids).items():
        if lease.holder is None:
            continue
        parts = lease.holder.split(":")
        if len(parts) == 3 and parts[1] in clean:
            bad.append(
                f"lease held after a clean close: {SessionId(sid)} by {lease.holder}"
                f" epoch {lease.epoch}"
            )
