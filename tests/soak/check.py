"""Checker of a soak run: prints every violation, exits 1 if there is any.

    python check.py RUN_DIR DB

Reads the run's side records (what each process asked, was answered and ran) and
the store (read-only: each session's log and pending inbox), and checks the
invariants listed in README.md. Prints a summary line (record kinds, error codes,
sessions, kills), then one ``VIOLATION ...`` line per broken invariant.
"""

from __future__ import annotations

import collections
import itertools
import sys
from typing import Any

from _check_ends import check_finished, check_leases
from _check_reports import check_reports
from _soaklib import load_kills, load_side, open_read_only
from subagents.protocol import MessageEvent, ReportEvent, TurnEnd, TurnStart

#: Seconds after a SIGCONT within which a stalled process's turn may still start
#: on the lease check it made before its stop (a loaded box: generous).
RESUMED = 1.0

Logs = dict[str, list[tuple[int, Any]]]
Turns = dict[str, list[dict[str, Any]]]


def read_store(db: str, recs: list[dict[str, Any]], bad: list[str]) -> Logs:
    """Every session's log; a session with pending inbox rows is a violation, and
    so is a lease a cleanly closed process still holds (``check_leases``)."""
    store = open_read_only(db)
    try:
        logs: Logs = {}
        for h in store.all_headers():
            logs[str(h.id)] = [(r.seq, r.event) for r in store.read(h.id)]
            p = store.pending(h.id, damaged=[])
            if p:
                bad.append(f"pending after recovery: {h.id} {[str(e.message_id) for e in p]}")
        check_leases(recs, store, bad)
        return logs
    finally:
        store.close()


def log_turns(logs: Logs, bad: list[str]) -> Turns:
    """Per session, its logged turns: seq, turn, mids, redelivered, stop, error."""
    turns: Turns = {}
    for sid, evs in logs.items():
        cur: dict[int, dict[str, Any]] = {}
        out: list[dict[str, Any]] = []
        for seq, ev in evs:
            if isinstance(ev, TurnStart):
                t = {
                    "seq": seq,
                    "turn": ev.turn,
                    "mids": [str(m) for m in ev.message_ids],
                    "red": ev.redelivered,
                    "stop": None,
                    "error": None,
                }
                cur[ev.turn] = t
                out.append(t)
            elif isinstance(ev, TurnEnd):
                t2 = cur.get(ev.turn)
                if t2 is None:
                    bad.append(f"{sid}: turn/end {ev.turn} without start")
                    continue
                if t2["stop"] is not None:
                    bad.append(f"{sid}: turn {ev.turn} ended twice")
                t2["stop"], t2["error"] = ev.stop_reason, ev.error
        turns[sid] = out
    return turns


def check_accepted(
    recs: list[dict[str, Any]], logs: Logs, turns: Turns, bad: list[str]
) -> tuple[dict[tuple[str, str], int], dict[tuple[str, str], list[dict[str, Any]]]]:
    """Accepted never lost, completed at most once, refused never logged, and
    per sender and target, accepted order = first log position. Returns each
    (session, id)'s first log position and its completed turns."""
    first_pos: dict[tuple[str, str], int] = {}
    completed: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for sid, evs in logs.items():
        for seq, ev in evs:
            if isinstance(ev, (MessageEvent, ReportEvent)):
                first_pos.setdefault((sid, str(ev.message_id)), seq)
    for sid, ts in turns.items():
        for t in ts:
            for m in t["mids"]:
                first_pos[(sid, m)] = min(first_pos.get((sid, m), t["seq"]), t["seq"])
                if t["stop"] == "completed":
                    completed[(sid, m)].append(t)
    for key, ts in completed.items():
        if len(ts) > 1:
            bad.append(f"completed twice: {key} turns {[t['turn'] for t in ts]}")
    oks = [r for r in recs if r["k"] == "ok"]
    for r in oks:
        key = (r["target"], r["mid"])
        if key not in first_pos:
            bad.append(f"accepted but never ran/logged: {r['op']} {key} by {r['proc']} c={r['c']}")
    by_mid: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in recs:
        if r["k"] in ("try", "err", "ok") and r.get("mid"):
            by_mid[r["mid"]].append(r)
    all_logged = {m for (_s, m) in first_pos}
    for mid, rs in by_mid.items():
        if any(r["k"] == "ok" for r in rs):
            continue
        tries = [r for r in rs if r["k"] == "try"]
        errs = [r for r in rs if r["k"] == "err"]
        if len(tries) != len(errs) or not errs:
            continue  # died mid-call: unknown
        if any(e.get("hint", {}).get("in_doubt") for e in errs):
            continue
        if tries[0].get("mid") is None:
            continue  # implicit id learned from a hint: was in doubt
        if mid in all_logged:
            codes = [e["code"] for e in errs]
            bad.append(f"refused ({codes}) but logged: {mid} {tries[0]['op']} {tries[0]['target']}")
    check_order(recs, oks, first_pos, bad)
    return first_pos, completed


def check_order(
    recs: list[dict[str, Any]],
    oks: list[dict[str, Any]],
    first_pos: dict[tuple[str, str], int],
    bad: list[str],
) -> None:
    """Per sender (process and thread) and target: accepted order is log order."""
    seqd: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    procs_of: dict[str, set[str]] = collections.defaultdict(set)
    for r in recs:
        if r["k"] == "try" and r.get("mid"):
            procs_of[r["mid"]].add(r["proc"])
    for r in sorted(oks, key=lambda r: (r["proc"], r["c"])):
        if len(procs_of.get(r.get("asked") or r["mid"], ())) > 1:
            continue  # a leftover retried by a successor: accepted when, unknown
        if r["op"] == "report":
            continue  # reports: per child, check_reports
        if r.get("outcome") == "steered":
            continue  # steering jumps the queue by design
        seqd[(r["proc"] + "/" + r.get("th", ""), r["target"])].append(r)
    for (proc, target), rs in seqd.items():
        pos = [(first_pos.get((target, r["mid"])), r) for r in rs]
        known = [(p, r) for p, r in pos if p is not None]
        for (p1, r1), (p2, r2) in itertools.pairwise(known):
            if p2 < p1:
                bad.append(
                    f"order: {proc} -> {target}: {r1['mid']}(seq{p1}) accepted before"
                    f" {r2['mid']}(seq{p2})"
                )


def check_runs(
    recs: list[dict[str, Any]],
    run_dir: str,
    completed: dict[tuple[str, str], list[dict[str, Any]]],
    bad: list[str],
) -> int:
    """Turns as the processes ran them: no two processes' turns of one session
    overlap in time (a killed turn ends at the kill; a stalled process is
    excluded), a message's later runs are redelivered, none after its completed
    turn. Returns the number of kills."""
    kills, stalls = load_kills(run_dir)

    def stalled(proc: str, t0: float, t1: float) -> bool:
        pid = proc.rsplit(".", 1)[1]
        return any(s < t1 and t0 < c for s, c in stalls.get(pid, []))

    last_t: dict[str, float] = {}
    for r in recs:
        last_t[r["proc"]] = max(last_t.get(r["proc"], 0), r["t"])
    die_t = {r["proc"]: r["t"] for r in recs if r["k"] == "die"}
    starts = sorted((r for r in recs if r["k"] == "start"), key=lambda r: r["t"])
    ends = {(r["proc"], r["sid"], tuple(r["mids"]), r["turn"]): r for r in recs if r["k"] == "end"}
    runs_by_mid: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    intervals: dict[str, list[tuple[float, float, str, Any]]] = collections.defaultdict(list)
    for s in starts:
        e = ends.get((s["proc"], s["sid"], tuple(s["mids"]), s["turn"]))
        if e is not None:
            end = e["t"]
        else:
            pid = s["proc"].rsplit(".", 1)[1]
            cands = (kills.get(pid), die_t.get(s["proc"]), last_t[s["proc"]])
            end = min(x for x in cands if x is not None)
        intervals[s["sid"]].append((s["t"], end, s["proc"], s["mids"]))
        for m in s["mids"]:
            runs_by_mid[m].append(s)
    for sid, iv in intervals.items():
        iv.sort()
        for i, (a0, a1, ap, am) in enumerate(iv):
            for b0, b1, bp, bm in iv[i + 1 :]:
                if b0 >= a1:
                    break
                if bp != ap and not (stalled(ap, a0, a1) or stalled(bp, b0, b1)):
                    bad.append(
                        f"overlap {sid}: {ap} {am} [{a0:.3f},{a1:.3f}] / {bp} {bm}"
                        f" [{b0:.3f},{b1:.3f}]"
                    )

    def resumed(r: dict[str, Any]) -> bool:
        # A turn a stop cut between its lease check (Leases.confirm: from memory
        # while the last renewal is recent) and its behaviour: a stalled holder's
        # run, after its successor's. Its writes are fenced (never in the log); a
        # turn checked after the stop asks the store, so only a start this close to
        # the SIGCONT is left out.
        pid = r["proc"].rsplit(".", 1)[1]
        return any(s <= r["t"] <= c + RESUMED for s, c in stalls.get(pid, []))

    for m, rs in runs_by_mid.items():
        for r in rs[1:]:
            if not r["red"] and not resumed(r):
                bad.append(
                    f"second run not redelivered: {m} by {r['proc']} (first by {rs[0]['proc']})"
                )
        comp = completed.get((rs[0]["sid"], m))
        if comp:
            k = comp[0]["turn"]
            # A process killed before its turns were written numbered them past the
            # log; its successor numbers its own from the log again. So a higher
            # number counts only from when a run numbered k began.
            since = min((r["t"] for r in rs if r["turn"] == k), default=0.0)
            for r in rs:
                if r["turn"] > k and r["t"] > since:
                    bad.append(
                        f"ran after its completed turn {k}: {m} turn {r['turn']} by {r['proc']}"
                    )
    return len(kills)


def main(run_dir: str, db: str) -> int:
    recs = load_side(run_dir)
    bad: list[str] = []
    logs = read_store(db, recs, bad)
    turns = log_turns(logs, bad)
    _first_pos, completed = check_accepted(recs, logs, turns, bad)
    check_finished([r for r in recs if r["k"] == "ok"], logs, bad)
    check_reports(recs, logs, turns, bad)
    nkills = check_runs(recs, run_dir, completed, bad)
    stats = collections.Counter(r["k"] for r in recs)
    errs = collections.Counter(r.get("code") for r in recs if r["k"] in ("err", "op_err"))
    print("stats", dict(stats), "errors", dict(errs), "sessions", len(logs), "kills", nkills)
    for b in bad:
        print("VIOLATION", b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
