"""A follow-up naming the parent by its session id honours what the caller passes,
as one naming the live ``Agent`` does: ``message_id`` (also when steering) and an
aborted ``signal``. Each case runs with the parent live in the calling runtime
and with it live nowhere (a new runtime on the same file: the tree is cold)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from subagents.actors import AbortController, ContinuableStartSpec, Runtime, Steered
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, MessageEvent, SessionId, SubagentError, new_message_id
from subagents.store import SqliteStore

pytestmark = pytest.mark.timeout(60)


def _tree(db: str, backend: Backend) -> tuple[SessionId, SessionId]:
    with Runtime(db, backend=backend) as rt:
        root = rt.spawn("echo", label="root")
        child = rt.subagents.start_continuable(
            ContinuableStartSpec(parent=root, provider="local", prompt="first", label="c")
        ).child_id
        assert rt.wait_idle(10)
        return root.session_id, child


def _runtime(db: str, backend: Backend, root: SessionId, where: str) -> Runtime:
    rt = Runtime(db, backend=backend)
    if where == "live":
        rt.agents.resume(root)
    return rt


def _contents(db: str, child: SessionId) -> list[Any]:
    """The child's messages: those in its log, then those still waiting."""
    with SqliteStore(db, read_only=True) as store:
        logged = [r.event.content for r in store.read(child) if isinstance(r.event, MessageEvent)]
        waiting = [getattr(e.event, "content", None) for e in store.pending(child)]
    return logged + waiting


@pytest.mark.parametrize("where", ["live", "cold"])
@pytest.mark.parametrize("steer", [False, True])
def test_a_message_id_by_parent_id_is_accepted_once(
    backend: Backend, tmp_path: Path, where: str, steer: bool
) -> None:
    """R-FUP (idempotence): the same ``message_id`` sent twice by the parent's id
    returns that id and runs once. With ``steer=True`` the id was dropped: each
    call minted a new one, and the message ran twice."""
    db = str(tmp_path / "ids.db")
    root, child = _tree(db, backend)
    mid = new_message_id()
    rt = _runtime(db, backend, root, where)
    try:
        answers = [
            rt.subagents.followup(root, child, "once", message_id=mid, steer=steer)
            for _ in range(2)
        ]
        assert rt.wait_idle(20)
    finally:
        rt.close()
    ids = [a.message_id if isinstance(a, Steered) else a for a in answers]
    assert ids == [mid, mid]
    assert all(isinstance(a, Steered) for a in answers) == steer
    assert _contents(db, child).count("once") == 1


@pytest.mark.parametrize("where", ["live", "cold"])
@pytest.mark.parametrize("steer", [False, True])
def test_an_aborted_signal_by_parent_id_accepts_nothing(
    backend: Backend, tmp_path: Path, where: str, steer: bool
) -> None:
    """R-FUP, R-ERR (``CANCELLED`` when the caller's signal was aborted before
    acceptance): by the parent's id the aborted signal was ignored, the message
    committed and run. A signal that is none is ``INVALID_ARGUMENT``."""
    db = str(tmp_path / "signal.db")
    root, child = _tree(db, backend)
    controller = AbortController()
    controller.abort("the caller gave up")
    rt = _runtime(db, backend, root, where)
    try:
        with pytest.raises(SubagentError) as info:
            rt.subagents.followup(root, child, "aborted", signal=controller.signal, steer=steer)
        assert info.value.code == ErrorCode.CANCELLED
        with pytest.raises(SubagentError) as info:
            rt.subagents.followup(root, child, "bad", signal="stop", steer=steer)  # type: ignore[arg-type]
        assert info.value.code == ErrorCode.INVALID_ARGUMENT
        assert rt.wait_idle(20)
    finally:
        rt.close()
    assert _contents(db, child) == ["first"]
