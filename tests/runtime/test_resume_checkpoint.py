"""Cold resume from a checkpoint: the descriptor survives the compacted read (R-DESC-8)."""

from __future__ import annotations

from subagents.actors import ContinuableStartSpec, Runtime
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
