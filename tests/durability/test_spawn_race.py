"""A well-known session is created once across processes, relaxed durability
too (R-DUR-3, durability.md: "of processes racing to create it, one wins and the
others get ``SESSION_EXISTS``").

Written behind, both racing processes' creates were queued: both spawns
returned, both ran turns of "their" session, and the loser's writer dropped its
log (a ``SESSION_EXISTS`` seen only in its statistics). Real processes, released
at once by a line on their stdin.
"""

from __future__ import annotations

import pytest
from durability_kit import worker
from subagents.actors._kernel._backend import Backend
from subagents.protocol import MessageEvent, new_session_id
from subagents.store import open_store


@pytest.mark.parametrize("durability", ["relaxed", "strict"])
def test_processes_racing_to_spawn_one_id_make_one_session(
    backend: Backend, db: str, durability: str
) -> None:
    open_store(db).close()  # the store and its schema, before the races
    for round_ in range(3):
        sid = str(new_session_id())
        args = (db, sid)
        with (
            worker("spawn_worker.py", *args, "a", durability, backend.name) as a,
            worker("spawn_worker.py", *args, "b", durability, backend.name) as b,
        ):
            procs = (a, b)
            for p in procs:
                assert p.stdout is not None and p.stdout.readline().strip() == "ready"
            for p in procs:
                assert p.stdin is not None
                p.stdin.write("go\n")
                p.stdin.flush()
            said = []
            for p in procs:
                out, err = p.communicate(timeout=60)
                assert p.returncode == 0, err
                said.append(out.split()[0])
        assert sorted(said) == ["refused", "spawned"], (round_, said)
        with open_store(db) as store:
            log = store.read(sid)
        messages = [r.event.content for r in log if isinstance(r.event, MessageEvent)]
        winner = "a" if said[0] == "spawned" else "b"
        assert messages == [f"hello-{winner}"]
