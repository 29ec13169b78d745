"""``statistics()`` of an agent and of the runtime (issue 18 point 1), on both
backends and both persistent stores: mailbox depth in memory and in the store,
turns and their times, acceptance, replays, deduplication, pending reports,
activations and leases -- and a reader racing producers sees consistent counts.
"""

from __future__ import annotations

import datetime as dt
import itertools
import math
from pathlib import Path
from typing import Any

import pytest
from continuable_kit import Kit
from freezegun import freeze_time
from subagents.actors import Runtime
from subagents.actors._agents._stats import WINDOW
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, MessageId, SubagentError


def _block(gate: str) -> list[list[str]]:
    return [["block", gate]]


def test_an_agent_counts_its_mailbox_turns_and_acceptance(kitp: Kit) -> None:
    """Issue 18 point 1: inbox (memory and durable), running, turns, accepted,
    deduplicated, turn-time percentiles."""
    rt = kitp.rt
    root = kitp.root()
    idle = root.statistics()
    assert (idle.inbox, idle.running, idle.turns, idle.accepted) == (0, False, 0, 0)
    assert idle.turn_p50_ms is None and idle.turn_p99_ms is None
    gate = kitp.gate("g")
    root.followup(_block("g"))
    assert gate.wait_reached(10)
    root.followup("a")
    mid = MessageId("0" * 32)
    root.followup("b", message_id=mid)
    root.followup("b", message_id=mid)  # offered again: nothing new accepted
    busy = root.statistics()
    assert busy.running is True
    assert busy.inbox == 2
    assert busy.accepted == 3
    assert busy.deduplicated == 1
    assert busy.turns == 0
    strict = rt.sessions.strict
    assert busy.durable_inbox == (3 if strict else None)  # the running turn's included
    gate.release()
    assert root.wait_idle(10)
    rt.sessions.flush(root.session_id)  # a message leaves the store with its turn's end
    done = root.statistics()
    assert (done.inbox, done.running, done.turns, done.accepted) == (0, False, 3, 3)
    assert done.durable_inbox == (0 if strict else None)
    assert done.turn_p50_ms is not None and done.turn_p99_ms is not None
    assert 0 <= done.turn_p50_ms <= done.turn_p99_ms
    assert done.session_id == root.session_id


def test_turn_times_are_nearest_rank_percentiles(kit: Kit) -> None:
    """Issue 18 point 1: p50/p99 of turn times, the clock frozen and moved by the
    turns themselves (turn k takes k ms)."""
    with freeze_time("2026-12-02 12:00:00") as frozen:
        kit.script.on_turn = lambda turn: frozen.tick(dt.timedelta(milliseconds=turn.content))
        root = kit.root()
        for ms in range(1, 101):
            root.followup(ms)
        assert root.wait_idle(30)
        stats = root.statistics()
    assert stats.turns == 100
    assert stats.turn_p50_ms == pytest.approx(50.0, abs=0.01)
    assert stats.turn_p99_ms == pytest.approx(99.0, abs=0.01)
    whole = kit.rt.statistics()
    assert whole.turn_p50_ms == pytest.approx(50.0, abs=0.01)
    assert whole.turn_p99_ms == pytest.approx(99.0, abs=0.01)


def test_turn_times_are_those_of_the_last_window_of_turns(kit: Kit) -> None:
    """Issue 18 point 1: the percentiles cover the agent's last WINDOW turns: 100
    slow turns (1 s each) and then WINDOW turns of 1..WINDOW ms leave only the
    latter (p99 would be 1 s if a slow one stayed)."""
    slow = [1000] * 100
    with freeze_time("2026-12-02 12:00:00") as frozen:
        kit.script.on_turn = lambda turn: frozen.tick(dt.timedelta(milliseconds=turn.content))
        root = kit.root()
        for ms in [*slow, *range(1, WINDOW + 1)]:
            root.followup(ms)
        assert root.wait_idle(60)
        stats = root.statistics()
    assert stats.turns == 100 + WINDOW
    assert stats.turn_p50_ms == pytest.approx(WINDOW / 2, abs=0.01)
    assert stats.turn_p99_ms == pytest.approx(math.ceil(0.99 * WINDOW), abs=0.01)


def test_messages_discarded_unrun_are_no_turns_and_leave_the_window_alone(
    backend: Backend, rt_mem: Runtime
) -> None:
    """Issue 18 point 1: ``turns`` counts turns that ran, and the percentiles stay
    over the last WINDOW of them when messages are discarded unrun between. The
    ring's slot was picked by a count that discarded messages raised too: slots
    were skipped and slow times outlived WINDOW fast turns (p99 stayed slow)."""
    from subagents.actors.testing import Gate

    gates: list[Gate] = []
    with freeze_time("2026-12-02 12:00:00") as frozen:

        def behaviour(turn: Any) -> None:
            if turn.content == "slow":
                frozen.tick(dt.timedelta(seconds=1))
            elif turn.content == "block":
                gates[-1].pass_through(turn.signal)

        agent = rt_mem.spawn(behaviour)
        for _ in range(WINDOW):
            agent.followup("slow")
        assert agent.wait_idle(60)
        for _ in range(WINDOW + 40):
            gates.append(Gate())
            agent.followup("block")
            assert gates[-1].wait_reached(10)
            agent.followup("discarded")
            agent.cancel("drop", keep_inbox=False)
            assert agent.wait_idle(10)
        stats = agent.statistics()
    assert stats.turns == WINDOW + WINDOW + 40  # the discarded ones are not turns
    assert stats.accepted == stats.turns + WINDOW + 40
    assert stats.turn_p99_ms is not None and stats.turn_p99_ms < 1000  # no slow one left


def test_a_replayed_turn_is_counted(backend: Backend, tmp_path: Path) -> None:
    """Issue 18 point 1: a message an earlier activation took (its turn cut short by
    the runtime closing) runs again in the next one, counted as replayed."""
    db = str(tmp_path / "replay.db")
    with Runtime(db, backend=backend) as rt1:
        kit1 = Kit(rt1)
        root = kit1.root()
        sid = root.session_id
        root.followup(_block("first"))
        assert kit1.gate("first").wait_reached(10)
    kit1.close()
    with Runtime(db, backend=backend) as rt2:
        kit2 = Kit(rt2)
        kit2.gate("first").release()
        agent = rt2.agents.resume(sid)
        assert agent.wait_idle(10)
        rt2.sessions.flush(sid)
        stats = agent.statistics()
        assert (stats.replayed, stats.turns, stats.durable_inbox) == (1, 1, 0)
        assert rt2.statistics().replayed == 1
        kit2.close()


def test_quiet_reports_wait_for_the_next_turn(kit: Kit) -> None:
    """Issue 18 point 1: reports pending -- a child's quiet report waits in its
    parent until the parent's next turn."""
    root = kit.root()
    root.followup([["start", "kid", [["report", "quiet", "r1"]]]])
    assert kit.script.notes.wait_for(lambda notes: any(n[:2] == ("reported", "kid") for n in notes))
    kit.wait_settled("kid")
    assert root.wait_idle(10)
    assert root.statistics().reports_pending == 1
    assert kit.rt.statistics().reports_pending >= 1
    root.followup("next")
    assert root.wait_idle(10)
    assert root.statistics().reports_pending == 0


def test_the_runtime_sums_live_agents_and_keeps_the_disposed(kitp: Kit) -> None:
    """Issue 18 point 1: the runtime's statistics -- live agents, resident children
    (activations), leases held, turns and acceptance including disposed agents."""
    rt = kitp.rt
    first, second = kitp.root("first"), kitp.root("second")
    for agent in (first, second):
        agent.followup("one")
        agent.followup("two")
        assert agent.wait_idle(10)
    first.dispose()
    stats = rt.statistics()
    assert stats.turns == 4 and stats.accepted == 4
    assert stats.live_agents == 1 and stats.running == 0 and stats.inbox == 0
    leases = rt.sessions.leases
    assert stats.leases_held == (1 if leases is not None else 0)
    gate = kitp.gate("kid-holds")
    second.followup([["start", "kid", _block("kid-holds")]])
    assert gate.wait_reached(10)
    assert second.wait_idle(10)  # its turn started the child and ended
    busy = rt.statistics()
    assert busy.activations == 1
    assert busy.live_agents == 2
    assert busy.running == 1
    assert busy.leases_held == (2 if leases is not None else 0)
    gate.release()


def test_statistics_read_while_producers_follow_up(backend: Backend, rt_mem: Runtime) -> None:
    """Issue 18 point 1, a race: a reader calling statistics() while producers
    follow up sees monotone counts with turns <= accepted <= sent, never a
    negative inbox; at the end every message is counted once."""
    for attempt in range(20):
        agent = rt_mem.spawn("echo")
        sent = 40

        def produce(agent: Any = agent, count: int = sent // 2) -> None:
            for i in range(count):
                agent.followup(f"m{i}")

        producers = [backend.spawn(produce) for _ in range(2)]
        seen: list[Any] = []
        while not agent.idle or any(p.is_alive() for p in producers) or not seen:
            seen.append(agent.statistics())
            backend.sleep(0)
        assert all(p.join(10) for p in producers)
        assert agent.wait_idle(10)
        seen.append(agent.statistics())
        for before, after in itertools.pairwise(seen):
            assert before.accepted <= after.accepted and before.turns <= after.turns, attempt
        assert all(s.inbox >= 0 and s.turns <= s.accepted <= sent for s in seen), attempt
        assert (seen[-1].accepted, seen[-1].turns, seen[-1].inbox) == (sent, sent, 0)
        agent.dispose()


def test_runtime_totals_never_go_back_as_agents_dispose(backend: Backend, tmp_path: Path) -> None:
    """Issue 18 point 1, a race: the runtime's ``turns`` / ``accepted`` count
    "agents disposed since included", so a reader polling while children settle
    and dispose never sees them drop, and ``live_agents`` counts an agent until
    its totals are kept. A disposing agent left the registry a turn before it
    handed its totals over: reads in between lost its counts (a drop at nearly
    every settle on gevent)."""
    with Runtime(str(tmp_path / "s.db"), backend=backend) as rt:

        def lead(turn: Any) -> None:
            for i in range(4):
                turn.subagents.start_continuable("local", f"p{i}", label=f"w{i}", model="echo")

        rt.models.register("lead", lambda _o: lead)
        root = rt.spawn("lead")
        done = backend.event()
        drops: list[Any] = []

        def reader() -> None:
            last = rt.statistics()
            while not done.is_set():
                now = rt.statistics()
                if now.turns < last.turns or now.accepted < last.accepted:
                    drops.append((last, now))
                last = now
                backend.sleep(0)

        watcher = backend.spawn(reader)
        for _ in range(15):
            root.followup("go")
            assert rt.wait_idle(30)
        done.set()
        assert watcher.join(30)
        assert drops == []
        final = rt.statistics()
        assert (final.turns, final.accepted) == (15 * 5, 15 * 5)  # the root's and 4 kids'


def test_a_child_activation_as_the_runtime_sees_it(kitp: Kit) -> None:
    """Issue 18 point 1: ``subagents.statistics(child_id)`` -- the Activation's phase,
    owned children, the durable inbox and the resident agent's counts; after it
    settled, ``absent`` with the store's count."""
    rt = kitp.rt
    root = kitp.root()
    gate = kitp.gate("kid")
    root.followup([["start", "kid", [["start", "grandkid", _block("grand")], ["block", "kid"]]]])
    assert gate.wait_reached(10)
    kid = kitp.sid("kid")
    stats = rt.subagents.statistics(kid)
    assert (stats.child_id, stats.phase, stats.placed) == (kid, "resident", False)
    assert stats.owned_children == 1  # the grandchild, resident and blocked
    assert stats.agent is not None and stats.agent.running
    assert stats.durable_inbox == (1 if rt.sessions.strict else None)
    assert rt.subagents.statistics(kitp.sid("grandkid")).phase == "resident"
    kitp.gate("grand").release()
    gate.release()
    kitp.wait_settled("grandkid")
    kitp.wait_settled("kid")
    rt.sessions.flush(kid)
    settled = rt.subagents.statistics(kid)
    assert (settled.phase, settled.agent, settled.owned_children) == ("absent", None, 0)
    assert settled.durable_inbox == (0 if rt.sessions.strict else None)


def test_child_statistics_refuse_what_is_not_a_child(kitp: Kit) -> None:
    """Issue 18 point 1: bad input is a typed error."""
    rt = kitp.rt
    root = kitp.root()
    with pytest.raises(SubagentError) as top:
        rt.subagents.statistics(root.session_id)
    assert top.value.code == ErrorCode.INVALID_ARGUMENT
    with pytest.raises(SubagentError) as missing:
        rt.subagents.statistics("f" * 32)
    assert missing.value.code == ErrorCode.SESSION_NOT_FOUND
    with pytest.raises(SubagentError) as garbage:
        rt.subagents.statistics("not an id")
    assert garbage.value.code == ErrorCode.INVALID_ARGUMENT


def test_an_agent_s_statistics_read_after_its_runtime_closed(
    backend: Backend, tmp_path: Path
) -> None:
    """Issue 18 point 1: statistics printed after the ``with Runtime(...)`` block (a
    benchmark's habit) are the agent's last counts, with ``durable_inbox=None`` --
    the store closed with the runtime -- not ``STORE_CLOSED``."""
    with Runtime(str(tmp_path / "s.db"), backend=backend) as rt:
        agent = rt.spawn(lambda turn: turn.content)
        for i in range(3):
            agent.followup(i)
        assert agent.wait_idle(10)
        rt.sessions.flush(agent.session_id)  # (the last turn's end is written behind it)
        assert agent.statistics().durable_inbox == 0
    stats = agent.statistics()
    assert (stats.turns, stats.accepted, stats.durable_inbox) == (3, 3, None)
