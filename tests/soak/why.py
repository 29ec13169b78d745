"""Explain a soak violation: the records naming some ids, the kills, and one
session's log.

    python tests/soak/why.py RUN_DIR SESSION [ID ...]

Prints, in time order, every side record that mentions one of the IDs (message
or session ids, or any part of one), then the driver's kills and stalls, then
SESSION's log from the run's store (read-only), one event a line: seq, kind,
turn, message ids (8 digits), message id, delivery, stop reason, error,
redelivered.
"""

from __future__ import annotations

import json
import os
import sys

from _soaklib import load_side, open_read_only, read_jsonl
from subagents.protocol import SessionId


def main(run_dir: str, session: str, ids: list[str]) -> int:
    recs = sorted(load_side(run_dir), key=lambda r: r["t"])
    for r in recs:
        s = json.dumps(r)
        if any(m in s for m in ids):
            print(
                f"{r['t']:.3f}",
                r["proc"],
                r["k"],
                r.get("op"),
                r.get("sid") or r.get("target"),
                r.get("mid") or r.get("mids"),
                r.get("delivery"),
                r.get("code"),
                r.get("turn"),
                r.get("red"),
            )
    for k in read_jsonl(os.path.join(run_dir, "kills.jsonl")):
        print("kill", k)
    with open(os.path.join(run_dir, "db.txt")) as f:
        db = f.read().strip()
    store = open_read_only(db)
    try:
        for r in store.read(SessionId(session)):
            e = r.event
            print(
                r.seq,
                type(e).__name__,
                getattr(e, "turn", ""),
                [str(x)[:8] for x in getattr(e, "message_ids", ())],
                str(getattr(e, "message_id", ""))[:8],
                getattr(e, "delivery", ""),
                getattr(e, "stop_reason", ""),
                getattr(e, "error", "") or "",
                getattr(e, "redelivered", ""),
            )
    finally:
        store.close()
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
