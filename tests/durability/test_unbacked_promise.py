"""A promise row the log does not back costs one activation, which forgets it
(L-8, R-RES-2, R-DUR-*: SQLite and PostgreSQL).

The store's promise rows are a hint beside the log (``subagents.store._promises``).
A row can outlive what backed it: the runtime writes a turn's promise before the
turn's end, in a write batch of its own when the writer takes them apart, so a
crash in between leaves a row and a turn cut short that promised nothing the log
knows of. An activation that finds nothing owed in the log kept such a row (it
cleared the rows only when the log or checkpoint promised something): the session
stayed accepted work for good, and a sweep adopted it again each time it was let
go -- for ever.
"""

from __future__ import annotations

from durability_kit import until
from subagents.actors import Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import SessionId, new_message_id

TTL = 1.0  # the sweep looks every TTL / 3
GRACE = 0.2  # an adoption is let go this soon once quiet


def _unbacked(db: str, backend: Backend) -> SessionId:
    """A top-level session nobody holds whose log promises nothing, with a promise
    row all the same (what the crash between the two batches leaves)."""
    with Runtime(db, backend=backend) as rt:
        rt.models.register("mark", lambda _o: lambda turn: None)
        agent = rt.spawn("mark", label="unbacked")
        agent.followup("hello")
        assert agent.wait_idle(30)
        sid = agent.session_id
    with Runtime(db, backend=backend, adopt=False) as rt:
        assert rt.store is not None
        rt.store.owe(sid, add=[new_message_id()])
        assert len(rt.store.owed(sid)) == 1
    return sid


def test_a_resume_forgets_a_promise_row_the_log_does_not_back(backend: Backend, db: str) -> None:
    sid = _unbacked(db, backend)
    with Runtime(db, backend=backend, adopt=False) as rt:
        rt.models.register("mark", lambda _o: lambda turn: None)
        rt.agents.resume(sid)
        assert rt.wait_idle(30)
        rt.sessions.flush()
        assert rt.store is not None
        assert rt.store.owed(sid) == []


def test_an_adoption_for_an_unbacked_promise_row_is_the_last(backend: Backend, db: str) -> None:
    """The sweep adopts the session once (the row says it is owed something), finds
    nothing owed, forgets the row and lets the agent go: no adoption after it."""
    sid = _unbacked(db, backend)
    with Runtime(db, backend=backend, lease_ttl=TTL, adopted_grace=GRACE) as rt:
        rt.models.register("mark", lambda _o: lambda turn: None)
        assert rt.store is not None
        store = rt.store
        assert until(rt, lambda: store.owed(sid) == [], 30), "the row was never forgotten"
        assert until(rt, lambda: rt.agents.get(sid) is None, 30), "never let go"
        rt.sessions.flush()
        assert sid not in rt.sessions.orphans()
