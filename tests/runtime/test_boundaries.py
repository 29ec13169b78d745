"""Bad input at the public boundaries: refused with a typed error before anything
is created, or taken for what it is -- never a plain exception, never a session
the log cannot read back (R-ERR-1). Each case was found feeding odd values to
every public call; each fails on the code before its fix (checked).
"""

from __future__ import annotations

import datetime as dt
import enum
from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest
from subagents.actors import ContinuableStartSpec, LocalProvider, Runtime
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, MessageSource, SubagentError

Pair = namedtuple("Pair", "left right")


def _code(call: Any) -> str:
    with pytest.raises(SubagentError) as caught:
        call()
    return str(caught.value.code)


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = Pair(value, 1)
    return value


def test_a_namedtuple_counts_as_an_array(rt_sqlite: Runtime) -> None:
    """R-ERR-1: a namedtuple packs as an array; nested past the log's depth (or
    holding a time the log cannot read back) it is refused as a list would be --
    it used to be accepted and make the whole session unreadable."""
    agent = rt_sqlite.spawn("echo")
    assert _code(lambda: agent.followup(_nested(100))) == ErrorCode.ENCODE_ERROR
    far = dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5)))
    assert _code(lambda: agent.followup(Pair(far, 1))) == ErrorCode.ENCODE_ERROR
    assert _code(lambda: agent.followup({Pair(1, 2): 3})) == ErrorCode.ENCODE_ERROR
    agent.followup(Pair("a", [1, 2]))
    assert agent.wait_idle(10)
    rt_sqlite.sessions.flush(agent.session_id)
    ends = rt_sqlite.sessions.turn_ends(agent.session_id)
    assert [e.output for e in ends] == [["a", [1, 2]]]  # read back: a list


def test_a_turn_output_nested_too_deep_in_namedtuples_fails_its_turn(rt_sqlite: Runtime) -> None:
    """R-ERR-1: the turn that returned it ends failed; the session stays readable."""
    outputs = iter([_nested(100), "fine"])
    agent = rt_sqlite.spawn(lambda turn: next(outputs))
    agent.followup("one")
    agent.followup("two")
    assert agent.wait_idle(10)
    rt_sqlite.sessions.flush(agent.session_id)
    ends = rt_sqlite.sessions.turn_ends(agent.session_id)
    assert [e.stop_reason for e in ends] == ["failed", "completed"]
    assert ends[1].output == "fine"


class Known(str, enum.Enum):  # noqa: UP042 -- the case: its __str__ is its name
    ROOT = "0123456789abcdef0123456789abcdef"


def test_an_id_of_a_str_subclass_is_its_value(rt: Runtime) -> None:
    """R-ERR-1: a (str, Enum) member holding an id names that id (it used to
    become ``SessionId('Known.ROOT')``, and every later call raised ValueError)."""
    agent = rt.spawn("echo", session_id=Known.ROOT)
    assert agent.session_id == Known.ROOT.value
    assert rt.agents.get(Known.ROOT) is agent
    assert agent.followup("x", message_id=Known.ROOT) == Known.ROOT.value
    assert agent.wait_idle(10)
    assert rt.sessions.turn_ends(Known.ROOT)[0].output == "x"


@pytest.mark.parametrize("bad", [[1], {}, Pair(1, 2), 5, "nothex"])
def test_sessions_read_and_header_refuse_a_value_that_is_no_id(rt: Runtime, bad: Any) -> None:
    """R-ERR-1: ``INVALID_ARGUMENT`` (an unhashable one raised TypeError)."""
    assert _code(lambda: rt.sessions.read(bad)) == ErrorCode.INVALID_ARGUMENT
    assert _code(lambda: rt.sessions.header(bad)) == ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize("name", ["\ud800", "p" * 201, " "])
def test_a_provider_name_no_descriptor_can_hold_is_refused(rt: Runtime, name: str) -> None:
    """R-ERR-1: refused at registration (a lone surrogate used to register, and a
    one-shot start through it left a child whose session could not be stored)."""
    provider = LocalProvider(rt, name=name)
    assert _code(lambda: rt.subagents.register_provider(provider)) == ErrorCode.INVALID_ARGUMENT
    assert rt.subagents.get_provider(name) is None


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"source": MessageSource(kind="bogus")}, ErrorCode.ENCODE_ERROR),
        ({"source": MessageSource(kind="user", trace="x" * 1000)}, ErrorCode.ENCODE_ERROR),
        ({"source": "user"}, ErrorCode.INVALID_ARGUMENT),
        ({"max_inbox": 2**64}, ErrorCode.INVALID_ARGUMENT),
    ],
)
def test_a_continuable_start_refuses_what_its_log_cannot_hold(
    backend: Backend, tmp_path: Path, fields: dict[str, Any], code: str
) -> None:
    """R-ERR-1: refused before anything is created, under relaxed durability too
    (where the writer used to refuse it after the child ran: half stored)."""
    with Runtime(str(tmp_path / "s.db"), backend=backend, durability="relaxed") as rt:
        parent = rt.spawn("echo", label="parent")
        spec = ContinuableStartSpec(
            parent=parent, provider="local", prompt="hi", label="child", model="echo", **fields
        )
        assert _code(lambda: rt.subagents.start_continuable(spec)) == code
        assert rt.sessions.roots() == [rt.sessions.header(parent.session_id)]
        assert rt.subagents.list_children(parent.session_id).rows == ()


@pytest.mark.parametrize(
    "arguments",
    [
        {"lease_ttl": 3e10},
        {"lease_ttl": float("inf")},
        {"keep_warm": float("nan")},
        {"keep_warm": -1},
        {"max_inbox": 2**64},
    ],
)
def test_runtime_arguments_are_refused_before_the_store_is_opened(
    backend: Backend, tmp_path: Path, arguments: dict[str, Any]
) -> None:
    """R-ERR-1: ``INVALID_ARGUMENT``, and no file made (a lease too long for a
    wait used to kill the renewal and mail tasks on threads)."""
    db = tmp_path / "s.db"
    assert _code(lambda: Runtime(str(db), backend=backend, **arguments)) == (
        ErrorCode.INVALID_ARGUMENT
    )
    assert not db.exists()


@pytest.mark.parametrize("name", ["a\0b.db", "\ud800.db"])
def test_a_store_path_no_file_can_have_is_refused(
    backend: Backend, tmp_path: Path, name: str
) -> None:
    """R-ERR-1: ``INVALID_ARGUMENT`` (ValueError, UnicodeEncodeError escaped)."""
    path = str(tmp_path / name)
    assert _code(lambda: Runtime(path, backend=backend)) == ErrorCode.INVALID_ARGUMENT


def test_keep_warm_past_a_floats_range_is_for_ever(backend: Backend) -> None:
    """An int ``keep_warm`` too large for a float keeps children warm (it raised
    OverflowError after the store was opened)."""
    with Runtime(None, backend=backend, keep_warm=2**2000) as rt:
        assert rt.continuation.keep_warm_seconds == float("inf")


class _Raising(dict):  # type: ignore[type-arg]
    def __getitem__(self, key: Any) -> Any:
        raise RuntimeError("a mapping that raises")

    def get(self, key: Any, default: Any = None) -> Any:
        raise RuntimeError("a mapping that raises")


def _deep_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def _cyclic_schema() -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "array"}
    schema["items"] = schema
    schema["x-self"] = schema
    return schema


@pytest.mark.parametrize(
    "schema",
    [
        {"$schema": 5},
        {"$schema": ["x"]},
        _deep_schema(5000),
        _cyclic_schema(),
        _Raising(type="string"),
        {"$ref": "http://127.0.0.1:9/other.json"},
        {"properties": {"a": {"$ref": "file:///etc/passwd"}}},
        {"type": "number", "maximum": float("nan")},
        {"type": "string", "default": b"bytes"},
    ],
    ids=[
        "dialect-int",
        "dialect-list",
        "deep",
        "cyclic",
        "raising",
        "http-ref",
        "file-ref",
        "nan",
        "bytes",
    ],
)
def test_an_output_schema_is_refused_typed(rt: Runtime, schema: Any) -> None:
    """R-ERR-1: ``INVALID_ARGUMENT`` (AttributeError, TypeError, RecursionError
    escaped; a remote ``$ref`` was fetched over HTTP at every turn's end, with no
    timeout; a schema that is not JSON failed every model request), at ``spawn``
    and at ``agents.resume``."""
    assert _code(lambda: rt.spawn("echo", output_schema=schema)) == ErrorCode.INVALID_ARGUMENT


def test_resume_checks_its_options_and_output_schema(rt_sqlite: Runtime) -> None:
    """R-ERR-1: a bad ``options`` or ``output_schema`` to ``agents.resume`` is
    refused before anything changes (a bad schema used to kill the resumed
    agent's actor at its next turn's end, its message left without an end)."""
    agent = rt_sqlite.spawn("echo")
    sid = agent.session_id
    agent.dispose()
    for kwargs in ({"options": 5}, {"output_schema": [1]}, {"output_schema": {"$schema": 5}}):
        code = _code(lambda kwargs=kwargs: rt_sqlite.agents.resume(sid, **kwargs))
        assert code == ErrorCode.INVALID_ARGUMENT, kwargs
    assert rt_sqlite.agents.get(sid) is None
    again = rt_sqlite.agents.resume(sid)
    again.followup("still works")
    assert again.wait_idle(10)
    assert rt_sqlite.sessions.turn_ends(sid)[-1].output == "still works"


def test_a_reference_within_the_schema_resolves_and_nothing_is_fetched(rt: Runtime) -> None:
    """A local ``$ref`` works; one that resolves nowhere fails its turn's
    validation (typed, in the turn's end) without any request being made."""
    local = {"$defs": {"word": {"type": "string"}}, "$ref": "#/$defs/word"}
    agent = rt.spawn("echo", output_schema=local)
    agent.followup("hello")
    assert agent.wait_idle(10)
    assert rt.sessions.turn_ends(agent.session_id)[-1].structured == "hello"
    nowhere = rt.spawn("echo", output_schema={"$ref": "other.json"})
    nowhere.followup("hello")
    assert nowhere.wait_idle(10)
    end = rt.sessions.turn_ends(nowhere.session_id)[-1]
    assert end.structured is None and "cannot be validated" in (end.error or "")


@pytest.mark.parametrize("name", ["\ud800", "m" * 5000])
def test_a_model_or_tool_name_no_log_can_hold_is_refused(rt: Runtime, name: str) -> None:
    """R-ERR-1: refused at registration, not at every later use."""
    assert _code(lambda: rt.models.register(name, lambda _o: None)) == ErrorCode.INVALID_ARGUMENT
    assert _code(lambda: rt.tools.register(name, lambda turn: None)) == ErrorCode.INVALID_ARGUMENT


@pytest.mark.parametrize(
    "call",
    [
        lambda a: a.dispose(flush="no"),
        lambda a: a.dispose(wait=0),
        lambda a: a.dispose(checkpoint="x"),
        lambda a: a.cancel(keep_accepted="x"),
    ],
)
def test_an_agent_s_flags_are_bools(rt: Runtime, call: Any) -> None:
    """R-ERR-1: ``"no"`` is true -- a flag that is no bool is refused, the agent
    untouched (it did what it was told not to)."""
    agent = rt.spawn("echo")
    assert _code(lambda: call(agent)) == ErrorCode.INVALID_ARGUMENT
    agent.followup("still here")
    assert agent.wait_idle(10)


def test_a_turn_s_start_with_a_field_no_request_has_is_refused(rt: Runtime) -> None:
    """R-ERR-1: ``turn.subagents.start``/``delegate``/``start_continuable`` pass their
    extra keywords to the request: one it has not is ``INVALID_ARGUMENT`` (it was
    the dataclass's ``TypeError``), and nothing is started."""
    codes: list[str] = []

    def parent(turn: Any) -> Any:
        subs = turn.subagents
        for call in (
            lambda: subs.start("local", "x", bogus=1),
            lambda: subs.delegate("local", "x", bogus=1),
            lambda: subs.start_continuable("local", "x", label="kid", bogus=1),
        ):
            try:
                call()
            except SubagentError as exc:
                codes.append(str(exc.code))
        return "done"

    agent = rt.spawn(parent)
    agent.followup("go")
    assert agent.wait_idle(10)
    assert codes == [ErrorCode.INVALID_ARGUMENT] * 3
    assert rt.subagents.list_children(agent.session_id).rows == ()


@pytest.mark.parametrize(
    ("schema", "good", "bad"),
    [
        (
            {
                "$id": "https://example.com/answer.json",
                "$defs": {"word": {"type": "string"}},
                "properties": {"w": {"$ref": "https://example.com/answer.json#/$defs/word"}},
            },
            {"w": "hi"},
            {"w": 3},
        ),
        (
            {
                "$defs": {"word": {"$id": "urn:example:word", "type": "string"}},
                "$ref": "urn:example:word",
            },
            "hi",
            3,
        ),
        ({"$ref": "https://json-schema.org/draft/2020-12/schema"}, {"type": "string"}, 3),
        ({"properties": {"link": {"const": {"$ref": "https://example.com/x"}}}}, {}, {"link": 1}),
    ],
    ids=["self-by-id", "embedded-id", "meta-schema", "data-with-ref-key"],
)
def test_a_reference_that_needs_nothing_fetched_is_kept(
    rt: Runtime, schema: Any, good: Any, bad: Any
) -> None:
    """An absolute ``$ref`` to the schema itself (by its ``$id``), to an embedded
    resource, or to a bundled meta-schema, and a ``"$ref"`` key in data, are no
    remote documents: accepted, and validated with nothing fetched."""
    outputs = iter([good, bad])
    agent = rt.spawn(lambda turn: next(outputs), output_schema=schema)
    agent.followup("one")
    agent.followup("two")
    assert agent.wait_idle(10)
    ends = rt.sessions.turn_ends(agent.session_id)
    assert [e.stop_reason for e in ends] == ["completed", "failed"]
    assert ends[0].structured == good
