"""Soak worker: one runtime on a shared store doing a random mix of operations.

    python worker.py RUN_DIR DB NAME BACKEND SEED TTL

Started (and SIGKILLed, SIGSTOPped, restarted) by ``run.py``. Records every call
and every turn to RUN_DIR/side_<NAME>_<pid>.jsonl and the roots and children it
makes to RUN_DIR/topo.jsonl. Opens a runtime, runs 5-80 operations (on threading,
half the time a second thread runs its own), closes it cleanly and opens another,
until RUN_DIR/stop exists. A restarted worker first makes again, with the same id
and content, every explicit-id call a dead predecessor of the same NAME tried and
never saw answered. SOAK_PATCH=1 with BACKEND gevent: monkey-patch first.
SOAK_HOSTS=1: its lease holder names a host of its own (a worker on another
machine or container: no pid check judges it; on SQLite its presence lock does,
on PostgreSQL its listener's connection).
"""

from __future__ import annotations

import os
import random
import sys
import threading
from typing import Any

RUN_DIR, DB, NAME, BACKEND, SEED, TTL = sys.argv[1:7]
if BACKEND == "gevent" and os.environ.get("SOAK_PATCH"):
    from gevent import monkey

    monkey.patch_all()

# After patching: these import threading, queues and the runtime.
from _soaklib import Recorder, load_side  # noqa: E402
from _worker_ops import Soak  # noqa: E402
from subagents.actors import ContinuableStartSpec, Runtime  # noqa: E402
from subagents.protocol import SessionId, SubagentError  # noqa: E402

if os.environ.get("SOAK_HOSTS"):
    from subagents.store import _holders

    _holders._HOST = f"soak-{NAME}-{os.getpid()}"


def leftovers(run_dir: str, name: str) -> list[dict[str, Any]]:
    """Explicit-id calls a dead predecessor of this NAME tried and never saw
    answered (an error in doubt counts as unanswered)."""
    tried: dict[str, dict[str, Any]] = {}
    done: set[str] = set()
    for d in load_side(run_dir, name):
        if d["k"] == "try" and d.get("mid"):
            tried.setdefault(d["mid"], d)
        elif d["k"] in ("ok", "err") and d.get("mid"):
            if d["k"] == "err" and d.get("hint", {}).get("in_doubt"):
                continue  # in doubt: made again
            done.add(d.get("asked") or d["mid"])
            done.add(d["mid"])
    return [d for m, d in tried.items() if m not in done]


def retry_left(soak: Soak, rt: Runtime, d: dict[str, Any]) -> None:
    """Make a leftover call again, with its id and content."""
    kind, target, mid, content = d["op"], d["target"], d["mid"], d["content"]
    parent: Any = d.get("parent")  # None for a send; a session id otherwise

    def call(m: Any, c: Any) -> Any:
        if kind == "report":
            how = d.get("delivery", "waking")
            return rt.subagents.report_from(d["child"], c, delivery=how, message_id=m)
        if kind == "send":
            return rt.agents.send(target, c, message_id=m)
        if kind == "followup":
            return rt.subagents.followup(parent, target, c, message_id=m)
        spec = ContinuableStartSpec(
            parent=SessionId(parent),
            provider="local",
            prompt=c,
            label="kid",
            model="soak",
            message_id=m,
        )
        return rt.subagents.start_continuable(spec)

    soak.deliver(kind, target, call, True, parent=parent, again=(mid, content))


def main() -> int:
    pid = os.getpid()
    proc = f"{NAME}.{pid}"
    rec = Recorder(os.path.join(RUN_DIR, f"side_{NAME}_{pid}.jsonl"), proc, BACKEND)
    soak = Soak(RUN_DIR, proc, random.Random(int(SEED) * 1000003 + pid), rec)
    rnd = soak.rnd
    rec("boot")
    stop = os.path.join(RUN_DIR, "stop")
    while not os.path.exists(stop):
        rt = Runtime(DB, backend=BACKEND, lease_ttl=float(TTL))
        try:
            soak.register_model(rt)
            rec("open")
            # The driver kills only workers that are up (it waits for this file).
            open(os.path.join(RUN_DIR, f"up_{pid}"), "w").close()
            for d in leftovers(RUN_DIR, NAME):
                rec("leftover", mid=d["mid"])
                try:
                    retry_left(soak, rt, d)
                except SubagentError as exc:
                    rec("op_err", code=exc.code, msg=str(exc)[:300])
            n = rnd.randint(5, 80)
            second = None
            if BACKEND == "threading" and rnd.random() < 0.5:
                second = threading.Thread(target=soak.ops, args=(rt, stop, n), name="second")
                second.start()
            soak.ops(rt, stop, n)
            if second is not None:
                second.join()
        finally:
            rec("closing")
            rt.close()
            rec("closed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
