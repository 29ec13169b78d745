"""Every public call rejects wrong types and out-of-range numbers with a typed error
(issue 19 point 3), and a gevent runtime's ``close()`` from a foreign OS thread
refuses before it changes anything."""

from __future__ import annotations

from typing import Any

import pytest
from subagents.actors import AbortSignal, AgentOptions, Runtime, SubagentStartRequest
from subagents.actors._kernel._backend import Backend
from subagents.actors.testing import Gate
from subagents.protocol import ErrorCode, SubagentError


class _Opaque:
    """An object of no accepted type, with a repr that names no address (test ids
    must be the same in every collecting process)."""

    def __repr__(self) -> str:
        return "<opaque>"


def _deep(depth: int = 10_000) -> list[Any]:
    nested: list[Any] = []
    for _ in range(depth):
        nested = [nested]
    return nested


BAD_TIMEOUTS = ["x", float("nan"), -1, -0.5, True, _Opaque(), -(10**400), _deep()]


def _id(value: Any) -> str:
    return "deep list" if isinstance(value, list) else repr(value)[:20]


def _code(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(SubagentError) as info:
        fn(*args, **kwargs)
    return str(info.value.code)


@pytest.mark.parametrize("bad", BAD_TIMEOUTS, ids=_id)
def test_waits_reject_a_timeout_that_is_not_seconds(backend: Backend, bad: Any) -> None:
    with Runtime(backend=backend) as rt:
        agent = rt.spawn("echo")
        assert _code(rt.wait_idle, bad) == ErrorCode.INVALID_ARGUMENT
        assert _code(agent.wait_idle, bad) == ErrorCode.INVALID_ARGUMENT
        assert _code(agent.wait_disposed, bad) == ErrorCode.INVALID_ARGUMENT
        assert _code(rt.sessions.flush, None, bad) == ErrorCode.INVALID_ARGUMENT
        assert _code(agent.dispose, timeout=bad) == ErrorCode.INVALID_ARGUMENT
        assert not agent.disposed  # refused before anything changed
        assert (
            _code(rt.subagents.drain_continuable_descendants, [agent], timeout=bad)
            == ErrorCode.INVALID_ARGUMENT
        )


def test_an_infinite_timeout_means_no_limit(backend: Backend) -> None:
    with Runtime(backend=backend) as rt:
        agent = rt.spawn("echo")
        agent.followup("hi")
        assert agent.wait_idle(float("inf"))
        assert rt.wait_idle(float("inf"))
        assert agent.wait_idle(10**400)  # past float's range: no limit either
        rt.sessions.flush(None, float("inf"))


@pytest.mark.parametrize("parents", [None, 5, _Opaque(), "zz", b"zz"], ids=repr)
def test_drain_takes_agents(backend: Backend, parents: Any) -> None:
    with Runtime(backend=backend) as rt:
        code = _code(rt.subagents.drain_continuable_descendants, parents)
        assert code == ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "kwargs",
    [
        {"keep_warm": float("nan")},
        {"keep_warm": -1},
        {"adopted_grace": float("nan")},
        {"adopted_grace": -1},
        {"adopted_grace": "30"},
        {"lease_ttl": float("inf")},
        {"projections": "yes"},
        {"default_providers": 1},
        {"durability": "sometimes"},
        {"max_delegation_depth": 0},
    ],
    ids=repr,
)
def test_runtime_arguments(backend: Backend, kwargs: dict[str, Any]) -> None:
    assert _code(Runtime, backend=backend, **kwargs) == ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "kwargs",
    [
        {"model": 3},
        {"model": ""},
        {"provider": None},
        {"persona": 7},
        {"tool_filter": "shell"},
        {"tool_filter": ["shell", 1]},
        {"subagent_depth": -1},
        {"subagent_depth": "x"},
        {"subagent_depth": 2**63},
        {"depth_cap": "x"},
        {"depth_cap": -1},
        {"depth_cap": True},
        {"extensions": 3},
    ],
    ids=repr,
)
def test_agent_options_refuse_what_no_agent_could_use(kwargs: dict[str, Any]) -> None:
    """R-ERR: bad options are ``INVALID_ARGUMENT`` when built, not a raw
    ``TypeError`` in a later turn's delegation or a session the store refuses to
    write after the agent accepted messages."""
    assert _code(AgentOptions, **kwargs) == ErrorCode.INVALID_ARGUMENT


def test_agent_options_keep_a_tool_list_as_a_tuple(backend: Backend) -> None:
    options = AgentOptions(tool_filter=["read", "write"], depth_cap=2, subagent_depth=0)
    assert options.tool_filter == ("read", "write")
    with Runtime(backend=backend) as rt:
        assert rt.spawn("echo", options=options).options.tool_filter == ("read", "write")


def test_ids_and_timeouts_of_reads_and_waits_are_checked(backend: Backend) -> None:
    """A bad session id to ``sessions.flush``, a bad timeout to a run's result or
    to ``delegate`` (inside a turn, before any child starts), a bad ``from_seq`` to
    ``sessions.read``, what is no signal to ``AbortSignal.any``:
    ``INVALID_ARGUMENT`` on both backends alike."""
    with Runtime(backend=backend) as rt:
        assert _code(rt.sessions.flush, "abc") == ErrorCode.INVALID_ARGUMENT
        assert _code(rt.sessions.flush, 3) == ErrorCode.INVALID_ARGUMENT
        codes: list[str] = []

        def boss(turn: Any) -> Any:
            codes.append(_code(turn.subagents.delegate, "local", "x", timeout=-1))
            return len(rt.agents.list())

        agent = rt.spawn(boss)
        agent.followup("go")
        assert agent.wait_idle(10)
        assert codes == [ErrorCode.INVALID_ARGUMENT]
        (end,) = rt.sessions.turn_ends(agent.session_id)
        assert end.output == 1  # no child was started
        run = rt.subagents.start(
            "local", SubagentStartRequest(parent=agent, prompt="p", signal=AbortSignal.never())
        )
        for bad in BAD_TIMEOUTS:
            assert _code(run.result.get, bad) == ErrorCode.INVALID_ARGUMENT
            assert _code(run.result.wait, bad) == ErrorCode.INVALID_ARGUMENT
        run.dispose()
        for seq in ("x", -1, 1.0, None, True):  # raised TypeError, or read the wrong records
            assert _code(rt.sessions.read, agent.session_id, seq) == ErrorCode.INVALID_ARGUMENT
        for keep in ("no", 0, None):  # "no" kept the inbox
            assert _code(agent.cancel, "c", keep_inbox=keep) == ErrorCode.INVALID_ARGUMENT
        for signal in (5, "x", None, _Opaque()):  # raised AttributeError
            assert _code(AbortSignal.any, AbortSignal(), signal) == ErrorCode.INVALID_ARGUMENT
        gate = Gate("g")
        for bad in BAD_TIMEOUTS:  # -1 was TIMEOUT, after counting an arrival
            assert _code(gate.pass_through, None, bad) == ErrorCode.INVALID_ARGUMENT
        assert gate.arrivals == 0


@pytest.mark.backend_specific
def test_gevent_close_from_a_foreign_thread_changes_nothing(start_os_thread: Any) -> None:
    """Issue 19 point 3: ``close()`` from another OS thread is ``WRONG_THREAD`` before
    anything changed; the runtime still works, and closes from its own thread."""
    rt = Runtime(backend="gevent")
    try:
        agent = rt.spawn("echo")
        thread = start_os_thread(rt.close)
        thread.join(30)
        assert isinstance(thread.error, SubagentError)
        assert thread.error.code == ErrorCode.WRONG_THREAD
        agent.followup("still open")
        assert agent.wait_idle(10)
    finally:
        rt.close()
    assert _code(rt.spawn, "echo") == ErrorCode.RUNTIME_CLOSED


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_what_the_log_cannot_hold_is_refused_at_acceptance(
    backend: Backend, tmp_path: Any, store: str
) -> None:
    """Issue 19 point 1 (in part): a lone surrogate in content or a label, a source of
    an unknown kind or with a malformed session id, and an overlong label are
    refused before anything is accepted -- on the memory store too, where nothing
    is encoded at acceptance -- and the session goes on."""
    from subagents.actors import ContinuableStartSpec
    from subagents.protocol import MAX_NAME_LEN, MessageSource

    with Runtime(None if store == "memory" else str(tmp_path / "s.db"), backend=backend) as rt:
        agent = rt.spawn("echo")
        assert _code(agent.followup, "a\ud800") == ErrorCode.ENCODE_ERROR
        for source in (
            MessageSource(kind="bogus"),
            MessageSource(kind="parent", session_id="zz"),  # type: ignore[arg-type]
        ):
            assert _code(agent.followup, "ok", source=source) == ErrorCode.ENCODE_ERROR
        for label in ("bad\ud800", "x" * (MAX_NAME_LEN + 1)):
            assert _code(rt.spawn, "echo", label=label) == ErrorCode.INVALID_ARGUMENT
            spec = ContinuableStartSpec(parent=agent, provider="local", prompt="p", label=label)
            code = _code(rt.subagents.start_continuable, spec)
            assert code == ErrorCode.INVALID_ARGUMENT
        assert list(rt.subagents.list_children(agent.session_id).rows) == []
        agent.followup("héllo, still here")
        assert agent.wait_idle(10)
        rt.sessions.flush()
        assert [r.seq for r in rt.sessions.read(agent.session_id)] == list(
            range(len(rt.sessions.read(agent.session_id)))
        )


@pytest.mark.parametrize("store", ["memory", "sqlite"])
def test_an_output_the_log_cannot_hold_fails_its_turn_and_the_session_goes_on(
    backend: Backend, tmp_path: Any, store: str
) -> None:
    """Issue 19 point 1: a behaviour returning a lone surrogate ends that turn
    ``failed`` with the reason recorded; the next turn completes, and the durable
    log equals the live one."""
    from subagents.protocol import TurnEnd

    outputs = iter(["\udcff", "fine"])
    with Runtime(None if store == "memory" else str(tmp_path / "s.db"), backend=backend) as rt:
        rt.models.register("odd", lambda _o: lambda turn: next(outputs))
        agent = rt.spawn("odd")
        agent.followup("one")
        assert agent.wait_idle(10)
        agent.followup("two")
        assert agent.wait_idle(10)
        rt.sessions.flush()
        live = [r.event for r in rt.sessions.read(agent.session_id)]
        ends = [e for e in live if isinstance(e, TurnEnd)]
        assert [e.stop_reason for e in ends] == ["failed", "completed"]
        assert ends[0].error
        assert not agent.disposed
        if rt.store is not None:
            assert [r.event for r in rt.store.read(agent.session_id)] == live


@pytest.mark.backend_specific
def test_gevent_calls_on_agents_from_a_foreign_thread_are_refused(
    tmp_path: Any, start_os_thread: Any
) -> None:
    """``agents.send`` and ``agents.resume`` -- which may resume a session and wait
    for its claim -- from another OS thread than a gevent runtime's are
    ``WRONG_THREAD``, as its other blocking calls are, and change nothing: they
    ran there, on greenlet primitives that thread cannot use. (A plain
    ``agent.followup`` only enqueues: accepted from anywhere.)"""
    rt = Runtime(str(tmp_path / "s.db"), backend="gevent")
    try:
        agent = rt.spawn("echo", label="a")
        other = rt.spawn("echo", label="b")
        other.dispose()
        calls = {
            "send": lambda: rt.agents.send(agent.session_id, "from afar"),
            "resume": lambda: rt.agents.resume(other.session_id),
        }
        for name, call in calls.items():
            thread = start_os_thread(call)
            thread.join(30)
            assert isinstance(thread.error, SubagentError), name
            assert thread.error.code == ErrorCode.WRONG_THREAD, (name, thread.error)
        assert not agent.disposed and rt.agents.get(other.session_id) is None
        assert rt.sessions.turn_ends(agent.session_id) == []
        agent.followup("here")
        assert agent.wait_idle(10)
    finally:
        rt.close()


def test_resuming_an_agent_live_here_says_where_it_is(backend: Backend, tmp_path: Any) -> None:
    """R-ERR-1, R-RES-2: ``agents.send`` resumed a stored session here (for no user:
    an adoption); the user's ``resume`` of it returns that live agent, the user's
    from then on. A second ``resume`` is ``SESSION_EXISTS`` -- the message names
    ``agents.get``, which returns the live agent (a drain takes only an Agent), and
    ``hint`` the session. It said only "an agent for ... is live"; and the first
    resume was ``SESSION_EXISTS`` too."""
    db = str(tmp_path / "s.db")
    with Runtime(db, backend=backend) as first:
        sid = first.spawn("echo", label="root").session_id
    with Runtime(db, backend=backend) as rt:
        rt.agents.send(sid, "wake up")  # resumed here, by the send
        assert rt.wait_idle(10)
        mine = rt.agents.resume(sid)
        assert mine is rt.agents.get(sid) and not mine.disposed
        with pytest.raises(SubagentError) as info:
            rt.agents.resume(sid)
        assert info.value.code == ErrorCode.SESSION_EXISTS
        assert "agents.get(session_id) returns it" in str(info.value)
        assert info.value.hint == {"session_id": sid}
        assert rt.agents.get(sid) is mine and not mine.disposed
        rt.subagents.drain_continuable_descendants([mine])
