"""Cold resume from a checkpoint: the descriptor survives the compacted read (R-DESC-8)."""

from __future__ import annotations

from typing import Any

from subagents.actors import AgentOptions, ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import LifecycleProbe
from subagents.protocol import SessionId, SubagentDescriptorEvent, TurnEnd
from subagents.store import LogRecord, MemoryStore


class CountingStore(MemoryStore):
    def __init__(self) -> None:
        super().__init__()
        self.reads: list[tuple[SessionId, int, int]] = []  # (session, from_seq, rows)

    def read(self, session_id: SessionId | str, from_seq: int = 0) -> list[LogRecord]:
        rows = super().read(session_id, from_seq)
        self.reads.append((SessionId(session_id), from_seq, len(rows)))
        return rows


def test_cold_resume_folds_the_descriptor_from_the_checkpoint(backend: Backend) -> None:
    """R-DESC-8, R-FUP-10: after the log is folded into a checkpoint, a cold resume
    reads only the events past it -- none of them a descriptor -- and still rebuilds
    the child from its descriptor (its model answers)."""
    store = CountingStore()
    with Runtime(store, backend=backend) as rt:
        rt.models.register("shout", lambda _o: lambda t: str(t.content).upper())
        probe = LifecycleProbe(rt)
        root = rt.spawn("echo")
        child_id, _ = rt.subagents.start_continuable(
            ContinuableStartSpec(
                parent=root, provider="local", prompt="a", label="kid", model="shout"
            )
        )
        for i in range(20):
            assert probe.wait_for(lambda evs, k=2 * i + 2: len(evs) >= k)
            rt.subagents.followup(root, child_id, f"msg {i}")
        assert probe.wait_for(lambda evs: len(evs) == 42)
        rt.sessions.flush()
        resumes = [(s, f, n) for s, f, n in store.reads if s == child_id]
        assert len(resumes) == 20
        # Every resume read only what followed its checkpoint, never from seq 0.
        assert all(from_seq > 0 for _, from_seq, _ in resumes)
        assert max(n for _, _, n in resumes) == 0
        events = [r.event for r in rt.sessions.read(child_id)]
        assert sum(isinstance(e, SubagentDescriptorEvent) for e in events) == 1
        outputs = [e.output for e in events if isinstance(e, TurnEnd)]
        assert outputs[-1] == "MSG 19"


def test_a_top_level_agent_resumes_from_the_checkpoint_of_its_disposal(backend: Backend) -> None:
    """A top-level agent spawned by model name checkpoints at its disposal, its
    recorded options with it: 10 rounds of a follow-up, a dispose and a resume
    (given no model): each resume reads only what followed the checkpoint, never
    the ``agent/options`` record at the log's head, and still rebuilds the agent
    from it -- its model and persona answer, its turns numbered on. A server that
    disposes idle agents paid a fold of the whole log at each resume."""
    store = CountingStore()
    with Runtime(store, backend=backend) as rt:
        rt.models.register("shout", lambda o: lambda t: f"{o.persona}:{str(t.content).upper()}")
        agent = rt.spawn("shout", label="root", options=AgentOptions(persona="p1"))
        sid = agent.session_id
        for i in range(10):
            agent.followup(f"msg {i}")
            assert rt.wait_idle(10)
            agent.dispose()
            assert store.get_checkpoint(sid) is not None
            store.reads.clear()
            agent = rt.agents.resume(sid)
            ((_, from_seq, rows),) = [r for r in store.reads if r[0] == sid]
            assert from_seq > 0 and rows == 0, (i, from_seq, rows)
        agent.followup("last")
        assert rt.wait_idle(10)
        ends = rt.sessions.turn_ends(sid)
        assert [e.turn for e in ends] == list(range(11))
        assert ends[-1].output == "p1:LAST"


def test_what_writes_no_top_level_checkpoint(backend: Backend, tmp_path: Any) -> None:
    """An agent built from a behaviour records no options (its resume is given
    them): its disposal writes no checkpoint, and its resume reads the whole log.
    A start by the id of a disposed agent spawned by model name reads its options
    from its checkpoint (strict SQLite: the parent is resumed for it)."""
    db = str(tmp_path / "c.db")
    with Runtime(db, backend=backend) as rt:
        built = rt.spawn(lambda t: f"b:{t.content}", label="built")
        modelled = rt.spawn("echo", label="modelled")
        built.followup("x")
        modelled.followup("y")
        assert rt.wait_idle(10)
        built.dispose()
        modelled.dispose()
        rt.sessions.flush()
        assert rt.store.get_checkpoint(built.session_id) is None
        assert rt.store.get_checkpoint(modelled.session_id) is not None
        again = rt.agents.resume(built.session_id, behaviour=lambda t: f"b:{t.content}")
        again.followup("z")
        assert rt.wait_idle(10)
        assert rt.sessions.turn_ends(built.session_id)[-1].output == "b:z"
        child, _mid = rt.subagents.start_continuable(
            ContinuableStartSpec(
                parent=modelled.session_id, provider="local", prompt="hi", label="kid"
            )
        )
        assert rt.wait_idle(10)
        assert rt.sessions.turn_ends(child)[-1].output == "hi"
