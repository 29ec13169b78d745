"""A worker process of ``test_remote_interrupt.py``: it holds a tree, another interrupts.

Usage::

    python interrupt_worker.py DB BACKEND

Spawns a root and a continuable child of it whose first turn waits until it is
cancelled; once that turn runs, prints ``ROOT CHILD`` (their ids). When the turn
has ended, prints its stop reason and the ``by_session`` of the interrupt its log
holds (``-`` for none), then waits for its stdin to close.
"""

from __future__ import annotations

import sys
from typing import Any

from subagents.actors import ContinuableStartSpec, Runtime
from subagents.protocol import InterruptEvent, TurnEnd


def main(db: str, backend: str) -> int:
    with Runtime(db, backend=backend) as rt:
        running = rt.backend.event()

        def blocker(_options: Any) -> Any:
            def on_turn(turn: Any) -> None:
                running.set()
                turn.signal.wait(60)  # until the interrupt cancels it

            return on_turn

        rt.models.register("blocker", blocker)
        root = rt.spawn("echo", label="root")
        child_id, _ = rt.subagents.start_continuable(
            ContinuableStartSpec(
                parent=root, provider="local", prompt="p", label="c", model="blocker"
            )
        )
        child = rt.agents.get(child_id)
        assert child is not None and running.wait(30)
        print(root.session_id, child_id, flush=True)
        if not child.wait_idle(60):
            print("timeout -", flush=True)
            return 3
        assert rt.store is not None
        rt.sessions.flush()
        events = [r.event for r in rt.store.read(child_id)]
        stops = [e.stop_reason for e in events if isinstance(e, TurnEnd)]
        by = [e.by_session for e in events if isinstance(e, InterruptEvent)]
        print(",".join(stops), ",".join(str(b) for b in by) or "-", flush=True)
        sys.stdin.read()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
