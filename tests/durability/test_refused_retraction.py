"""A message refused after its commit, whose retraction does not take it back, is accepted.

Under strict durability a report is committed to the parent's durable inbox before
it is handed to the live parent. Here the parent's write fails between the report's
look at the parent and its delivery (the runtime stops the parent, which then
refuses the report with ``PERSISTENCE_UNAVAILABLE``), and the report is taken back
-- unless it cannot be: the store refuses the retraction (a trigger from outside, a
real SQLite or PostgreSQL error), or a repeat of the same message id was accepted
meanwhile (its caller was told "accepted"). Then the report stays in the inbox and
runs at the parent's next activation, so the call returns its id rather than the
refusal; the parent runs it once. A retraction that works still raises the refusal
and leaves nothing; so does one whose COMMIT's answer was lost (a
:class:`~commit_cut.CommitCut` proxy in front of PostgreSQL), whichever way the
server went: asked again, and the inbox read, it is settled from the store (when
nobody can say, the call raises in doubt, naming the id to retry with). So is a
parent's follow-up to a child resident here that the child refused as it was
admitted (``ADMISSION_CLOSED``, a drain's cut). Both backends, both stores.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from commit_cut import CommitCut
from durability_kit import settled_child
from refusal_kit import Seen, refuse_retractions, resumed
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, MessageId, SessionId, SubagentError

pytestmark = pytest.mark.timeout(90)

MID = MessageId("5" * 32)
DELIVERIES = ["waking", "quiet"]


def _failing_as_it_takes(
    rt: Runtime, parent: Any, delivery: str, meanwhile: Callable[[], object] = lambda: None
) -> None:
    """The parent's write fails just as the report is handed to it: the runtime
    stops the parent (as the writer does), whose intake then refuses the report
    with the failure; ``meanwhile`` runs after the refusal, before it is raised."""
    name = "deliver" if delivery == "waking" else "inject_quiet"
    real = getattr(parent, name)

    def take(*args: Any, **kwargs: Any) -> Any:
        failure = SubagentError("injected write failure", code=ErrorCode.PERSISTENCE_UNAVAILABLE)
        rt.sessions._failed(parent.session_id, failure)
        try:
            return real(*args, **kwargs)
        finally:
            meanwhile()

    setattr(parent, name, take)


def _next_activation(db: str, backend: Backend, seen: Seen, parent_id: SessionId) -> None:
    """The parent's next activation, in a fresh runtime: resumed (unless its sweep
    took it first) and given one more turn, which a quiet report is context of."""
    with Runtime(db, backend=backend) as rt:
        seen.register(rt, "next")
        resumed(rt, parent_id).followup("next")
        assert seen.wait_for(lambda items: any(c == "next" for _, c, _ in items), 30)
        assert rt.wait_idle(30)


def _ran(seen: Seen, delivery: str, content: str) -> int:
    """How many times the parent ran the report ``content``."""
    wanted = content if delivery == "waking" else ("context", content)
    return seen.contents().count(wanted)


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_a_report_whose_retraction_the_store_refuses_is_accepted(
    backend: Backend, db: str, delivery: str
) -> None:
    """R-REP-1, R-REP-5, R-REP-6, L-9: refused by its live parent, the report's
    retraction fails with the store's error: it stays in the inbox, so ``report_from``
    returns its id (it raised the refusal, and the parent ran the report anyway), and
    the parent runs it exactly once, at its next activation."""
    seen = Seen()
    with Runtime(db, backend=backend) as rt:
        seen.register(rt, "first")
        parent = rt.spawn("note", label="parent")
        parent_id = parent.session_id
        child_id = SessionId(settled_child(rt, parent))
        refuse_retractions(db, parent_id)
        _failing_as_it_takes(rt, parent, delivery)
        got = rt.subagents.report_from(child_id, "r1", delivery=delivery, message_id=MID)
        assert got == MID
        assert rt.sessions.persistence is not None
        assert MID in [e.message_id for e in rt.sessions.persistence.pending(parent_id)]
    _next_activation(db, backend, seen, parent_id)
    assert _ran(seen, delivery, "r1") == 1


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_a_repeat_accepted_before_the_retraction_keeps_the_report(
    backend: Backend, db: str, delivery: str
) -> None:
    """R-REP-1, R-REP-5, R-REP-6, L-9: a repeat of the report's id, accepted between the
    parent's refusal and the retraction (its caller told "accepted"), keeps the report:
    the retraction leaves it, the first call returns the id too (it raised, and the
    report the repeat was told of was deleted), and the parent runs it once."""
    seen = Seen()
    answers: list[MessageId] = []
    with Runtime(db, backend=backend) as rt:
        seen.register(rt, "first")
        parent = rt.spawn("note", label="parent")
        parent_id = parent.session_id
        child_id = SessionId(settled_child(rt, parent))

        def repeat() -> None:  # a retry of the same report, by another caller
            answers.append(
                rt.subagents.report_from(child_id, "r2", delivery=delivery, message_id=MID)
            )

        _failing_as_it_takes(rt, parent, delivery, repeat)
        got = rt.subagents.report_from(child_id, "r2", delivery=delivery, message_id=MID)
        assert answers == [MID]
        assert got == MID
    _next_activation(db, backend, seen, parent_id)
    assert _ran(seen, delivery, "r2") == 1


@pytest.mark.parametrize("delivery", DELIVERIES)
def test_a_refused_report_taken_back_is_refused(backend: Backend, db: str, delivery: str) -> None:
    """R-REP-1, L-9: the plain case -- the parent refuses, the retraction takes the
    report back -- still raises the refusal, leaves nothing in the inbox, and the
    parent never runs it."""
    seen = Seen()
    with Runtime(db, backend=backend) as rt:
        seen.register(rt, "first")
        parent = rt.spawn("note", label="parent")
        parent_id = parent.session_id
        child_id = SessionId(settled_child(rt, parent))
        _failing_as_it_takes(rt, parent, delivery)
        with pytest.raises(SubagentError) as refused:
            rt.subagents.report_from(child_id, "r3", delivery=delivery, message_id=MID)
        assert refused.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
        assert rt.sessions.persistence is not None
        assert rt.sessions.persistence.pending(parent_id) == []
    _next_activation(db, backend, seen, parent_id)
    assert _ran(seen, delivery, "r3") == 0


@pytest.mark.parametrize("committed", [True, False], ids=["committed", "not-committed"])
def test_a_retraction_whose_answer_was_lost_is_settled_from_the_store(
    backend: Backend, pg_url: str, committed: bool
) -> None:
    """R-REP-1, L-9: the retraction's COMMIT answer is lost (PostgreSQL). Whether the
    server took the report back or not, the runtime asks again and reads the inbox:
    the report is taken back, the call raises the refusal, nothing is left, and the
    parent never runs it -- told "accepted" after a retraction that committed, the
    caller's report was gone."""
    seen = Seen()
    with CommitCut(pg_url) as cut, Runtime(cut.url, backend=backend, lease_ttl=300) as rt:
        seen.register(rt, "first")
        parent = rt.spawn("note", label="parent")
        parent_id = parent.session_id
        child_id = SessionId(settled_child(rt, parent))

        def cut_the_retraction() -> None:  # once the parent's own writes are done
            assert parent.wait_disposed(30)
            rt.sessions.flush()
            cut.arm(forward=committed)

        _failing_as_it_takes(rt, parent, "waking", cut_the_retraction)
        with pytest.raises(SubagentError) as refused:
            rt.subagents.report_from(child_id, "r4", delivery="waking", message_id=MID)
        assert refused.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
        assert "stopped accepting" in str(refused.value)  # the refusal, not the store's
        assert (cut.cuts, cut.committed) == (1, 1 if committed else 0)
        assert rt.sessions.persistence is not None
        assert rt.sessions.persistence.pending(parent_id) == []
    _next_activation(pg_url, backend, seen, parent_id)
    assert _ran(seen, "waking", "r4") == 0


def test_a_retraction_nobody_can_settle_is_raised_in_doubt(
    backend: Backend, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-REP-1, L-9: the retraction's answer is lost and the store cannot be read
    either (a wrapper: both raise ``PERSISTENCE_UNAVAILABLE``): nobody can say whether
    the report stays, so the call raises in doubt, naming its id -- it raised the
    refusal, though the report stayed -- and a retry with the id returns it; the
    parent runs it once."""
    db = str(tmp_path / "sessions.db")
    seen = Seen()
    with Runtime(db, backend=backend) as rt:
        seen.register(rt, "first")
        parent = rt.spawn("note", label="parent")
        parent_id = parent.session_id
        child_id = SessionId(settled_child(rt, parent))

        def lost(*_args: Any, **_kwargs: Any) -> Any:
            raise SubagentError("connection lost", code=ErrorCode.PERSISTENCE_UNAVAILABLE)

        def cut_off() -> None:
            monkeypatch.setattr(rt.sessions, "retract", lost)
            monkeypatch.setattr(rt.sessions, "pending", lost)

        _failing_as_it_takes(rt, parent, "waking", cut_off)
        with pytest.raises(SubagentError) as doubt:
            rt.subagents.report_from(child_id, "r5", delivery="waking", message_id=MID)
        monkeypatch.undo()
        assert doubt.value.code == ErrorCode.PERSISTENCE_UNAVAILABLE
        assert isinstance(doubt.value.hint, dict)
        assert doubt.value.hint.get("in_doubt") is True
        assert doubt.value.hint.get("message_id") == MID
        assert rt.subagents.report_from(child_id, "r5", delivery="waking", message_id=MID) == MID
    _next_activation(db, backend, seen, parent_id)
    assert _ran(seen, "waking", "r5") == 1


@pytest.mark.parametrize("keeps", ["store-error", "repeat"])
def test_a_followup_its_resident_child_refused_but_not_taken_back_is_accepted(
    backend: Backend, db: str, keeps: str
) -> None:
    """R-FUP-1, R-FUP-5, L-8: a parent's follow-up to a child resident here is
    committed, then refused as it is admitted (a drain cut the child off:
    ``ADMISSION_CLOSED``), and cannot be taken back -- the store refuses the
    retraction, or a repeat of its id was accepted meanwhile. It stays in the
    child's inbox, so ``followup`` returns its id (it raised the refusal), and the
    child runs it once, at its next activation."""
    seen = Seen()
    answers: list[MessageId] = []
    with Runtime(db, backend=backend, keep_warm=60) as rt:
        seen.register(rt, "first")
        parent = rt.spawn("note", label="parent")
        parent_id = parent.session_id
        child_id = rt.subagents.start_continuable(
            ContinuableStartSpec(
                parent=parent, provider="local", prompt="hi", label="kid", model="note"
            )
        ).child_id
        assert seen.wait_for(lambda items: any(c == "hi" for _, c, _ in items))
        assert rt.wait_idle(10)
        child = rt.agents.get(child_id)
        assert child is not None  # resident: kept warm
        if keeps == "store-error":
            refuse_retractions(db, child_id)
        real = child.admit_followup

        def admit(*args: Any, **kwargs: Any) -> Any:
            if keeps == "repeat":  # a retry of the same follow-up, by another caller
                answers.append(rt.subagents.followup(parent, child_id, "f1", message_id=MID))
            child.admit_followup = real  # type: ignore[method-assign]
            raise SubagentError("drained", code=ErrorCode.ADMISSION_CLOSED)

        child.admit_followup = admit  # type: ignore[method-assign]
        assert rt.subagents.followup(parent, child_id, "f1", message_id=MID) == MID
        assert answers == ([MID] if keeps == "repeat" else [])
    with Runtime(db, backend=backend) as rt:
        seen.register(rt, "next")
        rt.subagents.followup(resumed(rt, parent_id), child_id, "then")
        assert seen.wait_for(lambda items: any(c == "then" for _, c, _ in items), 30)
        assert rt.wait_idle(30)
    assert seen.contents().count("f1") == 1
