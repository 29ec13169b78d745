"""A one-shot start with a message id takes effect once per parent: a start again
with the id an earlier start used under the same parent returns that child's
recorded outcome when its run completed, and runs it once more otherwise (never
leaving two completed children for one id). The model's ``delegate`` carries the
id derived from its place in the turn, as ``start_agent`` does, so a replayed
turn delegating again does not run the child again. The lookup reads the child
by its derived id, never a scan of the store. A bad id is ``INVALID_ARGUMENT``
before any provider work. R-ONE-1, R-ONE-7, R-ONE-9, R-ERR-1 (the crash replay
itself, L-8: ``test_delegate_replay.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from subagents.actors import (
    AbortController,
    LocalProvider,
    Runtime,
    SubagentRun,
    SubagentStartRequest,
    ToolDispatcher,
)
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Block, Gate, Reply, ScriptedBehaviour, wait_quiescent
from subagents.protocol import ErrorCode, SubagentError
from subagents.store import MemoryStore

MID = "0123456789abcdef" * 2
OTHER = "fedcba9876543210" * 2


@pytest.fixture
def kid(rt: Runtime) -> list[Any]:
    """Model ``kid``: records each prompt it runs; a prompt ``"fail once"`` raises
    the first time."""
    ran: list[Any] = []

    def behaviour(turn: Any) -> Any:
        ran.append(turn.content)
        if turn.content == "fail once" and ran.count("fail once") == 1:
            raise RuntimeError("first time unlucky")
        if turn.content == "structured":
            return {"n": len(ran)}
        return f"did {turn.content}"

    rt.models.register("kid", lambda _o: behaviour)
    return ran


def _start(
    rt: Runtime, parent: Any, prompt: Any = "job", provider: str = "local", **fields: Any
) -> SubagentRun:
    fields.setdefault("model", "kid")
    request = SubagentStartRequest(
        parent=parent, prompt=prompt, signal=AbortController().signal, **fields
    )
    return rt.subagents.start(provider, request)


def _outcome(run: SubagentRun) -> Any:
    try:
        return run.result.get(timeout=20)
    finally:
        run.dispose()


def _completed(rt: Runtime, parent: Any) -> list[Any]:
    """The parent's children whose (one) turn completed."""
    rows = rt.subagents.list_children(parent.session_id).rows
    return [
        r.id for r in rows if [e.stop_reason for e in rt.sessions.turn_ends(r.id)] == ["completed"]
    ]


@pytest.mark.parametrize("provider", ["local", "fork"])
def test_a_start_again_with_its_message_id_returns_the_earlier_outcome(
    rt: Runtime, kid: list[Any], provider: str
) -> None:
    """``fork``: the child's log begins with the parent's history (its messages and
    turn ends), and the run is still told by its own prompt."""
    parent = rt.spawn("echo")
    parent.followup("some history")
    assert parent.wait_idle(10)
    first = _start(rt, parent, provider=provider, message_id=MID)
    earlier = _outcome(first)
    assert (earlier.output, earlier.stop_reason) == ("did job", "completed")
    again = _start(rt, parent, provider=provider, message_id=MID)
    assert again.id == first.id and again.local_agent is None  # nothing runs for it
    assert _outcome(again) == earlier
    assert kid == ["job"]
    assert [r.id for r in rt.subagents.list_children(parent.session_id).rows] == [first.id]


def test_the_earlier_structured_result_comes_back(rt: Runtime, kid: list[Any]) -> None:
    """R-ONE-9: what the original call returned, its structured result included."""
    parent = rt.spawn("echo")
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    earlier = _outcome(_start(rt, parent, "structured", output_schema=schema, message_id=MID))
    assert earlier.structured == {"n": 1}
    again = _outcome(_start(rt, parent, "structured", output_schema=schema, message_id=MID))
    assert again == earlier and kid == ["structured"]


def test_the_id_is_the_parents_and_the_starts(rt: Runtime, kid: list[Any]) -> None:
    """Another id, or the same id under another parent, is another start; without
    an id every start runs (as before)."""
    parent, other = rt.spawn("echo"), rt.spawn("echo")
    ids = {
        _start(rt, parent, message_id=MID).id,
        _start(rt, parent, message_id=OTHER).id,
        _start(rt, other, message_id=MID).id,
    }
    plain = [_start(rt, parent) for _ in range(2)]
    for run in plain:
        _outcome(run)
    assert len(ids | {r.id for r in plain}) == 5
    assert rt.wait_idle(20)
    assert len(kid) == 5


def test_an_earlier_run_that_did_not_complete_runs_once_more(rt: Runtime, kid: list[Any]) -> None:
    """The earlier child failed: the start runs again (a child of its own), and a
    further start returns that one's outcome -- one completed child for the id."""
    parent = rt.spawn("echo")
    failed = _start(rt, parent, "fail once", message_id=MID)
    assert _outcome(failed).stop_reason == "failed"
    second = _start(rt, parent, "fail once", message_id=MID)
    assert second.id != failed.id
    done = _outcome(second)
    assert (done.output, done.stop_reason) == ("did fail once", "completed")
    third = _start(rt, parent, "fail once", message_id=MID)
    assert third.id == second.id and _outcome(third) == done
    assert kid == ["fail once", "fail once"]
    assert _completed(rt, parent) == [second.id]


def test_a_start_of_an_id_still_running_is_refused(rt: Runtime) -> None:
    """Its child live here, its run not ended: ``SESSION_EXISTS`` -- not a second
    run that could complete too; once it completed, its outcome comes back."""
    gate = Gate("the first run")
    rt.models.register("held", lambda _o: ScriptedBehaviour([Block(gate), Reply("held")]))
    parent = rt.spawn("echo")
    first = _start(rt, parent, model="held", message_id=MID)
    try:
        assert gate.wait_reached(10)
        with pytest.raises(SubagentError) as err:
            _start(rt, parent, model="held", message_id=MID)
        assert err.value.code == ErrorCode.SESSION_EXISTS
        gate.release()
    finally:
        done = _outcome(first)
    assert (done.output, done.stop_reason) == ("held", "completed")
    again = _start(rt, parent, model="held", message_id=MID)
    assert again.id == first.id and _outcome(again) == done


@pytest.mark.parametrize(
    "bad", ["x", "A" * 32, "0" * 31, 5, b"0" * 32], ids=["short", "upper", "31", "int", "bytes"]
)
def test_a_bad_message_id_is_refused_before_any_provider_work(
    rt: Runtime, kid: list[Any], bad: Any
) -> None:
    """R-ONE-1: a typed ``INVALID_ARGUMENT``; the provider is not called, no child
    exists, nothing ran."""
    starts: list[Any] = []

    class Counting(LocalProvider):
        def start(self, request: Any, descriptor: Any) -> SubagentRun:
            starts.append(request)
            return super().start(request, descriptor)

    rt.subagents.register_provider(Counting(rt, "counting"))
    parent = rt.spawn("echo")
    request = SubagentStartRequest(
        parent=parent, prompt="job", model="kid", signal=AbortController().signal, message_id=bad
    )
    with pytest.raises(SubagentError) as err:
        rt.subagents.start("counting", request)
    assert err.value.code == ErrorCode.INVALID_ARGUMENT
    assert "message_id" in str(err.value)
    assert starts == [] and kid == []
    assert not rt.subagents.list_children(parent.session_id).rows


class _Scans(MemoryStore):
    """A store that counts the reads that walk many sessions."""

    def __init__(self) -> None:
        super().__init__()
        self.scans: list[str] = []

    def list_headers(self, parent_session: Any) -> Any:
        self.scans.append("list_headers")
        return super().list_headers(parent_session)

    def all_headers(self) -> Any:
        self.scans.append("all_headers")
        return super().all_headers()

    def scan_headers(self) -> Any:
        self.scans.append("scan_headers")
        return super().scan_headers()

    def scan_children(self, *args: Any, **kwargs: Any) -> Any:
        self.scans.append("scan_children")
        return super().scan_children(*args, **kwargs)


@pytest.fixture
def scanned(backend: Backend) -> Iterator[tuple[Runtime, _Scans]]:
    store = _Scans()
    with Runtime(store, backend=backend) as runtime:
        yield runtime, store


def test_the_earlier_child_is_found_without_a_scan(scanned: tuple[Runtime, _Scans]) -> None:
    """Among many children of the parent, the earlier one is read by its id (derived
    from the parent's and the message's), not found by walking the store."""
    rt, store = scanned
    rt.models.register("kid", lambda _o: lambda turn: f"did {turn.content}")
    parent = rt.spawn("echo")
    for _ in range(5):
        _outcome(_start(rt, parent))
    earlier = _outcome(_start(rt, parent, message_id=MID))
    store.scans.clear()
    assert _outcome(_start(rt, parent, message_id=MID)) == earlier
    assert store.scans == []


def test_a_delegate_made_again_at_its_place_takes_effect_once(rt: Runtime, kid: list[Any]) -> None:
    """The model layer: the same ``delegate`` at the same place of a turn carries
    the same derived message id (its earlier result comes back); at another place
    it is another call."""
    dispatcher = ToolDispatcher()
    results: list[Any] = []

    def boss(turn: Any) -> str:
        args = {"prompt": "job", "model": "kid"}
        for place in ("0.0", "0.0", "0.1"):
            results.append(dispatcher.dispatch(turn, "delegate", args, place=place))
        return "ok"

    rt.models.register("boss", lambda _o: boss)
    agent = rt.spawn("boss")
    agent.followup("go")
    assert agent.wait_idle(20)
    assert rt.sessions.turn_ends(agent.session_id)[-1].output == "ok"
    first, again, elsewhere = results
    assert first == again, results
    assert first["output"] == "did job" and first["stop_reason"] == "completed"
    assert elsewhere["id"] != first["id"]
    assert kid == ["job", "job"]


def test_a_background_delegate_run_again_delivers_its_own_result(
    rt: Runtime, backend: Backend, kid: list[Any]
) -> None:
    """A background ``delegate`` whose child failed, made again at its place (as a
    replayed turn makes it): the new child's result is delivered as well. Both
    deliveries carried one id derived from the call alone, so the second was
    taken for the first and dropped -- the model was told of a child whose result
    never came."""
    dispatcher = ToolDispatcher()
    delivered: list[Any] = []

    def boss(turn: Any) -> str:
        if isinstance(turn.content, dict):  # a delivered result
            delivered.append(turn.content["delegate_result"])
            return "noted"
        args = {"prompt": "fail once", "model": "kid", "background": True}
        first = dispatcher.dispatch(turn, "delegate", args, place="0.0")["id"]
        while not rt.sessions.turn_ends(first):  # the first child failed
            backend.sleep(0.01)
        again = dispatcher.dispatch(turn, "delegate", args, place="0.0")["id"]
        assert again != first
        return "started"

    rt.models.register("boss", lambda _o: boss)
    agent = rt.spawn("boss")
    agent.followup("go")
    assert wait_quiescent(rt, 20)
    assert sorted(str(d.get("stop_reason")) for d in delivered) == ["completed", "failed"]
