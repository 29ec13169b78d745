"""``subagents tree`` and ``show`` show each session's state and last activity.

Issue 17 point 2: running, waiting, settled, cancelled, ended, with last activity,
as text and in ``--json``, read with no runtime from databases a runtime (or the
store's own API) wrote.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from subagents.actors import Runtime
from subagents.actors._catalog import ProjectionRegistry, session_state, session_state_unit
from subagents.actors._kernel._backend import Backend
from subagents.actors._kernel._gate import Latch
from subagents.actors._shell._cli import main
from subagents.actors._shell._tree_text import state_text, utc_seconds
from subagents.actors.testing import Block, Fail, Gate, Reply, ScriptedBehaviour
from subagents.protocol import (
    ContinuableDescriptor,
    InterruptEvent,
    MessageEvent,
    OneShotDescriptor,
    ReportEvent,
    SessionHeader,
    TurnEnd,
    TurnStart,
    descriptor_event,
    new_message_id,
    new_session_id,
)
from subagents.store import SqliteStore

pytestmark = pytest.mark.timeout(60)

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def _tree_json(capsys: pytest.CaptureFixture[str], db: str) -> dict[str, dict[str, Any]]:
    """Every listed session's ``--json`` data (top entries and rows) by id."""
    capsys.readouterr()
    assert main(["tree", db, "--json"]) == 0
    out: dict[str, dict[str, Any]] = {}
    for entry in json.loads(capsys.readouterr().out):
        out[entry["id"]] = entry
        for row in entry["descendants"]:
            out[row["id"]] = row
    return out


def _show_json(capsys: pytest.CaptureFixture[str], db: str, sid: str) -> dict[str, Any]:
    capsys.readouterr()
    assert main(["show", db, sid, "--json"]) == 0
    state: dict[str, Any] = json.loads(capsys.readouterr().out)["state"]
    return state


def test_demo_tree_states(tmp_path: Path, backend: Backend, capsys) -> None:
    """The demo's tree: its one-shot children ``ended``, the child it interrupts and
    the drained side project's children ``cancelled``, the rest ``settled``; each
    with a last activity in ``--json`` and on its text line; ``show`` agrees."""
    db = str(tmp_path / "demo.db")
    assert main(["demo", "--db", db, "--backend", backend.name]) == 0
    data = _tree_json(capsys, db)
    by_label = {d["label"]: d for d in data.values()}
    expected = {
        "demo-root": "settled",
        "researcher-A": "settled",
        "summary": "ended",
        "fact-checker": "settled",
        "lookup": "ended",
        "researcher-B": "cancelled",
        "writer": "settled",
        "side-project": "settled",
        "sketch-0": "cancelled",
        "sketch-1": "cancelled",
        "sketch-2": "cancelled",
    }
    assert {label: by_label[label]["state"] for label in expected} == expected
    assert by_label["summary"]["last_turn"] == "completed"
    assert by_label["researcher-B"]["last_turn"] == "cancelled"
    for item in data.values():
        at = dt.datetime.fromisoformat(item["last_activity"])
        assert at.tzinfo is not None
        assert abs(dt.datetime.now(dt.UTC) - at) < dt.timedelta(minutes=10)
    assert main(["tree", db]) == 0
    lines = capsys.readouterr().out.splitlines()
    for label, state in expected.items():
        line = next(x for x in lines if f" {label}  " in x or x.startswith(f"{label}  "))
        assert f"  {state}, last active 20" in line, line
    for label in ("summary", "researcher-B", "writer"):
        sid = by_label[label]["id"]
        assert _show_json(capsys, db, sid) == {
            k: by_label[label][k] for k in ("state", "last_activity", "last_turn")
        }
        assert main(["show", db, sid]) == 0
        assert f"state={expected[label]}" in capsys.readouterr().out


def test_running_and_failed(tmp_path: Path, backend: Backend, capsys) -> None:
    """A turn blocked while the CLI reads is ``running``; a session whose last turn
    failed is ``settled`` with ``last_turn`` ``failed`` (it takes follow-ups)."""
    db = str(tmp_path / "s.db")
    gate = Gate("held")
    with Runtime(db, backend=backend) as rt:
        rt.models.register("blocked", lambda _options: ScriptedBehaviour([Block(gate)]))
        rt.models.register("fails", lambda _options: ScriptedBehaviour([Fail("boom")]))
        rt.models.register("replies", lambda _options: ScriptedBehaviour([Reply("ok")]))
        failed, done, busy = rt.spawn("fails"), rt.spawn("replies"), rt.spawn("blocked")
        failed.followup("go")
        done.followup("go")
        assert rt.wait_idle(10)
        busy.followup("wait here")
        assert gate.wait_reached(10)
        rt.sessions.flush()
        try:
            data = _tree_json(capsys, db)
            assert data[busy.session_id]["state"] == "running"
            assert data[busy.session_id]["last_turn"] is None
            assert _show_json(capsys, db, busy.session_id)["state"] == "running"
            assert main(["tree", db]) == 0
            line = next(x for x in capsys.readouterr().out.splitlines() if busy.session_id in x)
            assert "  running, last active " in line
        finally:
            gate.release()
        assert data[failed.session_id]["state"] == "settled"
        assert data[failed.session_id]["last_turn"] == "failed"
        assert data[done.session_id]["state"] == "settled"
        assert data[done.session_id]["last_turn"] == "completed"
        assert rt.wait_idle(10)
        rt.sessions.flush()
        assert _tree_json(capsys, db)[busy.session_id]["state"] == "settled"


def test_waiting_in_the_log_and_in_the_inbox(tmp_path: Path, capsys) -> None:
    """A message logged that no turn took, or one accepted into the store's durable
    inbox and not yet run, makes its session ``waiting``; its last activity is the
    latest time its log holds, else its creation."""
    db = str(tmp_path / "w.db")
    logged, queued, idle = new_session_id(), new_session_id(), new_session_id()
    with SqliteStore(db) as store:
        for i, sid in enumerate((logged, queued, idle)):
            header = SessionHeader(
                id=sid,
                parent_session=None,
                origin="user",
                delegation_depth=0,
                created_at=T0 + dt.timedelta(minutes=i),
            )
            store.create_session(header)
        mid = new_message_id()
        store.append(
            logged,
            [
                TurnStart(turn=0, at=T0 + dt.timedelta(hours=1), message_ids=(mid,)),
                MessageEvent(message_id=mid, content="first"),
                TurnEnd(turn=0, at=T0 + dt.timedelta(hours=2), stop_reason="completed"),
                MessageEvent(message_id=new_message_id(), content="not run yet"),
            ],
        )
        store.accept(queued, [MessageEvent(message_id=new_message_id(), content="queued")])
    data = _tree_json(capsys, db)
    assert data[logged]["state"] == "waiting"
    assert data[logged]["last_activity"] == (T0 + dt.timedelta(hours=2)).isoformat()
    assert data[queued]["state"] == "waiting"
    assert data[queued]["last_activity"] == (T0 + dt.timedelta(minutes=1)).isoformat()
    assert data[idle] == {**data[idle], "state": "settled", "last_turn": None}
    assert data[idle]["last_activity"] == (T0 + dt.timedelta(minutes=2)).isoformat()
    assert _show_json(capsys, db, queued)["state"] == "waiting"
    assert main(["tree", db]) == 0
    text = capsys.readouterr().out
    assert f"{logged}  waiting, last active 2026-03-01 14:00:00Z" in text
    # The durable inbox's depth (issue 18 point 5's mailbox depth, from the store).
    assert (data[queued]["inbox"], data[logged]["inbox"], data[idle]["inbox"]) == (1, 0, 0)
    assert f"{queued}  waiting, last active 2026-03-01 12:01:00Z, 1 in the inbox" in text


def test_a_session_that_took_a_steered_message_settles(
    tmp_path: Path, backend: Backend, capsys
) -> None:
    """R-STEER: a message steered into a running turn is logged inside it and taken
    by it; once the turn ends the session is ``settled``, not ``waiting`` for ever."""
    db = str(tmp_path / "steer.db")
    gate = Gate("thinking")

    def careful(turn: Any) -> Any:
        gate.pass_through(turn.signal)
        return [m.content for m in turn.steering()]

    with Runtime(db, backend=backend) as rt:
        rt.models.register("careful", lambda _options: careful)
        busy = rt.spawn("careful")
        busy.followup("plan the trip")
        assert gate.wait_reached(10)
        assert busy.followup("and book a hotel", steer=True).outcome == "steered"
        gate.release()
        assert busy.wait_idle(10)
        assert rt.sessions.turn_ends(busy.session_id)[-1].output == ["and book a hotel"]
        sid = busy.session_id
    assert _tree_json(capsys, db)[sid]["state"] == "settled"
    assert _show_json(capsys, db, sid)["state"] == "settled"


def test_an_open_turn_nobody_holds_is_waiting(tmp_path: Path, capsys) -> None:
    """A turn the log shows open is ``running`` while a live process holds the
    session's lease; once the lease is free or expired (the process ended mid-turn)
    the session is ``waiting``: its message runs again at the next activation. It
    showed ``running`` for ever. So is one whose lease names a process of this
    host that has ended (killed: its lease has not expired yet); it showed
    ``running`` until the expiry."""
    import subprocess
    import sys
    import time

    from subagents.store import Holder

    db = str(tmp_path / "open.db")
    held, lapsed, free = new_session_id(), new_session_id(), new_session_id()
    relaxed = new_session_id()  # no durable inbox: nothing runs again
    ended = new_session_id()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    now = time.time()
    with SqliteStore(db) as store:
        for sid in (held, lapsed, free, relaxed, ended):
            store.create_session(
                SessionHeader(
                    id=sid, parent_session=None, origin="user", delegation_depth=0, created_at=T0
                )
            )
            mid = new_message_id()
            if sid != relaxed:
                store.accept(sid, [MessageEvent(message_id=mid, content="work")])
            store.append(
                sid,
                [
                    TurnStart(turn=0, at=T0, message_ids=(mid,)),
                    MessageEvent(message_id=mid, content="work"),
                ],
            )
        store.acquire_lease(held, "alive", now=now, expires=now + 3600)
        store.acquire_lease(lapsed, "gone", now=now - 7200, expires=now - 3600)
        store.acquire_lease(relaxed, "gone", now=now - 7200, expires=now - 3600)
        here = f"{Holder().id.split(':')[0]}:{gone.pid}:0123456789ab"  # this host's
        store.acquire_lease(ended, here, now=now, expires=now + 3600)
    sessions = (held, lapsed, free, relaxed, ended)
    expected = ["running", "waiting", "waiting", "settled", "waiting"]
    data = _tree_json(capsys, db)
    assert [data[s]["state"] for s in sessions] == expected
    assert [_show_json(capsys, db, s)["state"] for s in sessions] == expected
    # The open turn of a process that ended was cut short: ``failed``, as the next
    # activation records it (it was None, as if no turn had run).
    last = [None, "failed", "failed", "failed", "failed"]
    assert [data[s]["last_turn"] for s in sessions] == last


def test_a_damaged_inbox_row_is_a_diagnostic_and_still_counted(tmp_path: Path, capsys) -> None:
    """Of two accepted messages one row does not decode: ``tree`` counts both in the
    inbox, reads the other, names the damaged place (exit 1); reports are counted
    apart (``reports_waiting``)."""
    import sqlite3

    db = str(tmp_path / "d.db")
    sid = new_session_id()
    with SqliteStore(db) as store:
        store.create_session(
            SessionHeader(
                id=sid, parent_session=None, origin="user", delegation_depth=0, created_at=T0
            )
        )
        store.accept(
            sid,
            [
                MessageEvent(message_id=new_message_id(), content="fine"),
                MessageEvent(message_id=new_message_id(), content="to be damaged"),
                ReportEvent(message_id=new_message_id(), content="a report", delivery="quiet"),
            ],
        )
    with sqlite3.connect(db) as conn:
        conn.execute("UPDATE inbox SET body = x'c1' WHERE n = 2")
    conn.close()
    assert main(["tree", db, "--json"]) == 1
    (tree,) = json.loads(capsys.readouterr().out)
    assert (tree["inbox"], tree["reports_waiting"], tree["state"]) == (3, 1, "waiting")
    assert [d["detail"] for d in tree["diagnostics"]] == ["inbox entry 2 does not decode"]
    # `show` says the same of it (it counted the entry and said nothing, exit 0).
    assert main(["show", db, str(sid), "--json"]) == 1
    shown = json.loads(capsys.readouterr().out)
    assert shown["state"]["state"] == "waiting"
    assert [d["detail"] for d in shown["diagnostics"]] == ["inbox entry 2 does not decode"]
    # And as text: it exited 1 and named nothing.
    assert main(["show", db, str(sid)]) == 1
    assert "[corrupt] inbox: inbox entry 2 does not decode" in capsys.readouterr().out


def test_a_quiet_report_alone_does_not_make_its_parent_wait(tmp_path: Path, capsys) -> None:
    """A quiet report waits for the parent's next turn and starts none: the parent
    is ``settled`` with it in its inbox (it showed ``waiting`` for ever); a waking
    report makes it ``waiting``."""
    db = str(tmp_path / "quiet.db")
    quiet, waking = new_session_id(), new_session_id()
    with SqliteStore(db) as store:
        for sid, delivery in ((quiet, "quiet"), (waking, "waking")):
            store.create_session(
                SessionHeader(
                    id=sid, parent_session=None, origin="user", delegation_depth=0, created_at=T0
                )
            )
            report = ReportEvent(message_id=new_message_id(), content="r", delivery=delivery)
            store.accept(sid, [report])
    data = _tree_json(capsys, db)
    assert (data[quiet]["state"], data[quiet]["inbox"], data[quiet]["reports_waiting"]) == (
        "settled",
        1,
        1,
    )
    assert data[waking]["state"] == "waiting"
    assert _show_json(capsys, db, quiet)["state"] == "settled"
    assert _show_json(capsys, db, waking)["state"] == "waiting"


def test_a_gap_in_a_log_is_a_diagnostic_of_tree_as_of_show(tmp_path: Path, capsys) -> None:
    """A deleted event row: ``show`` said so (exit 1), ``tree`` did not (exit 0)."""
    import sqlite3

    db = str(tmp_path / "gap.db")
    with Runtime(db) as rt:
        agent = rt.spawn("echo", label="gappy")
        agent.followup("one")
        assert agent.wait_idle(10)
        sid = agent.session_id
    with sqlite3.connect(db) as conn:
        assert (
            conn.execute(
                "DELETE FROM events WHERE session = ? AND seq = 1", (sid.to_bytes(),)
            ).rowcount
            == 1
        )
    conn.close()
    assert main(["tree", db, "--json"]) == 1
    (tree,) = json.loads(capsys.readouterr().out)
    assert [d["detail"] for d in tree["diagnostics"]] == ["seq 1 missing from the log"]
    assert main(["show", db, str(sid), "--json"]) == 1
    capsys.readouterr()


def test_a_damaged_old_event_leaves_tree_the_rest_of_the_log(tmp_path: Path, capsys) -> None:
    """One undecodable early event row: ``tree`` folded the session's state from
    nothing (no last turn; a settled session read as the fold of an empty log)
    where ``show`` folds around it. Now ``tree`` says what ``show`` says, and names
    the damaged row (exit 1). ("Damage stays local": errors.md.)"""
    import sqlite3

    db = str(tmp_path / "damaged.db")
    with Runtime(db) as rt:
        agent = rt.spawn("echo", label="damaged")
        for text in ("one", "two"):
            agent.followup(text)
        assert agent.wait_idle(10)
        sid = agent.session_id
    with sqlite3.connect(db) as conn:
        changed = conn.execute(
            "UPDATE events SET body = ? WHERE session = ? AND seq = 0",
            (b"\xc1garbage", sid.to_bytes()),
        ).rowcount
        assert changed == 1
    conn.close()
    capsys.readouterr()
    assert main(["show", db, str(sid), "--json"]) == 1
    shown = json.loads(capsys.readouterr().out)["state"]
    assert main(["tree", db, "--json"]) == 1
    (tree,) = json.loads(capsys.readouterr().out)
    assert (tree["state"], tree["last_turn"]) == (shown["state"], shown["last_turn"])
    assert tree["last_turn"] == "completed"
    assert len(tree["diagnostics"]) == 1 and "seq 0" in tree["diagnostics"][0]["detail"]


def _fold(events: list[Any], held: bool = True) -> str:
    return _folded(events, held).state


def _folded(events: list[Any], held: bool = True) -> Any:
    registry = ProjectionRegistry()
    registry.register(session_state_unit)
    states = registry.fold(enumerate(events))
    return session_state(states["session_state"], held=held)


def test_a_one_shot_child_killed_mid_turn_ended_failed() -> None:
    """A one-shot child whose process ended during its turn: ``ended`` (nothing runs
    it again), its last turn ``failed`` -- cut short. ``last_turn`` was None, as if
    it had run no turn; held by a live process, the turn is still ``running``."""
    mid = new_message_id()
    events = [
        descriptor_event(OneShotDescriptor(provider="local", label="o")),
        TurnStart(turn=0, at=T0, message_ids=(mid,)),
        MessageEvent(message_id=mid, content="work"),
    ]
    assert _folded(events, held=False)[::2] == ("ended", "failed")
    assert _folded(events, held=True)[::2] == ("running", None)


@pytest.mark.parametrize(
    ("events", "state"),
    [
        ([], "settled"),
        (["start"], "running"),
        (["start", "message"], "running"),
        (["start", "message", "end"], "settled"),
        (["start", "message", "end", "message"], "waiting"),
        (["start", "message", "end", "waking"], "waiting"),
        (["start", "message", "end", "quiet"], "settled"),
        (["message", "start", "end"], "settled"),
        (["start", "interrupt", "cancelled"], "cancelled"),
        (["start", "end", "interrupt"], "cancelled"),
        (["start", "cancelled", "start"], "running"),
        (["one-shot", "start", "message", "end"], "ended"),
        (["one-shot", "start", "message"], "running"),
        (["one-shot", "start", "cancelled"], "cancelled"),
        (["one-shot", "start", "message", "unheld"], "ended"),
        (["continuable", "start", "failed"], "settled"),
        (["start", "message", "steered", "end"], "settled"),
        (["start", "message", "steered", "end", "message"], "waiting"),
    ],
)
def test_state_fold(events: list[str], state: str) -> None:
    """The ``session_state`` unit over event sequences (a turn logs its messages
    after its start; a message another turn has not taken waits)."""
    mids: list[Any] = []
    out: list[Any] = []
    for name in events:
        if name == "start":
            mids = [new_message_id()]
            out.append(TurnStart(turn=len(out), at=T0, message_ids=tuple(mids)))
        elif name == "message":
            out.append(MessageEvent(message_id=mids[0] if mids else new_message_id(), content=1))
            mids = []
        elif name == "steered":  # a message handed to the open turn, logged inside it
            out.append(MessageEvent(message_id=new_message_id(), content=2))
        elif name in ("waking", "quiet"):
            out.append(ReportEvent(message_id=new_message_id(), content=1, delivery=name))
        elif name in ("end", "cancelled", "failed"):
            stop = "completed" if name == "end" else name
            out.append(TurnEnd(turn=0, at=T0, stop_reason=stop))
        elif name == "interrupt":
            out.append(InterruptEvent(at=T0))
        elif name == "unheld":
            pass
        elif name == "one-shot":
            out.append(descriptor_event(OneShotDescriptor(provider="local", label="o")))
        else:
            d = ContinuableDescriptor(
                provider="local", label="c", agent_provider="local", model="echo"
            )
            out.append(descriptor_event(d))
    # A message before any turn is taken by the next turn's start.
    if events[:2] == ["message", "start"]:
        first = out[0].message_id
        out[1] = TurnStart(turn=0, at=T0, message_ids=(first,))
    # "unheld": no live process holds the session (its lease expired).
    assert _fold(out, held="unheld" not in events) == state


def test_many_trees_are_read_a_window_at_a_time(tmp_path: Path, capsys) -> None:
    """``tree`` reads the logs and inboxes of about 500 sessions per statement (a
    tree is never split): over 1,400 sessions in several windows, and one tree of
    601 bigger than a window, every session shows its own log and inbox."""
    db = str(tmp_path / "many.db")
    headers: list[SessionHeader] = []

    def header(parent: SessionHeader | None, i: int) -> SessionHeader:
        h = SessionHeader(
            id=new_session_id(),
            parent_session=None if parent is None else parent.id,
            origin="user" if parent is None else "subagent",
            delegation_depth=0 if parent is None else parent.delegation_depth + 1,
            created_at=T0 + dt.timedelta(seconds=i),
        )
        headers.append(h)
        return h

    big = header(None, 0)
    for i in range(600):
        header(big, i)
    for i in range(700):
        header(header(None, i), i)
    queued = {h.id: 1 + i % 3 for i, h in enumerate(headers) if i % 7 == 3}
    logged = {h.id: i for i, h in enumerate(headers) if i % 5 == 1}
    with SqliteStore(db) as store:
        kid = ContinuableDescriptor(
            provider="local", label="c", agent_provider="local", model="echo"
        )
        store.write_many(
            [("create", h, [descriptor_event(kid)] if h.parent_session else []) for h in headers]
        )
        for sid, n in queued.items():
            store.accept(
                sid, [MessageEvent(message_id=new_message_id(), content=k) for k in range(n)]
            )
        for sid, i in logged.items():
            mid = new_message_id()
            at = T0 + dt.timedelta(hours=1, seconds=i)
            store.append(
                sid,
                [
                    TurnStart(turn=0, at=at, message_ids=(mid,)),
                    MessageEvent(message_id=mid, content=i),
                    TurnEnd(turn=0, at=at, stop_reason="completed"),
                ],
            )
    data = _tree_json(capsys, db)
    assert set(data) == {str(h.id) for h in headers}
    for h in headers:
        row = data[str(h.id)]
        assert row["inbox"] == queued.get(h.id, 0), h.id
        assert row["state"] == ("waiting" if h.id in queued else "settled"), h.id
        if h.id in logged:
            at = T0 + dt.timedelta(hours=1, seconds=logged[h.id])
            assert row["last_activity"] == at.isoformat(), h.id


@given(
    when=st.datetimes(
        min_value=dt.datetime(1, 1, 1),
        max_value=dt.datetime(9999, 12, 30),
        timezones=st.just(dt.UTC),
    )
    | st.datetimes(
        min_value=dt.datetime(2, 1, 1),
        max_value=dt.datetime(9999, 12, 30),
        timezones=st.builds(
            dt.timezone,
            st.timedeltas(min_value=dt.timedelta(hours=-23), max_value=dt.timedelta(hours=23)),
        ),
    )
)
def test_last_activity_text_is_its_utc_second(when: dt.datetime) -> None:
    """Issue 17 point 2: the text form shows last activity as its UTC second, cut
    (``2026-01-01 10:00:00Z``), whether the stored text is UTC (cut from the string)
    or carries another offset (converted)."""
    expected = when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    assert utc_seconds(when.isoformat()) == expected
    data = {"state": "waiting", "last_activity": when.isoformat()}
    assert state_text(data) == f"waiting, last active {expected}"


def test_a_row_s_activity_says_whether_a_process_holds_it(
    tmp_path: Path, backend: Backend, capsys
) -> None:
    """R-LIST-7 as a reader with no runtime sees it: a child a live process holds is
    ``running`` in ``tree --json``, one settled (or whose process closed) is
    ``inactive`` (the reader's own registry, always empty, said ``inactive`` for
    every row, beside ``"state": "running"``)."""
    db = str(tmp_path / "a.db")
    gate = Gate("held")
    ended = Latch()

    def root(turn: Any) -> None:
        turn.subagents.start_continuable("local", "wait", label="busy", model="blocked")
        turn.subagents.start_continuable("local", "hi", label="quick", model="replies")

    def heard(event: Any) -> None:
        if event.type == "subagent/end":  # only quick settles (keep_warm 0)
            ended.set()

    with Runtime(db, backend=backend) as rt:
        rt.models.register("blocked", lambda _options: ScriptedBehaviour([Block(gate)]))
        rt.models.register("replies", lambda _options: ScriptedBehaviour([Reply("ok")]))
        rt.subagents.subscribe(heard)
        top = rt.spawn(root, label="top")
        top.followup("go")
        try:
            assert gate.wait_reached(10) and ended.wait(10)
            rt.sessions.flush()
            by_label = {d["label"]: d for d in _tree_json(capsys, db).values()}
            assert by_label["busy"]["state"] == "running"
            assert by_label["busy"]["activity"] == "running"
            assert by_label["quick"]["activity"] == "inactive"
        finally:
            gate.release()
    by_label = {d["label"]: d for d in _tree_json(capsys, db).values()}
    assert by_label["busy"]["activity"] == by_label["quick"]["activity"] == "inactive"
