"""A relaxed runtime on a store that has durable-inbox rows (R-DUR-1, R-DUR-2):
a strict process shares the store, or a strict runtime that crashed left the
rows. The relaxed runtime runs each such message once, in acceptance order, and
marks it done with its turn -- it ran them and left them ``done = 0``, so a
strict holder ran them again later; its resume skipped them, so they ran after
newer messages; and a session whose rows it could not run was re-activated
without end (release, ``WAITING``, its own pickup, adoption, resume...).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from durability_kit import Noted, until
from subagents.actors import ContinuableStartSpec, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import MessageEvent, new_message_id
from subagents.store import open_store


@pytest.fixture
def pair(backend: Backend, db: str) -> Iterator[tuple[Runtime, Runtime, Noted]]:
    """A relaxed and a strict runtime on one store, both running the ``note`` model."""
    noted = Noted()
    with (
        Runtime(db, backend=backend, durability="relaxed") as relaxed,
        Runtime(db, backend=backend) as strict,
    ):
        noted.register(relaxed, "relaxed")
        noted.register(strict, "strict")
        yield relaxed, strict, noted


def _pending(rt: Runtime, sid: object) -> list[object]:
    assert rt.store is not None
    return [e.event.content for e in rt.store.pending(sid)]  # type: ignore[arg-type]


def test_a_message_sent_to_a_relaxed_holder_is_done_once_it_ran(
    pair: tuple[Runtime, Runtime, Noted],
) -> None:
    """A strict process's ``send`` to a session a relaxed runtime holds: the holder
    runs it and the row leaves the durable inbox (it stayed, and ran again at the
    next strict activation)."""
    relaxed, strict, noted = pair
    agent = relaxed.spawn("note")
    relaxed.sessions.flush()  # written behind: in the store for the other runtime
    strict.agents.send(agent.session_id, "hello")
    assert noted.runs("hello", ["relaxed"])
    assert until(strict, lambda: _pending(strict, agent.session_id) == [])
    assert agent.wait_idle(10)
    relaxed.sessions.flush()
    assert _pending(strict, agent.session_id) == []


def test_rows_left_by_a_strict_runtime_run_first_and_once(backend: Backend, db: str) -> None:
    """A strict runtime committed messages for a child and stopped before they ran
    (as a crash leaves them); a relaxed runtime then follows the child up: the
    committed ones run first, in acceptance order, each once, and leave the inbox
    (the relaxed resume skipped them: only the new one ran, the old ones later)."""
    noted = Noted()
    with Runtime(db, backend=backend) as strict:
        noted.register(strict, "strict")
        root = strict.spawn("note", label="root")
        child = strict.subagents.start_continuable(
            ContinuableStartSpec(
                parent=root, provider="local", prompt="p0", label="kid", model="note"
            )
        ).child_id
        assert noted.runs("p0", ["strict"])
        root_id = root.session_id
    with open_store(db) as store:  # committed, taken by nobody, never run
        store.accept(child, [MessageEvent(message_id=new_message_id(), content=c) for c in "ab"])
    with Runtime(db, backend=backend, durability="relaxed") as relaxed:
        noted.register(relaxed, "relaxed")
        relaxed.subagents.followup(root_id, child, "next")
        assert noted.wait_for(lambda items: len(items) >= 4)
        assert relaxed.wait_idle(10)
        assert noted.contents() == ["p0", "a", "b", "next"]
        relaxed.sessions.flush()
        assert until(relaxed, lambda: _pending(relaxed, child) == [])
        logged = [r.event.content for r in relaxed.sessions.read(child)
                  if isinstance(r.event, MessageEvent)]  # fmt: skip
        assert logged == ["p0", "a", "b", "next"]


def test_a_followup_by_id_to_a_relaxed_tree_runs_once_without_churn(
    pair: tuple[Runtime, Runtime, Noted],
) -> None:
    """A strict process follows up a settled child of a root a relaxed runtime
    holds: the message runs once, leaves the inbox, and the child is not
    activated again and again (hundreds of lease epochs a second before)."""
    relaxed, strict, noted = pair
    root = relaxed.spawn("note", label="root")
    child = relaxed.subagents.start_continuable(
        ContinuableStartSpec(parent=root, provider="local", prompt="p0", label="kid", model="note")
    ).child_id
    assert noted.runs("p0", ["relaxed"])
    assert until(relaxed, lambda: relaxed.agents.get(child) is None)  # settled
    relaxed.sessions.flush()
    strict.subagents.followup(root.session_id, child, "by id")
    assert noted.wait_for(lambda items: any(c == "by id" for _, c, _ in items))
    assert until(strict, lambda: _pending(strict, child) == [])
    assert strict.store is not None
    first = strict.store.get_lease(child)
    assert first is not None and first.epoch < 10
    assert relaxed.wait_idle(10) and strict.wait_idle(10)
    assert noted.ran("by id") in (["relaxed"], ["strict"])
