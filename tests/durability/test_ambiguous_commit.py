"""A COMMIT the server made whose answer was lost: the accepted message runs once.

``docs/postgres.md``: a batch whose connection is lost is failed with
``PERSISTENCE_UNAVAILABLE`` and not retried -- "its commit may or may not have
happened" -- and the caller retries with its ``message_id``. Whichever way the
commit went, what the store holds runs once, in acceptance order, in the live
activation (R-DUR-1, R-DUR-2, R-FUP-5). A :class:`~commit_cut.CommitCut` proxy
between the runtime and a real PostgreSQL server forwards a COMMIT, waits for the
server's answer and drops it with the connection (or, ``committed=False``, cuts
before the COMMIT reaches the server):

* an acceptance (``followup``, ``agents.send`` to an agent live here) committed,
  already taken by the live activation: the retry by id, answered "duplicate",
  used to queue nothing, and the message never ran while the agent stayed live --
  nor did it run before a later follow-up;
* the mail pickup's hand-over of a message another runtime committed: it stayed
  taken by the holder's epoch and never ran;
* a ``start_continuable`` by the parent's id, the parent live here: the child was
  created leased to this runtime (kept alive by its heartbeat), the retry returned
  its handle, and its prompt never ran;
* a follow-up to a continuable child resident here (committed taken by its
  activation): as for a top-level agent's;
* a waking report of a continuable child to its live parent: as for a follow-up;
* a resume whose lease acquisition lost its answer: the lease stayed this
  runtime's in the store, with no activation here, and this runtime's heartbeat
  (it held other leases) kept it live -- every other process was refused
  ``LEASE_HELD`` for as long as this one lived;
* the take-back of a start by the parent's id that nobody could run: the start
  returned the handle of the child it had deleted (or kept a child it could
  have withdrawn at once).

Each cut checks what the server did (``cut.committed``): a COMMIT psycopg runs as
a prepared statement carries no ``COMMIT`` text, and the one it prepares commits
nothing (see ``commit_cut``).

The ``committed=False`` cases passed before the fix too: they guard the other
outcome (nothing committed: the retry commits it, and it runs once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from commit_cut import CommitCut
from durability_kit import Noted, resumed_elsewhere, until
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, MessageId, SubagentError, new_message_id

OUTCOMES = pytest.mark.parametrize("committed", [True, False], ids=["committed", "not-committed"])


@pytest.fixture
def cut(pg_url: str) -> Iterator[CommitCut]:
    """The proxy in front of this test's PostgreSQL schema (``pg_url``)."""
    with CommitCut(pg_url) as proxy:
        yield proxy


@pytest.fixture
def noted() -> Noted:
    return Noted()


@pytest.fixture
def rt(backend: Backend, cut: CommitCut, noted: Noted) -> Iterator[Runtime]:
    """A strict runtime whose store connections pass through ``cut``."""
    with Runtime(cut.url, backend=backend) as runtime:
        noted.register(runtime, "rt")
        yield runtime


def _settled(rt: Runtime) -> Any:
    """A live agent that ran one turn, with nothing of it left to write."""
    agent = rt.spawn("note")
    agent.followup("first")
    assert agent.wait_idle(10)
    rt.sessions.flush()
    return agent


def _lost(cut: CommitCut, committed: bool, offer: Callable[[], Any]) -> None:
    """``offer()`` with its COMMIT's answer lost: it raises PERSISTENCE_UNAVAILABLE."""
    cut.arm(forward=committed)
    with pytest.raises(SubagentError) as err:
        offer()
    assert err.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
    assert cut.cuts == 1
    assert cut.committed == (1 if committed else 0)  # what the server did, as meant


def _offer(rt: Runtime, agent: Any, via: str, mid: MessageId) -> Callable[[], Any]:
    if via == "followup":
        return lambda: agent.followup("second", message_id=mid)
    return lambda: rt.agents.send(agent.session_id, "second", message_id=mid)


def _ran_once_each(rt: Runtime, agent: Any, noted: Noted, expected: list[str]) -> None:
    assert noted.wait_for(lambda items: len(items) >= len(expected), 20)
    assert agent.wait_idle(10)
    rt.sessions.flush()
    assert noted.contents() == expected
    assert rt.store is not None
    assert rt.store.pending(agent.session_id) == []


@OUTCOMES
@pytest.mark.parametrize("via", ["followup", "send"])
def test_a_retry_by_id_runs_the_message_whose_commit_answer_was_lost(
    rt: Runtime, cut: CommitCut, noted: Noted, via: str, committed: bool
) -> None:
    """R-DUR-1, R-FUP-5: the first call raises; the retry with its id returns the id,
    and the message runs once, before a later follow-up."""
    agent = _settled(rt)
    mid = new_message_id()
    offer = _offer(rt, agent, via, mid)
    _lost(cut, committed, offer)
    assert offer() == mid
    assert offer() == mid  # a second retry changes nothing
    agent.followup("third")
    _ran_once_each(rt, agent, noted, ["first", "second", "third"])


@pytest.mark.parametrize("via", ["followup", "send"])
def test_a_message_whose_commit_answer_was_lost_runs_before_a_later_one(
    rt: Runtime, cut: CommitCut, noted: Noted, via: str
) -> None:
    """R-DUR-1, R-FUP-5: nobody retries it; committed, it runs all the same, in
    acceptance order -- before the follow-up accepted after it, in this activation."""
    agent = _settled(rt)
    _lost(cut, True, _offer(rt, agent, via, new_message_id()))
    agent.followup("third")
    _ran_once_each(rt, agent, noted, ["first", "second", "third"])


@OUTCOMES
def test_a_message_from_another_runtime_runs_when_its_hand_over_answer_was_lost(
    backend: Backend, cut: CommitCut, pg_url: str, noted: Noted, committed: bool
) -> None:
    """R-DUR-1, R-DUR-2: another runtime (a process of its own, as far as leases and
    doorbells go) commits a message for a session this one holds and rings it; the
    holder's hand-over loses its answer. The message runs once, in the holder,
    before what the holder accepts after it."""
    with (
        Runtime(cut.url, backend=backend) as holder,
        Runtime(pg_url, backend=backend) as other,
    ):
        noted.register(holder, "holder")
        noted.register(other, "other")
        agent = _settled(holder)
        cut.arm(forward=committed)  # the holder's next COMMIT: the pickup's hand-over
        other.agents.send(agent.session_id, "from elsewhere", message_id=new_message_id())
        assert noted.runs("from elsewhere", ["holder"], 20)
        agent.followup("after")
        _ran_once_each(holder, agent, noted, ["first", "from elsewhere", "after"])
        assert cut.cuts == 1
        assert cut.committed == (1 if committed else 0)


@OUTCOMES
def test_a_start_by_id_whose_commit_answer_was_lost_runs_its_prompt_once(
    rt: Runtime, cut: CommitCut, noted: Noted, committed: bool
) -> None:
    """R-CONT-1, R-CONT-9, R-DUR-1: a start by the parent's id, the parent live here,
    raises; its retry by id returns the child, and the child's prompt runs once
    (the child was not left leased to this runtime with its prompt taken)."""
    root = _settled(rt)
    mid = new_message_id()
    spec = ContinuableStartSpec(
        parent=root.session_id, provider="local", prompt="PROMPT", label="w",
        model="note", message_id=mid,
    )  # fmt: skip
    _lost(cut, committed, lambda: rt.subagents.start_continuable(spec))
    handle = rt.subagents.start_continuable(spec)
    assert handle.message_id == mid
    assert noted.runs("PROMPT", ["rt"], 20)
    assert rt.subagents.start_continuable(spec) == handle
    assert rt.wait_idle(10)
    rt.sessions.flush()
    assert noted.ran("PROMPT") == ["rt"]
    assert rt.store is not None
    assert rt.store.pending(handle.child_id) == []


@OUTCOMES
def test_a_resident_child_s_followup_whose_commit_answer_was_lost(
    backend: Backend, cut: CommitCut, noted: Noted, committed: bool
) -> None:
    """R-DUR-1, R-FUP-5: the same for a follow-up to a continuable child resident
    here (committed taken by its activation): the retry by id returns the id, and
    the message runs once, before a later follow-up."""
    with Runtime(cut.url, backend=backend, keep_warm=60.0) as rt:
        noted.register(rt, "rt")
        root = rt.spawn(lambda _turn: None)
        spec = ContinuableStartSpec(
            parent=root, provider="local", prompt="first", label="kid", model="note"
        )
        cid = rt.subagents.start_continuable(spec).child_id
        assert noted.wait_for(lambda items: len(items) >= 1, 20)
        child = rt.agents.get(cid)
        assert child is not None and child.wait_idle(10)
        rt.sessions.flush()
        mid = new_message_id()

        def offer() -> Any:
            return rt.subagents.followup(root, cid, "second", message_id=mid)

        _lost(cut, committed, offer)
        assert offer() == mid
        rt.subagents.followup(root, cid, "third")
        _ran_once_each(rt, child, noted, ["first", "second", "third"])


@OUTCOMES
def test_a_report_whose_commit_answer_was_lost_runs_once(
    backend: Backend, cut: CommitCut, noted: Noted, committed: bool
) -> None:
    """R-DUR-1, R-FUP-5: the same for a waking report of a continuable child to its
    live parent (committed taken by the parent's activation): the retry by id
    returns the id, and the report's turn runs once, before a later follow-up.
    Committed, the retry used to be answered "duplicate" with nothing queued: the
    report never ran. (This passed on that code while the proxy looked for the
    text ``COMMIT`` in a packet: the report's was the writer connection's fifth,
    the one psycopg prepares, and the cut fell between its Parse and its
    Execute -- nothing committed, and the retry ran it.)"""
    with Runtime(cut.url, backend=backend, keep_warm=60.0) as rt:
        noted.register(rt, "rt")
        rt.models.register("silent", lambda _options: lambda _turn: None, replace=True)
        parent = _settled(rt)
        spec = ContinuableStartSpec(
            parent=parent, provider="local", prompt="go", label="kid", model="silent"
        )
        cid = rt.subagents.start_continuable(spec).child_id
        child = rt.agents.get(cid)
        assert child is not None and child.wait_idle(10)
        rt.sessions.flush()
        mid = new_message_id()

        def offer() -> Any:
            return rt.subagents.report_from(cid, "second", delivery="waking", message_id=mid)

        _lost(cut, committed, offer)
        assert offer() == mid
        parent.followup("third")
        _ran_once_each(rt, parent, noted, ["first", "second", "third"])


def test_an_error_in_doubt_names_the_generated_message_id(
    rt: Runtime, cut: CommitCut, noted: Noted
) -> None:
    """R-DUR-1, R-FUP-5: a follow-up given no ``message_id`` whose commit answer was
    lost names the id it generated (``hint["message_id"]``, ``hint["in_doubt"]``):
    a retry with it returns it, and the message runs once, before a later one."""
    agent = _settled(rt)
    cut.arm(forward=True)
    with pytest.raises(SubagentError) as err:
        agent.followup("second")
    assert err.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
    hint = err.value.hint
    assert isinstance(hint, dict) and hint["in_doubt"] is True
    mid = MessageId(hint["message_id"])
    assert agent.followup("second", message_id=mid) == mid
    agent.followup("third")
    _ran_once_each(rt, agent, noted, ["first", "second", "third"])


@OUTCOMES
def test_a_resume_whose_lease_answer_was_lost_leaves_no_lease_behind(
    backend: Backend, cut: CommitCut, pg_url: str, noted: Noted, tmp_path: Any, committed: bool
) -> None:
    """L-7, R-DUR-1: a resume here raises: its lease acquisition's answer was lost.
    The lease, taken or not, is no lease of this runtime's for long: another
    process (a real one) resumes the session, and this runtime resumes it again
    once that one let it go. It used to stay this runtime's, renewed by the
    heartbeat of the agent it keeps live, for as long as the runtime lived."""
    with Runtime(cut.url, backend=backend, lease_ttl=2.0) as rt:
        noted.register(rt, "rt", model="mark")
        lost = rt.spawn("mark")
        lost.followup("first")
        assert lost.wait_idle(10)
        sid = lost.session_id
        lost.dispose()
        rt.sessions.flush()
        live = rt.spawn("mark")  # held all along: the heartbeat goes on
        live.followup("live")
        assert live.wait_idle(10)
        rt.sessions.flush()
        assert rt.store is not None and rt.store.get_lease(sid).holder is None  # type: ignore[union-attr]
        _lost(cut, committed, lambda: rt.agents.resume(sid))
        # Ten lease ttls: the lease's own expiry is long past; only a heartbeat holds it.
        assert until(rt, lambda: rt.store.get_lease(sid).holder is None, 20)  # type: ignore[union-attr]
        resumed_elsewhere(rt, pg_url, sid, tmp_path / "marks", backend.name, "2")
        again = rt.agents.resume(sid)
        again.followup("again")
        assert noted.runs("again", ["rt"], 20)


@OUTCOMES
def test_a_withdrawal_whose_commit_answer_was_lost_is_settled_from_the_store(
    backend: Backend, cut: CommitCut, pg_url: str, noted: Noted, committed: bool
) -> None:
    """R-CONT-1, R-DUR-1: a start by the parent's id that nobody can run (nobody
    holds the parent, and its model is not registered here) is withdrawn, and the
    withdrawal's answer is lost. The start raises, and nothing of the child
    remains. It used to return the child's handle -- the start accepted -- with the
    child deleted (committed): its prompt never ran; or (not committed) to keep it
    and its prompt when the store could have withdrawn it at once."""
    with Runtime(pg_url, backend=backend) as other:
        other.models.register("root-only", lambda _o: lambda _turn: None)
        root = other.spawn("root-only", label="root").session_id
    with Runtime(cut.url, backend=backend) as rt:
        noted.register(rt, "rt")
        assert rt.store is not None
        before = sorted(h.id for h in rt.store.all_headers())
        withdraw = rt.sessions.withdraw_unheld

        def cut_withdrawal(*args: Any) -> bool:
            cut.arm(forward=committed)  # this COMMIT's answer is lost
            return withdraw(*args)

        rt.sessions.withdraw_unheld = cut_withdrawal  # type: ignore[method-assign]
        spec = ContinuableStartSpec(
            parent=root, provider="local", prompt="PROMPT", label="w", model="note",
            message_id=new_message_id(),
        )  # fmt: skip
        with pytest.raises(SubagentError) as err:
            rt.subagents.start_continuable(spec)
        assert err.value.code == ErrorCode.MODEL_NOT_FOUND
        assert cut.cuts == 1 and cut.committed == (1 if committed else 0)
        assert sorted(h.id for h in rt.store.all_headers()) == before
        assert not noted.items()
