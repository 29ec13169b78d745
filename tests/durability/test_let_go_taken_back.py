"""A message committed as a runtime that adopts nothing lets a session go (R-DUR:
nothing accepted waits for nobody; ``Runtime(adopt=False)``, ``adopted_grace``).

A ``send`` resumes a top-level session in the runtime it was made in, as an
adoption, let go once quiet. A message another runtime commits while it is let go
is found by the lease's release (``Release.WAITING``), which rings the releasing
runtime: the session is adopted again there -- also by a runtime that adopts
nothing else (a placement host: ``adopt=False``), or with every runtime on the
store such, the message waited for nobody while both ran.

Forced: the other runtime's ``send`` is made right as the session's gate closes
for the let-go, before its lease is released (threads: the let-go runs in the
runtime's alarm thread, where the other runtime is called from).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from subagents.actors import Runtime
from subagents.actors._agents._inbox import Inbox

pytestmark = [pytest.mark.timeout(90), pytest.mark.backend_specific]


def test_a_message_sent_as_the_session_is_let_go_runs_where_it_was_let_go(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = str(tmp_path / "s.db")
    ran: dict[str, threading.Event] = {"a0": threading.Event(), "b0": threading.Event()}

    def recorder(_options: Any) -> Any:
        def on_turn(turn: Any) -> None:
            if turn.content in ran:
                ran[turn.content].set()

        return on_turn

    with (
        Runtime(db, backend="threading", adopt=False, adopted_grace=0.0) as a,
        Runtime(db, backend="threading", adopt=False) as b,
    ):
        for rt in (a, b):
            rt.models.register("rec", recorder)
        root = a.spawn("rec")
        sid = root.session_id
        root.dispose()  # the session rests: nobody holds it
        real = Inbox.close_if_idle
        sent: list[Any] = []

        def close_if_idle(self: Any) -> bool:
            closed = real(self)
            if closed and self.session_id == sid and not sent:
                sent.append(b.agents.send(sid, "b0"))  # a holds it still: it is rung
            return bool(closed)

        monkeypatch.setattr(Inbox, "close_if_idle", close_if_idle)
        a.agents.send(sid, "a0")  # resumed in a, an adoption, let go once quiet
        assert ran["a0"].wait(30)
        assert ran["b0"].wait(30), "the message sent as the session was let go never ran"
        assert sent
