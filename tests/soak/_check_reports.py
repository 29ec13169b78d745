"""The checker's report invariants (``check.py``).

Each accepted report reaches its parent exactly once -- in one turn that is its
last (not cut short, not kept by a closing runtime) -- and a waking one starts a
parent turn of its own. Per child, the reports whose first try was answered in
the same process reach the parent in the order the child made them (a report
retried elsewhere, or in doubt, was accepted when: unknown).
"""

from __future__ import annotations

import collections
import itertools
from typing import Any

from subagents.protocol import ReportEvent, TurnEnd, TurnStart

__all__ = ["check_reports"]

# A turn that ended with one of these errors did not take its messages for good.
CUT = (
    "cut short: the runtime stopped before the turn ended",
    "cancelled: the runtime closed; its messages run again",
)

Key = tuple[str, str]


def _where(
    logs: dict[str, list[tuple[int, Any]]], turns: dict[str, list[dict[str, Any]]]
) -> tuple[dict[Key, int], dict[Key, int], set[Key]]:
    """Per (parent, report id): where it reached the behaviour, how many final
    turns it was in, and whether it was among a turn's started messages."""
    rep_pos: dict[Key, int] = {}
    rep_final: dict[Key, int] = collections.defaultdict(int)
    rep_started: set[Key] = set()
    for sid, evs in logs.items():
        cur_turn: dict[str, Any] | None = None
        by_turn = {t["turn"]: t for t in turns[sid]}
        for seq, ev in evs:
            if isinstance(ev, TurnStart):
                cur_turn = by_turn.get(ev.turn)
                for m in ev.message_ids:
                    rep_started.add((sid, str(m)))
            elif isinstance(ev, ReportEvent):
                key = (sid, str(ev.message_id))
                # A waking report a dispose or a drain discarded unrun never reached
                # the behaviour (a quiet one of the same child, queued before it, is
                # kept for the next turn that runs: documented).
                if cur_turn is None or cur_turn["error"] != "discarded unrun":
                    rep_pos.setdefault(key, seq)
                ended = cur_turn is not None and cur_turn["stop"] is not None
                if ended and cur_turn is not None and cur_turn["error"] not in CUT:
                    rep_final[key] += 1
            elif isinstance(ev, TurnEnd):
                cur_turn = None
    return rep_pos, rep_final, rep_started


def check_reports(
    recs: list[dict[str, Any]],
    logs: dict[str, list[tuple[int, Any]]],
    turns: dict[str, list[dict[str, Any]]],
    bad: list[str],
) -> None:
    """Append a violation to ``bad`` for each broken report invariant."""
    rep_pos, rep_final, rep_started = _where(logs, turns)
    seen: set[Key] = set()
    for r in recs:
        if r["k"] != "ok" or r["op"] != "report":
            continue
        key = (r["target"], r["mid"])
        if key in seen:
            continue
        seen.add(key)
        n = rep_final.get(key, 0)
        if n != 1:
            bad.append(f"report reached its parent {n} times: {key} ({r.get('delivery')})")
        if r.get("delivery") == "waking" and key not in rep_started:
            bad.append(f"waking report started no parent turn: {key}")
    first_try: dict[str, dict[str, Any]] = {}
    answer: dict[tuple[str, str], dict[str, Any]] = {}
    for r in sorted(recs, key=lambda r: (r["t"], r["proc"], r["c"])):
        if r.get("op") != "report" or not r.get("mid"):
            continue
        mid = r.get("asked") or r["mid"]
        if r["k"] == "try":
            first_try.setdefault(mid, r)
        elif r["k"] in ("ok", "err") and mid in first_try:
            f = first_try[mid]
            if r["proc"] == f["proc"]:
                answer.setdefault((mid, f["proc"]), r)
    per_child: dict[str, list[tuple[float, int, str, str, int]]] = collections.defaultdict(list)
    for mid, f in first_try.items():
        a = answer.get((mid, f["proc"]))
        if a is None or a["k"] != "ok":
            continue
        pos = rep_pos.get((f["target"], mid))
        if pos is not None:
            per_child[f["child"]].append((f["t"], f["c"], mid, f["target"], pos))
    pairs = 0
    for child, rs in per_child.items():
        rs.sort()
        for a2, b in itertools.pairwise(rs):
            pairs += 1
            if a2[3] == b[3] and b[4] < a2[4]:
                bad.append(
                    f"report order: {child} -> {a2[3]}: {a2[2]}(seq{a2[4]}) made before"
                    f" {b[2]}(seq{b[4]})"
                )
    print("reports accepted", len(seen), "order pairs", pairs)
