"""A worker of ``test_full_inbox_crash.py``: it leaves a bounded child's inbox full.

Usage: ``python full_inbox_worker.py DB BACKEND``

A strict runtime on the store ``DB`` spawns a top-level agent (model ``lead``)
and starts a continuable child of it (model ``stuck``, ``max_inbox=2``) whose
prompt ``m0`` never ends; follows it up with ``m1`` (2 of 2 accepted, both in the
durable inbox); prints ``ready PARENT CHILD`` and waits to be killed.
"""

from __future__ import annotations

import sys
from typing import Any

from subagents.actors import ContinuableStartSpec, Runtime


def main(db: str, backend: str) -> int:
    with Runtime(db, backend=backend) as rt:
        rt.models.register("lead", lambda _o: lambda turn: turn.content)
        stuck: Any = lambda _o: lambda turn: turn.signal.wait(3600)  # noqa: E731
        rt.models.register("stuck", stuck)
        lead = rt.spawn("lead", label="lead")
        spec = ContinuableStartSpec(
            parent=lead, provider="local", prompt="m0", label="kid", model="stuck", max_inbox=2
        )
        child, _ = rt.subagents.start_continuable(spec)
        rt.subagents.followup(lead, child, "m1")
        print(f"ready {lead.session_id} {child}", flush=True)
        lead.wait_disposed(3600)  # killed before
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
