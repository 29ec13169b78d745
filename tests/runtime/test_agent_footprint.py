"""An idle resident agent stays small: its instance dict shares its keys with its
class's other instances (the ``memory`` bench row: <= 16 KiB an idle resident
continuable child on gevent, R-SCALE-*; issue 20 point 3).

CPython shares the keys of instance dicts among a class's instances only up to 30
names -- all ever set on any instance of the class -- and an instance past that
keeps a dict of its own, 1.3 KiB bigger. One more attribute set in
``Agent.__init__`` (30 in all) once took every resident child from 14.6 to 16.6
KiB. The agent's own state is in slots; its dict holds its mailbox's. Checked
after other agents were disposed and resumed in the same process (what adds
names), and on a fresh runtime.
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._agents._messages import Deliver
from subagents.actors._kernel._backend import Backend

#: CPython's bound on an instance dict's shared keys (``SHARED_KEYS_MAX_SIZE``).
SHARED_KEYS = 30


def test_an_idle_resident_childs_agent_keeps_a_key_sharing_dict(
    backend: Backend, tmp_path: Path
) -> None:
    with Runtime(tmp_path / "s.db", backend=backend, keep_warm=float("inf")) as rt:
        root = rt.spawn("echo", label="root")
        child = rt.subagents.start_continuable(
            ContinuableStartSpec(parent=root, provider="local", prompt="p", label="c")
        ).child_id
        assert rt.wait_idle(10)
        other = rt.spawn("echo", label="other")
        other.followup("x")
        assert other.wait_idle(10)
        other.dispose(checkpoint=True)
        again = rt.agents.resume(other.session_id)
        again.dispose(flush=False)
        agent = rt.agents.get(child)
        assert agent is not None
        for each in (agent, root):
            names = vars(each)
            assert len(names) < SHARED_KEYS, sorted(names)
            if sys.implementation.name == "cpython" and sys.version_info[:2] == (3, 11):
                assert sys.getsizeof(names) < 1000  # a combined dict: 1,584 bytes


def test_an_idle_agent_holds_no_message_it_ran(backend: Backend, tmp_path: Path) -> None:
    """R-SCALE-*: an idle resident child keeps no message it ran. Its actor's loop
    (pykka's) held the last one -- the follow-up itself, its content and source --
    in a local while it waited for the next, for as long as the child stayed
    resident; the agent actor's loop drops it (``_kernel/_loop.py``)."""
    with Runtime(tmp_path / "s.db", backend=backend, keep_warm=float("inf")) as rt:
        root = rt.spawn("echo", label="root")
        child = rt.subagents.start_continuable(
            ContinuableStartSpec(parent=root, provider="local", prompt="p", label="c")
        ).child_id
        ran = [rt.subagents.followup(root, child, f"message {i}") for i in range(3)]
        ran.append(root.followup("to the root"))
        assert rt.wait_idle(10)
        rt.sessions.flush()
        gc.collect()
        held = [o for o in gc.get_objects() if type(o) is Deliver and o.message_id in ran]
        assert held == [], [(o.message_id, o.content) for o in held]
        assert rt.agents.get(child) is not None  # still resident, and idle
