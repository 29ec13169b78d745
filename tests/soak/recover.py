"""Final clean recovery of a soak run.

    python recover.py RUN_DIR DB BACKEND

After every worker stopped: one runtime resumes every root and waits until no
session has a pending inbox row. A session left with only quiet reports (they
wait for a turn) is sent one flush message after 3 s. Prints ``recovered`` and
exits 0; prints ``PENDING-FOREVER {session: [ids]}`` and exits 3 when rows are
still pending after 120 s. Its turns are recorded like a worker's, so the
checker sees them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from _soaklib import Recorder
from subagents.actors import Runtime
from subagents.protocol import SubagentError


def register_model(rt: Runtime, rec: Recorder) -> None:
    """Model ``soak`` for the recovery: records the turn and does nothing else."""

    def factory(_options: Any) -> Any:
        def on_turn(turn: Any) -> Any:
            mids = [str(m.message_id) for m in turn.messages]
            sid = str(turn.agent.session_id)
            rec(
                "start",
                sid=sid,
                mids=mids,
                contents=[m.content for m in turn.messages],
                red=bool(turn.redelivered),
                turn=turn.index,
            )
            rec("end", sid=sid, mids=mids, cancelled=False, turn=turn.index)
            return {"ran": mids}

        return on_turn

    rt.models.register("soak", factory, replace=True)


def flush(rt: Runtime, rec: Recorder, h: Any) -> None:
    """One message to a session whose pending rows are all quiet reports."""
    try:
        if h.parent_session is None:
            rt.agents.send(h.id, {"flush": 1})
        else:
            rt.subagents.followup(h.parent_session, h.id, {"flush": 1})
        rec("flush", sid=str(h.id))
    except SubagentError as exc:
        print("flush", h.id, exc.code, exc, file=sys.stderr)


def main(run_dir: str, db: str, backend: str) -> int:
    pid = os.getpid()
    rec = Recorder(os.path.join(run_dir, f"side_recover_{pid}.jsonl"), f"recover.{pid}", backend)
    with Runtime(db, backend=backend, lease_ttl=3.0) as rt:
        register_model(rt, rec)
        store = rt.store
        assert store is not None
        for h in rt.agents.roots():
            try:
                rt.agents.resume(h.id)
            except SubagentError as exc:
                print("resume", h.id, exc.code, exc, file=sys.stderr)
        deadline = time.monotonic() + 120
        flushed: set[str] = set()
        quiet_since: dict[str, float] = {}
        while True:
            left = {}
            for h in store.all_headers():
                pending = store.pending(h.id, damaged=[])
                if not pending:
                    continue
                sid = str(h.id)
                left[sid] = [str(e.message_id) for e in pending]
                if all(getattr(e.event, "delivery", None) == "quiet" for e in pending):
                    first = quiet_since.setdefault(sid, time.monotonic())
                    if sid not in flushed and time.monotonic() - first > 3:
                        flushed.add(sid)
                        flush(rt, rec, h)
                else:
                    quiet_since.pop(sid, None)
            if not left:
                break
            if time.monotonic() > deadline:
                print("PENDING-FOREVER", json.dumps(left), flush=True)
                return 3
            rt.backend.sleep(0.25)
        rt.wait_idle(30)
        print("recovered", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
