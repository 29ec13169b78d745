"""Calls racing ``Runtime.close()`` (R-DUR, R-LIFE): every call ends promptly
with its answer or a typed error, no agent or actor thread outlives the close,
and what a call reported is what the store holds -- a message whose call
returned its id is accepted (run, or waiting in the durable inbox), one whose
call raised is nowhere. Each race runs many rounds, the close cut in at a
different point of the producers' work each time."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from subagents.actors import ContinuableStartSpec, Runtime, UserAuthority
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, MessageEvent, SubagentError
from subagents.store import SqliteStore

ROUNDS = 12


class _Free:
    holder = None


_FREE = _Free()  # what an unheld session's lease reads as


def _family(rt: Runtime) -> tuple[Any, Any]:
    parent = rt.spawn("echo", label="parent")
    child = rt.subagents.start_continuable(
        ContinuableStartSpec(parent=parent, provider="local", prompt="p", label="c")
    ).child_id
    assert rt.wait_idle(10)
    return parent.session_id, child


def _race_round(backend: Backend, db: str, cut_at: int) -> None:
    """A producer follows the child up by its parent's id; after ``cut_at`` calls
    the runtime closes under it."""
    rt = Runtime(db, backend=backend)
    pid, cid = _family(rt)
    accepted: list[str] = []
    raised: dict[str, str] = {}
    stop = [False]
    enough = backend.event()

    def produce() -> None:
        n = 0
        while not stop[0]:
            n += 1
            content = f"m{n}"
            try:
                rt.subagents.followup(pid, cid, content)
                accepted.append(content)
            except SubagentError as exc:
                raised[content] = str(exc.code)
            except Exception as exc:  # untyped: the test fails on it below
                raised[content] = f"untyped {type(exc).__name__}"
            if n == cut_at:
                enough.set()
            backend.sleep(0)

    task = backend.spawn(produce)
    assert enough.wait(10)
    rt.close()
    stop[0] = True
    task.join(20)
    assert not task.is_alive(), "a follow-up racing close() did not return"
    assert rt.agents.list() == []
    assert not [t.name for t in threading.enumerate() if t.name.startswith("_AgentActor")]
    assert not [c for c in raised.values() if c.startswith("untyped")], raised
    with SqliteStore(db) as store:
        logged = {r.event.content for r in store.read(cid) if isinstance(r.event, MessageEvent)}
        waiting = {e.event.content for e in store.pending(cid)}
    assert not {m for m in raised if m in logged | waiting}, (raised, logged, waiting)
    assert set(accepted) <= logged | waiting


@pytest.mark.slow
def test_followups_racing_close(backend: Backend, tmp_path: Path) -> None:
    for round_ in range(ROUNDS):
        # The close cuts in a little later each round.
        _race_round(backend, str(tmp_path / f"race{round_}.db"), 2 + round_ % 6)


def test_calls_after_close_are_refused_typed(backend: Backend, tmp_path: Path) -> None:
    rt = Runtime(str(tmp_path / "after.db"), backend=backend)
    pid, cid = _family(rt)
    rt.close()
    calls = [
        lambda: rt.subagents.interrupt(cid, UserAuthority(pid)),
        lambda: rt.subagents.followup(pid, cid, "late"),
        lambda: rt.agents.send(pid, "late"),
        lambda: rt.agents.resume(pid),
    ]
    for call in calls:
        with pytest.raises(SubagentError) as info:
            call()
        assert info.value.code in (
            ErrorCode.RUNTIME_CLOSED,
            ErrorCode.STORE_CLOSED,
        ), info.value


def test_a_create_refused_by_the_close_leaves_no_session(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The close begins while a spawn opens its session (forced: the close's first
    step runs inside the open): the spawn raises ``RUNTIME_CLOSED`` and the store
    holds no session of it (it held a committed one, for a call that raised)."""
    db = str(tmp_path / "create.db")
    rt = Runtime(db, backend=backend)
    opened = rt.sessions.open

    def open_as_the_close_begins(*args: Any, **kwargs: Any) -> Any:
        live = opened(*args, **kwargs)
        rt.agents.close()  # what close() does first, on another thread
        return live

    monkeypatch.setattr(rt.sessions, "open", open_as_the_close_begins)
    with pytest.raises(SubagentError) as info:
        rt.spawn("echo", label="refused")
    assert info.value.code == ErrorCode.RUNTIME_CLOSED
    monkeypatch.undo()
    rt.close()
    with SqliteStore(db, read_only=True) as store:
        assert [h.label for h in store.all_headers()] == []


def test_an_admission_the_stopping_registry_dropped_ends_with_the_close(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forced: a follow-up to a settled child asks the registry actor to admit it
    just as the close stops that actor, and the ask is lost (a pykka ``tell``
    racing an actor's stop is dropped). The follow-up ends with the close --
    ``RUNTIME_CLOSED``, its message kept -- where it waited out the admission's
    60 s (found by 300 rounds of the race above)."""
    rt = Runtime(str(tmp_path / "dropped.db"), backend=backend)
    pid, cid = _family(rt)
    materializer = rt.continuation._materializer
    told = backend.event()
    tell = materializer._tell

    def lost_in_the_stop(message: Any) -> None:
        if type(message).__name__ == "Admit":
            told.set()  # never reaches the registry
            return
        tell(message)

    while rt.continuation.activation(cid) is not None:  # settled: a cold follow-up
        backend.sleep(0.01)
    monkeypatch.setattr(materializer, "_tell", lost_in_the_stop)
    out: list[Any] = []

    def follow() -> None:
        try:
            out.append(rt.subagents.followup(pid, cid, "lost admission"))
        except SubagentError as exc:
            out.append(exc.code)

    task = backend.spawn(follow)
    assert told.wait(10)
    rt.close()
    task.join(10)
    assert not task.is_alive(), "the follow-up waited out its admission"
    assert out in ([ErrorCode.RUNTIME_CLOSED], [out[0]]) and out != [ErrorCode.TIMEOUT], out


def _close_among_activations(backend: Backend, db: str, cut_at: int) -> list[Any]:
    """Producers wake cold sessions; the runtime closes after ``cut_at`` calls of
    each. The sessions whose lease is still held after the close."""
    rt = Runtime(db, backend=backend)
    families = [_family(rt) for _ in range(3)]
    for agent in rt.agents.list():
        if agent.parent_session is None:
            agent.dispose()
    stop = [False]
    started = backend.event()

    def poke(seed: int) -> None:
        n = seed
        while not stop[0]:
            n += 1
            pid, cid = families[n % len(families)]
            try:
                if n % 2:
                    rt.agents.send(pid, "x")
                else:
                    rt.subagents.followup(pid, cid, "y")
            except SubagentError:
                pass  # refused by the close: typed (checked by the tests above)
            if n - seed == cut_at:
                started.set()
            backend.sleep(0)

    tasks = [backend.spawn(poke, seed) for seed in range(3)]
    assert started.wait(10)
    rt.close()
    stop[0] = True
    for task in tasks:
        task.join(20)
    with SqliteStore(db, read_only=True) as store:
        return [h.id for h in store.all_headers() if (store.get_lease(h.id) or _FREE).holder]


def test_a_close_racing_cold_activations_leaves_no_lease_held(
    backend: Backend, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """R-DUR, R-LIFE: producers wake cold sessions (a send to a top-level session,
    a follow-up by parent id to a settled child) while the runtime closes. An
    activation that began before the close and registered after it was refused,
    and released its lease through a writer the close had already shut: the
    leases stayed held, and the next process waited a whole ``lease_ttl`` for
    the messages (half the rounds on gevent). The close now waits for the
    activations in flight: after it every lease is released."""
    for round_ in range(ROUNDS):
        held = _close_among_activations(backend, str(tmp_path / f"r{round_}.db"), 3 + round_)
        assert held == [], round_
    assert not [r for r in caplog.records if "releasing session" in r.getMessage()]


def _accepted_or_nowhere(db: str, sid: Any, content: str, outcome: str) -> None:
    """A call that returned left its message accepted (waiting in the session's
    inbox, or run); one that raised left it nowhere."""
    with SqliteStore(db, read_only=True) as store:
        waiting = [e for e in store.pending(sid) if getattr(e.event, "content", None) == content]
        logged = [
            r
            for r in store.read(sid)
            if isinstance(r.event, MessageEvent) and r.event.content == content
        ]
    assert (outcome == "accepted") == bool(waiting or logged), (outcome, waiting, logged)


def test_a_send_committed_as_the_store_closes_is_accepted(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-DUR (accepted means committed): a send to a cold top-level session commits
    its message; the close runs before the session is resumed (forced: inside the
    commit), so the resume is refused and the take-back finds the store closed. The
    send raised ``STORE_CLOSED`` for a message that stayed in the inbox and ran at
    the next activation (a client retrying without an id ran it twice). It returns
    its id now: the message is accepted, and runs at the next activation."""
    db = str(tmp_path / "send.db")
    with Runtime(db, backend=backend) as rt:
        sid = rt.spawn("echo", label="root").session_id
    for round_ in range(4):
        # Adopting nothing: its first sweep, as it opens, would run the message the
        # round before left, and this close cut it (run again: at least once).
        rt = Runtime(db, backend=backend, adopt=False)
        accept = rt.sessions.accept

        def accept_then_close(*args: Any, rt: Runtime = rt, accept: Any = accept) -> Any:
            accepted = accept(*args)
            rt.close()
            return accepted

        monkeypatch.setattr(rt.sessions, "accept", accept_then_close)
        content = f"sent {round_}"
        try:
            rt.agents.send(sid, content)
            outcome = "accepted"
        except SubagentError as exc:
            outcome = str(exc.code)
        monkeypatch.undo()
        rt.close()
        assert outcome == "accepted", round_
        _accepted_or_nowhere(db, sid, content, outcome)
    # (Adopting nothing: the user's resume, not its first sweep, activates it.)
    with Runtime(db, backend=backend, adopt=False) as rt:  # the next one runs them, in order
        agent = rt.agents.resume(sid)
        assert agent.wait_idle(10)
        runs = [
            r.event.content
            for r in rt.sessions.read(sid)
            if isinstance(r.event, MessageEvent) and str(r.event.content).startswith("sent")
        ]
        assert runs == [f"sent {i}" for i in range(4)]


def test_a_start_by_parent_id_committed_as_the_store_closes_is_accepted(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same for a continuable start naming a parent live nowhere: its child is
    committed with the prompt in its inbox, the close runs before the parent is
    woken, and the withdrawal finds the store closed. The start raised for a child
    that stayed and ran later; it returns the child now."""
    db = str(tmp_path / "start.db")
    with Runtime(db, backend=backend) as rt:
        pid = rt.spawn("echo", label="parent").session_id
    rt = Runtime(db, backend=backend)
    create = rt.sessions.create_unheld

    def create_then_close(*args: Any) -> Any:
        created = create(*args)
        rt.close()
        return created

    monkeypatch.setattr(rt.sessions, "create_unheld", create_then_close)
    spec = ContinuableStartSpec(parent=pid, provider="local", prompt="p", label="kept")
    try:
        child = rt.subagents.start_continuable(spec).child_id
        outcome = "accepted"
    except SubagentError as exc:
        outcome = str(exc.code)
        child = None
    monkeypatch.undo()
    rt.close()
    with SqliteStore(db, read_only=True) as store:
        kept = [h.id for h in store.all_headers() if h.label == "kept"]
    assert outcome == "accepted" and kept == [child], (outcome, kept)


def test_no_activation_begins_after_the_close_waited_for_them(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-LIFE: a send's activation passed the registry's open check, then the close
    began and found no activation in flight (forced: between the check and the
    claim), and the activation went on -- it took the session's lease after the
    close stopped waiting for activations, and gave it back through a store the
    close may have shut (the lease then held until it expired). The claim now
    checks again: the activation is refused before it takes the lease, and the
    sent message stays accepted for the next activation."""
    db = str(tmp_path / "claim.db")
    with Runtime(db, backend=backend) as rt:
        sid = rt.spawn("echo", label="root").session_id
    with SqliteStore(db, read_only=True) as store:
        before = store.get_lease(sid)
    assert before is not None
    rt = Runtime(db, backend=backend)
    claims: Any = type(rt.agents._claims)
    claim = claims.claim

    def close_then_claim(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt.agents.close()  # the close's first steps, between the check and the claim
        assert rt.agents.wait_activations(5)
        return claim(self, *args, **kwargs)

    monkeypatch.setattr(claims, "claim", close_then_claim)
    rt.agents.send(sid, "sent as the runtime closes")
    monkeypatch.undo()
    rt.close()
    with SqliteStore(db, read_only=True) as store:
        after = store.get_lease(sid)
        waiting = [e.event.content for e in store.pending(sid)]  # type: ignore[attr-defined]
    assert after is not None and after.epoch == before.epoch, (before, after)
    assert waiting == ["sent as the runtime closes"]


def test_no_create_begins_after_the_close_waited_for_activations(
    backend: Backend, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """R-LIFE, R-DUR: the same window for a spawn -- past the open check when the
    close began and found no claim -- committed its session and lease after the
    close stopped waiting, then was refused at registration and rolled back
    through a writer the close had shut: it raised ``RUNTIME_CLOSED`` with the
    session left in the store, its lease held. Now refused before it opens."""
    db = str(tmp_path / "create-claim.db")
    rt = Runtime(db, backend=backend)
    claims: Any = type(rt.agents._claims)
    claim = claims.claim

    def close_then_claim(self: Any, *args: Any, **kwargs: Any) -> Any:
        rt.agents.close()
        assert rt.agents.wait_activations(5)
        return claim(self, *args, **kwargs)

    opened: list[Any] = []
    open_session = rt.sessions.open

    def open_noted(*args: Any, **kwargs: Any) -> Any:
        opened.append(args[0])  # committed here under strict durability
        return open_session(*args, **kwargs)

    monkeypatch.setattr(claims, "claim", close_then_claim)
    monkeypatch.setattr(rt.sessions, "open", open_noted)
    with pytest.raises(SubagentError) as info:
        rt.spawn("echo", label="late")
    assert info.value.code == ErrorCode.RUNTIME_CLOSED
    assert opened == []  # the rest of the close may shut the writer from here on
    monkeypatch.undo()
    rt.close()
    with SqliteStore(db, read_only=True) as store:
        assert [h.label for h in store.all_headers()] == []
