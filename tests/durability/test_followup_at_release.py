"""A follow-up committed for an activation as it settles is not a redelivery.

R-FUP-1, R-DUR-3, R-RES-3. A follow-up to a resident child is committed taken by
the child's activation, then admitted; one the child refuses because it settled
in between is given back to nobody and routed. Its lease used to be released
without waiting for that give-back: the child's next activation, resumed by
another follow-up meanwhile, read the message still taken by the settled one --
as one that may have run -- and its first run was flagged a redelivery.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest
from durability_kit import Noted, until, waits_behind
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Gate
from subagents.protocol import new_message_id


def _gate_call(
    monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, content: Any, gate: Gate
) -> None:
    """``owner.name(content, ...)`` waits at ``gate`` first (other calls do not)."""
    real = getattr(owner, name)

    def gated(first: Any, *args: Any, **kwargs: Any) -> Any:
        if first == content:
            gate.pass_through()
        return real(first, *args, **kwargs)

    monkeypatch.setattr(owner, name, gated)


def test_a_followup_given_back_by_a_settling_child_runs_unflagged(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``b`` is committed for the child's second activation, which settles before
    admitting it (gates hold the retirement, the admission and the give-back in
    turn); ``c`` then resumes the child. ``b`` runs once, not flagged."""
    noted = Noted()
    retiring, admitting, giving = Gate("retire"), Gate("admit"), Gate("give back")
    with Runtime(db, backend=backend) as rt:
        noted.register(rt, "rt")
        root = rt.spawn("echo", label="root")
        spec = ContinuableStartSpec(
            parent=root, provider="local", prompt="t0", label="kid", model="note"
        )
        child = rt.subagents.start_continuable(spec).child_id
        assert rt.wait_idle(30)  # settled: "a" resumes it
        hooks, retire = rt.continuation._hooks, rt.continuation._hooks.retire
        held = threading.Event()

        def gated_retire(activation: Any) -> None:
            if activation.child_id == child and not held.is_set():
                held.set()
                retiring.pass_through()
            retire(activation)

        monkeypatch.setattr(hooks, "retire", gated_retire)
        rt.subagents.followup(root, child, "a")
        assert retiring.wait_reached(30)  # "a" ran; its retirement waits
        second = rt.agents.get(child)
        assert second is not None
        _gate_call(monkeypatch, second, "admit_followup", "b", admitting)
        give_back = rt.sessions.give_back

        b_id = new_message_id()

        def gated_give_back(session_id: Any, message_ids: Any, *args: Any) -> Any:
            if b_id in message_ids:
                giving.pass_through()
            return give_back(session_id, message_ids, *args)

        monkeypatch.setattr(rt.sessions, "give_back", gated_give_back)
        errors: list[BaseException] = []

        def follow(content: str) -> None:
            try:
                mid = b_id if content == "b" else None
                rt.subagents.followup(root, child, content, message_id=mid)
            except BaseException as exc:  # looked at below
                errors.append(exc)

        b = rt.backend.spawn(follow, "b")
        assert admitting.wait_reached(30)  # committed for the second activation
        retiring.release()  # it settles: its gate closes, "b" not admitted
        assert until(rt, lambda: rt.continuation._index.get(child) is None
                     or rt.continuation._index[child].agent is not second
                     or rt.continuation._index[child].phase.name != "RESIDENT", 30)  # fmt: skip
        admitting.release()  # refused: given back ...
        assert giving.wait_reached(30)  # ... once the gate lets it
        c = rt.backend.spawn(follow, "c")
        # "c" waits behind the settling child -- or, its lease released, resumed it
        # (and may have run already).
        assert until(
            rt,
            lambda: (
                waits_behind(rt, child, "c")
                or rt.agents.get(child) not in (None, second)
                or "c" in noted.contents()
            ),
            30,
        )
        giving.release()
        assert b.join(30) is not False and c.join(30) is not False
        assert not errors, errors
        assert rt.wait_idle(30)
        runs = [(content, flagged) for _, content, flagged in noted.items()]
        assert runs.count(("b", False)) == 1 and ("b", True) not in runs, runs
        assert ("c", False) in runs, runs


def test_a_top_level_followup_refused_as_the_agent_is_disposed_never_runs_flagged(
    backend: Backend, db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A top-level agent's follow-up ``b`` is committed taken by its activation;
    the agent is disposed before ``b`` is delivered (a gate holds the delivery).
    A second runtime on the same store then sends ``c``. ``b`` is refused and
    taken back, or runs -- never flagged as a redelivery. The lease used to be
    released before the take-back: the second runtime resumed the session, read
    ``b`` as taken by the disposed activation, and ran it flagged."""
    noted = Noted()
    delivering = Gate("deliver")
    with Runtime(db, backend=backend) as first, Runtime(db, backend=backend) as second:
        noted.register(first, "first")
        noted.register(second, "second")
        agent = first.spawn("note", label="top")
        agent.followup("a")
        assert first.wait_idle(30)
        _gate_call(monkeypatch, agent, "deliver", "b", delivering)
        outcome: list[Any] = []

        def follow() -> None:
            try:
                outcome.append(agent.followup("b"))
            except BaseException as exc:  # looked at below
                outcome.append(exc)

        b = first.backend.spawn(follow)
        assert delivering.wait_reached(30)  # committed, taken by the activation
        agent.dispose(wait=False)
        second.agents.send(agent.session_id, "c")  # resumed there, or committed for it
        delivering.release()
        assert b.join(30) is not False
        assert until(second, lambda: "c" in noted.contents(), 30)
        assert first.wait_idle(30) and second.wait_idle(30)
        runs = [(content, flagged) for _, content, flagged in noted.items()]
        assert ("b", True) not in runs, (runs, outcome)
        assert runs.count(("b", False)) == (0 if isinstance(outcome[0], Exception) else 1)
