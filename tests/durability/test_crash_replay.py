"""Crash replay, exactly once: real processes killed with SIGKILL (L-8, issue 13 point 2).

A producer (``crash_worker.py``) follows up one continuable child in bursts and
prints every id its calls returned; it kills itself at one of 23 points: inside
or right after an acceptance, as a turn starts or after it ran, inside or right
after a ``turn/end``'s commit, inside a settle's checkpoint or lease release,
inside a hand-over -- or closes its runtime with work queued. This process then
takes the store over (the dead holder's lease is free at once), follows the
child up once more and checks the log:

* every id returned to the producer ran in exactly one completed turn, in the
  order it was accepted, and so did everything else that was accepted;
* a behaviour ran a message at most twice, the second time only after a crash cut
  its first turn short, and then with ``redelivered=True``;
* the log is well formed: each turn has one end; a cut-short turn is closed
  ``failed``, and one a closing runtime cancelled runs again as a redelivery.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import LifecycleProbe
from subagents.protocol import MessageId, SessionId, TurnEnd, TurnStart

WORKER = Path(__file__).with_name("crash_worker.py")

#: (kind, k): the k-th occurrence of kind kills the producer (see crash_worker.py).
POINTS = [
    ("accept-in", 2),
    ("accept-in", 5),
    ("accept-in", 11),
    ("accept-out", 1),
    ("accept-out", 6),
    ("accept-out", 12),
    ("turn-in", 1),
    ("turn-in", 4),
    ("turn-in", 9),
    ("turn-mid", 3),
    ("turn-mid", 8),
    ("turn-mid", 13),
    # A burst's turn ends may share one op and one transaction (write-behind):
    # the prompt and the four bursts end in five at least, so k <= 5.
    ("end-in", 2),
    ("end-in", 5),
    ("end-out", 3),
    ("end-out", 5),
    ("checkpoint", 1),
    ("checkpoint", 3),
    ("release", 2),
    ("release", 4),
    ("handover", 1),
    ("handover", 2),
    ("handover", 3),
    ("never", 0),
    ("close", 0),
]


def _produce(db: str, backend: str, runs: Path, kind: str, k: int) -> tuple[int, list[str]]:
    proc = subprocess.run(
        [sys.executable, str(WORKER), db, backend, str(runs), kind, str(k)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if proc.returncode not in (0, -9):
        raise AssertionError(f"the producer failed ({proc.returncode}):\n{proc.stderr}")
    # Only whole lines: the kill may cut the last one short.
    return proc.returncode, proc.stdout.split("\n")[:-1]


def _recorder(runs: Path) -> Any:
    def factory(options: Any) -> Any:
        def on_turn(turn: Any) -> Any:
            with runs.open("a") as f:
                f.write(f"{os.getpid()} {turn.messages[-1].message_id} {int(turn.redelivered)}\n")
            return turn.content

        return on_turn

    return factory


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "k"), POINTS, ids=[f"{p[0]}-{p[1]}" for p in POINTS])
def test_every_returned_id_runs_exactly_once_after_a_kill(
    backend: Backend, db: str, tmp_path: Path, kind: str, k: int
) -> None:
    """L-8: accepted => committed; a SIGKILL anywhere loses nothing and runs nothing
    that completed twice."""
    runs = tmp_path / "runs.txt"
    code, lines = _produce(db, backend.name, runs, kind, k)
    assert (code == 0) == (kind in ("never", "close")), lines
    returned = [MessageId(line.split()[1]) for line in lines if line.startswith("id ")]
    root_id = SessionId(next(line.split()[1] for line in lines if line.startswith("root ")))
    with Runtime(db, backend=backend) as rt:
        rt.models.register("rec", _recorder(runs))
        kids = rt.store.list_headers(root_id) if rt.store is not None else []
        if not kids:  # killed before the child's creation committed: nothing returned
            assert returned == []
            return
        (kid,) = kids
        probe = LifecycleProbe(rt)
        root = rt.agents.resume(root_id)  # (adopted by the first sweep meanwhile: handed over)
        final = rt.subagents.followup(root, kid.id, "final")
        assert probe.wait_for(lambda evs: any(e.type == "subagent/end" for e in evs), 30)
        assert rt.continuation.activation(kid.id) is None
        rt.sessions.flush()
        log = [r.event for r in rt.sessions.read(kid.id)]
        probe.close()

    starts = {e.turn: e for e in log if isinstance(e, TurnStart)}
    ends = Counter(e.turn for e in log if isinstance(e, TurnEnd))
    assert all(n == 1 for n in ends.values()) and set(ends) == set(starts), log
    completed = [
        m
        for e in log
        if isinstance(e, TurnEnd) and e.stop_reason == "completed"
        for m in starts[e.turn].message_ids
    ]
    assert len(completed) == len(set(completed)), "a completed message ran twice"
    assert completed[-1] == final
    assert [m for m in completed if m in set(returned)] == returned  # all, in order
    for e in log:  # a turn that did not complete was cut short by the kill, or
        # cancelled by the producer's runtime closing; its messages ran again
        if isinstance(e, TurnEnd) and e.stop_reason != "completed":
            assert (e.stop_reason == "failed" and "cut short" in (e.error or "")) or (
                e.stop_reason == "cancelled" and kind == "close"
            ), e
            assert set(starts[e.turn].message_ids) <= set(completed)

    ran: dict[str, list[tuple[str, bool]]] = {}
    for line in runs.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:  # the kill may cut a line short
            ran.setdefault(parts[1], []).append((parts[0], parts[2] == "1"))
    assert set(ran) == {str(m) for m in completed}
    for mid, times in ran.items():
        assert len(times) <= 2, (mid, times)
        if len(times) == 2:  # run again after a kill cut its turn short
            assert times[0][0] != times[1][0] and times[1][1], (mid, times)
        else:
            assert not times[0][1] or kind not in ("never", "close"), (mid, times)
