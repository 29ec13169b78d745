"""Issue 19 point 1, the property: one validation at acceptance, equal to what the
store can hold, on every path.

Hypothesis drives every public call that takes a value the log will keep --
``Runtime.spawn`` (model, label), ``models.register`` (a model name the log
records), ``Agent.followup`` (content, source, message id), ``start_continuable``
(prompt, label, model, persona, tool filter, message id, provider),
``subagents.followup`` by agent and by the parent's id, ``report_from``, a one-shot
``start`` (prompt, label, model, persona, tool filter, depth, output schema),
``interrupt`` -- and, inside turns, behaviour outputs, exceptions, reports and
continuable starts, with hostile values: lone surrogates, names past 4096
characters, strings past the codec's 8 MiB and frames at its 16 MiB, nesting at
and past its depth limit, cycles, NaN and infinities, ints past 64 bits, bytes,
tuples, sets, naive datetimes, custom objects and ones whose ``repr``/``==``
raise, map keys of odd types. A runtime with a clock the log cannot hold is a
second property.

Every call either succeeds or raises :class:`SubagentError` (R-ERR-1), never hangs;
afterwards every session still takes a plain follow-up that completes, every event
of every log encodes (the memory store, which encodes nothing, included), and
each session's durable log -- the store reopened after the runtime closed -- equals,
encoded, what the runtime showed as live (R-ONE-1, R-ONE-4, R-CONT-3, R-FUP-1,
R-REP-1, R-INT-7). Both backends; memory, SQLite and PostgreSQL stores.
"""

from __future__ import annotations

import datetime as dt
import decimal
import gc
import logging
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from subagents.actors import (
    AbortSignal,
    AncestorAuthority,
    ContinuableStartSpec,
    Runtime,
    SubagentStartRequest,
    UserAuthority,
)
from subagents.actors._kernel._backend import Backend
from subagents.protocol import (
    MAX_ERROR_LEN,
    MessageEvent,
    MessageSource,
    SessionId,
    SubagentError,
    TurnEnd,
    encode_event,
    encode_header,
    new_message_id,
    new_session_id,
    packb,
    storable_datetime,
)
from subagents.store import MemoryStore, open_store

MIB = 1024 * 1024
PROBE = "c0ffee-probe"  # a command for the probe model: [PROBE, step]
UTC = dt.UTC
#: Examples per backend and store (``SUBAGENTS_PROPERTY_EXAMPLES`` explores further).
SETTINGS = settings(
    max_examples=int(os.environ.get("SUBAGENTS_PROPERTY_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


# -- hostile values ------------------------------------------------------------------


class Odd:
    """An object the codec has no representation for."""


class Bomb:
    """An object every dunder of which raises -- while armed (Hypothesis shows examples)."""

    armed = False

    def _check(self) -> None:
        if Bomb.armed:
            raise RuntimeError("bomb")

    def __repr__(self) -> str:
        self._check()
        return "Bomb()"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        self._check()
        return self is other

    def __hash__(self) -> int:
        self._check()
        return id(self)

    def __len__(self) -> int:
        self._check()
        return 0

    def __iter__(self) -> Iterator[Any]:
        self._check()
        return iter(())

    def __bool__(self) -> bool:
        self._check()
        return True


class Huge:
    """A value of megabytes, built when the example runs (its repr stays short)."""

    def __init__(self, n: int, pair: bool) -> None:
        self.n, self.pair = n, pair

    def make(self) -> Any:
        return ["y" * self.n, "z" * self.n] if self.pair else "h" * self.n

    def __repr__(self) -> str:
        return f"Huge({self.n}, pair={self.pair})"


def real(value: Any) -> Any:
    return value.make() if type(value) is Huge else value


class Str(str):
    pass


class Int(int):
    pass


def _nest(depth: int, kind: str, leaf: Any = "leaf") -> Any:
    value = leaf
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value} if kind == "dict" else (value,)
    return value


def _cycle() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


surrogates = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff"])
odd_text = st.lists(st.one_of(st.characters(exclude_categories=()), surrogates), max_size=10).map(
    "".join
)
long_text = st.builds(
    lambda ch, n: ch * n,
    st.sampled_from(["a", "é", "\U0001f600", "\ud800"]),
    st.sampled_from([4096, 4097, 65535, 65536, 100_001]),
)
#: The codec's limits: a str of 8 MiB; a frame of 16 MiB (two strs of n packed
#: take 2n + 11 bytes); containers 64 deep.
huge = st.one_of(
    st.builds(Huge, st.sampled_from([8 * MIB, 8 * MIB + 1]), st.just(False)),
    st.builds(Huge, st.sampled_from([8388600, 8388602]), st.just(True)),
)
deep = st.builds(
    _nest, st.sampled_from([62, 63, 64, 65, 5000]), st.sampled_from(["list", "dict", "tuple"])
)
ints = st.one_of(
    st.integers(),
    st.sampled_from([2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 2**200]),
)
datetimes = st.one_of(
    st.datetimes(),  # naive
    st.datetimes(timezones=st.just(UTC)),
    st.sampled_from([dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5)))]),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    ints,
    st.floats(),
    st.sampled_from([float("nan"), float("inf"), -0.0]),
    odd_text,
    st.binary(max_size=16),
    datetimes,
    st.builds(new_session_id),
    st.builds(new_message_id),
    st.builds(Odd),
    st.builds(Bomb),
    st.builds(Str, odd_text),
    st.builds(Int, st.integers()),
    st.sampled_from([1j, decimal.Decimal("1.5"), bytearray(b"ba"), range(3), memoryview(b"mv")]),
)
keys = st.one_of(odd_text, ints, st.none(), st.floats(), st.binary(max_size=4), st.booleans())
trees = st.recursive(
    scalars,
    lambda kids: st.one_of(
        st.lists(kids, max_size=3),
        st.tuples(kids, kids),
        st.dictionaries(keys, kids, max_size=3),
        st.frozensets(st.integers(), max_size=2),
        st.sets(odd_text, max_size=2),
    ),
    max_leaves=8,
)
hostile = st.one_of(trees, long_text, deep, st.builds(_cycle), huge)
plain = st.one_of(st.text(max_size=12), st.integers(0, 99), st.just(["a", {"b": 1}]))
values = st.one_of(plain, hostile)
names = st.one_of(st.none(), st.text(max_size=8), odd_text, long_text, scalars)
ids = st.one_of(st.builds(new_message_id), st.text(max_size=40), scalars)
sources = st.one_of(
    st.builds(
        MessageSource,
        kind=st.one_of(st.sampled_from(["user", "parent", "child", "host", "self"]), names),
        session_id=st.one_of(st.none(), st.builds(new_session_id), names),
    ),
    scalars,
)
filters = st.one_of(st.just(["read"]), st.lists(names, max_size=2), scalars)
#: A recursive schema: jsonschema recurses into a cyclic output for ever.
RECURSIVE = {"$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/a"}}}, "$ref": "#/$defs/a"}
schemas = st.one_of(st.sampled_from([{}, {"type": "string"}, RECURSIVE]), trees)
index = st.integers(0, 7)

#: Each call gets its content (plain or hostile) and at most one other argument
#: poisoned, so that most calls reach deep into the runtime before they fail.
POISONS: dict[str, dict[str, Any]] = {
    "spawn": {"behaviour": names, "label": names},
    "followup": {"source": sources, "message_id": ids},
    "send": {"source": sources, "message_id": ids},
    "continuable": {
        "provider": st.one_of(st.just("fork"), names),
        "label": names,
        "model": names,
        "persona": names,
        "tool_filter": filters,
        "message_id": ids,
    },
    "child_followup": {"source": sources, "message_id": ids, "by_id": st.just(True)},
    "report_from": {"delivery": st.one_of(st.just("waking"), names)},
    "start": {
        "provider": st.one_of(st.just("fork"), names),
        "label": names,
        "model": names,
        "persona": names,
        "tool_filter": filters,
        "max_depth": st.one_of(st.just(1), ints, scalars),
        "output_schema": schemas,
    },
    "interrupt": {"target": scalars, "authority": scalars, "ancestor": st.just(True)},
    "dispose": {},
}
poisons = {
    kind: st.one_of(st.none(), *(st.tuples(st.just(f), v) for f, v in fields.items()))
    for kind, fields in POISONS.items()
}

#: Inside a turn of the probe model (``index`` picks from the example's values).
steps = st.one_of(
    st.tuples(st.just("out"), index),
    st.tuples(st.just("raise"), index),
    st.tuples(st.just("report"), index, st.sampled_from(["quiet", "waking"])),
    st.tuples(st.just("start"), index, st.sampled_from(["quiet", "waking"])),
)
ops = st.one_of(
    st.tuples(st.just("probe"), index, st.booleans(), steps),
    st.tuples(st.just("register"), names),
    *(st.tuples(st.just(kind), index, values, poisons[kind]) for kind in POISONS),
)
RAISE, NOW = "the clock raises", "the system's time"
#: What a runtime's clock returns, in turn, once the example's first agent exists:
#: mostly the time, now and then something else.
clocks = st.one_of(
    st.none(),
    st.lists(
        st.tuples(st.integers(0, 3), st.one_of(datetimes, scalars, st.just(RAISE))).map(
            lambda odd: odd[1] if odd[0] == 0 else NOW
        ),
        min_size=1,
        max_size=6,
    ),
)
plans = st.tuples(
    st.lists(values, min_size=1, max_size=4),
    st.lists(ops, min_size=1, max_size=8),
    st.sampled_from(["strict", "relaxed"]),
    st.sampled_from([0.0, float("inf")]),
    clocks,
)


# -- one example -----------------------------------------------------------------------


def call(what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn``'s result, or None when it raised a SubagentError; any other exception
    fails the property (R-ERR-1)."""
    try:
        return fn(*args, **kwargs)
    except SubagentError:
        return None
    except Exception as exc:
        raise AssertionError(f"{what} raised {type(exc).__name__}, not a SubagentError") from exc


class World:
    """One example: its runtime, its hostile values and what it created."""

    def __init__(self, rt: Runtime, pool: list[Any]) -> None:
        self.rt = rt
        self.pool = [real(v) for v in pool]
        self.tops: list[Any] = []
        self.children: list[tuple[Any, SessionId]] = []  # (top-level parent, child id)
        self.known: set[SessionId] = set()
        self.away: list[SessionId] = []  # top-level sessions disposed here
        self.untyped: list[str] = []
        self._lock = threading.Lock()
        rt.models.register("probe", self.factory)
        self.new_top()
        self.continuable(0, "hello", {})  # so every call on a child has one

    def factory(self, _options: Any) -> Any:
        return self.on_turn

    def value(self, i: int) -> Any:
        return self.pool[i % len(self.pool)]

    def on_turn(self, turn: Any) -> Any:
        """The probe model: echo, or run one step of a ``[PROBE, step]`` command."""
        content = turn.content
        if not (type(content) is list and len(content) == 2 and content[0] is not None):
            return content
        if type(content[0]) is not str or content[0] != PROBE:
            return content
        kind, *args = content[1]
        if kind == "out":
            return self.value(args[0])
        if kind == "raise":
            raise RuntimeError(self.value(args[0]))
        try:
            if kind == "report":
                return turn.subagents.report(self.value(args[0]), delivery=args[1])
            prompt = [PROBE, ["report", args[0], args[1]]]
            handle = turn.subagents.start_continuable("local", prompt, label="g", model="probe")
            with self._lock:
                self.known.add(handle.child_id)
            return handle.child_id
        except SubagentError as exc:
            return f"refused: {exc.code}"
        except Exception as exc:
            with self._lock:
                self.untyped.append(f"{kind} in a turn raised {type(exc).__name__}")
            return None

    def top(self, i: int) -> Any:
        return self.tops[i % len(self.tops)]

    def child(self, i: int) -> tuple[Any, SessionId] | None:
        return self.children[i % len(self.children)] if self.children else None

    def run(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "probe":
            content = [PROBE, list(op[3])]
            found = self.child(op[1]) if op[2] else None
            if found is None:
                call("Agent.followup", self.top(op[1]).followup, content)
            else:
                call("subagents.followup", self.rt.subagents.followup, *found, content)
        elif kind == "register":
            if call("models.register", self.rt.models.register, op[1], self.factory) is None:
                self.new_top(op[1])
        else:
            _, i, content, poison = op
            args = {} if poison is None else {poison[0]: real(poison[1])}
            getattr(self, kind)(i, real(content), args)

    def new_top(self, behaviour: Any = "probe", label: Any = None) -> None:
        agent = call("spawn", self.rt.spawn, behaviour, label=label)
        if agent is not None:
            self.tops.append(agent)

    def spawn(self, i: int, content: Any, args: dict[str, Any]) -> None:
        self.new_top(**args)

    def followup(self, i: int, content: Any, args: dict[str, Any]) -> None:
        call("Agent.followup", self.top(i).followup, content, **args)

    def send(self, i: int, content: Any, args: dict[str, Any]) -> None:
        sid = self.away[i % len(self.away)] if self.away else self.top(i).session_id
        call("agents.send", self.rt.agents.send, sid, content, **args)

    def dispose(self, i: int, content: Any, args: dict[str, Any]) -> None:
        if len(self.tops) > 1:
            agent = self.tops.pop(i % len(self.tops))
            agent.dispose()
            self.away.append(agent.session_id)
            self.children = [(p, c) for p, c in self.children if p is not agent]

    def continuable(self, i: int, content: Any, args: dict[str, Any]) -> None:
        parent = self.top(i)
        fields = {"provider": "local", "label": "kid", "model": "probe", **args}
        spec = ContinuableStartSpec(parent=parent, prompt=content, **fields)
        handle = call("start_continuable", self.rt.subagents.start_continuable, spec)
        if handle is not None:
            self.children.append((parent, handle.child_id))
            self.known.add(handle.child_id)

    def child_followup(self, i: int, content: Any, args: dict[str, Any]) -> None:
        found = self.child(i)
        if found is not None:
            parent, cid = found
            by = str(parent.session_id) if args.pop("by_id", False) else parent
            call("subagents.followup", self.rt.subagents.followup, by, cid, content, **args)

    def report_from(self, i: int, content: Any, args: dict[str, Any]) -> None:
        found = self.child(i)
        agent = self.rt.agents.get(found[1]) if found is not None else self.top(i)
        call("report_from", self.rt.subagents.report_from, agent, content, **args)

    def start(self, i: int, content: Any, args: dict[str, Any]) -> None:
        provider = args.pop("provider", "local")
        request = SubagentStartRequest(
            parent=self.top(i),
            prompt=content,
            signal=AbortSignal.never(),
            **{"label": "one", "model": "probe", **args},
        )
        run = call("subagents.start", self.rt.subagents.start, provider, request)
        if run is not None:
            if type(run.id) is SessionId:
                self.known.add(run.id)
            call("run.result", run.result.get, 30)
            run.dispose(30)

    def interrupt(self, i: int, content: Any, args: dict[str, Any]) -> None:
        found = self.child(i)
        parent, target = found if found is not None else (self.top(i), self.top(i).session_id)
        target = args.get("target", target)
        if args.get("ancestor"):
            authority: Any = AncestorAuthority(parent)
        else:
            authority = UserAuthority(parent.session_id)
        call("interrupt", self.rt.subagents.interrupt, target, args.get("authority", authority))


class Clock:
    """A runtime's clock: the system's until armed, then ``values`` in turn."""

    def __init__(self, values: list[Any]) -> None:
        self.values = values
        self.armed = False
        self._next = 0
        self._lock = threading.Lock()

    def __call__(self) -> Any:
        if not self.armed:
            return dt.datetime.now(UTC)
        with self._lock:
            value = self.values[self._next % len(self.values)]
            self._next += 1
        if type(value) is str and value in (RAISE, NOW):
            if value == RAISE:
                raise RuntimeError(RAISE)
            return dt.datetime.now(UTC)
        return value


class Errors(logging.Handler):
    """ERROR records of the runtime during one example (a behaviour's own exception
    is logged at ERROR as its turn fails: that one is expected)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception as exc:  # a hostile value's str() raised: say so
            message = f"a log message could not be formatted: {type(exc).__name__}"
        if not (message.startswith("turn ") and " failed" in message):
            self.seen.append(message[:300])


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def location(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Any]:
    """A fresh store location per example: ``location()`` -> a path, a PostgreSQL url
    with a schema of its own, or a MemoryStore."""
    made: list[str] = []
    server = request.getfixturevalue("pg_server") if request.param == "postgres" else None

    def new() -> Any:
        n = len(made)
        if request.param == "memory":
            return MemoryStore()
        if server is None:
            made.append(str(tmp_path / f"s{n}.db"))
        else:
            sep = "&" if "?" in server else "?"
            made.append(f"{server}{sep}schema=t_{new_session_id()[:16]}_{n}")
        return made[-1]

    yield new
    if server is not None and made:
        import psycopg

        with psycopg.connect(server, autocommit=True) as conn:
            for url in made:
                conn.execute(f'DROP SCHEMA IF EXISTS "{url.rsplit("schema=", 1)[1]}" CASCADE')


def _logs(rt: Runtime, sids: set[SessionId]) -> dict[SessionId, list[bytes]]:
    """Each session's header and events, encoded: an event the store cannot hold
    fails here (the memory store, which encodes nothing, too)."""
    logs: dict[SessionId, list[bytes]] = {}
    for sid in sorted(sids):
        header = rt.sessions.header(sid)
        assert header is not None, f"session {sid} vanished"
        records = rt.sessions.read(sid)
        assert [r.seq for r in records] == list(range(len(records)))
        logs[sid] = [encode_header(header), *(encode_event(r.event) for r in records)]
    return logs


def _tree(store: Any, roots: list[SessionId]) -> set[SessionId]:
    found: set[SessionId] = set()
    todo = list(roots)
    while todo:
        sid = todo.pop()
        found.add(sid)
        todo.extend(h.id for h in store.list_headers(sid) if h.id not in found)
    return found


def _ends_plain(rt: Runtime, sid: SessionId) -> bool:
    events = [r.event for r in rt.sessions.read(sid)]
    asked = [i for i, e in enumerate(events) if isinstance(e, MessageEvent) and e.content == "p!"]
    ends = [e for e in events[asked[-1] :] if isinstance(e, TurnEnd)] if asked else []
    return bool(ends) and ends[0].stop_reason == "completed" and ends[0].output == "p!"


def check_example(backend: Backend, where: Any, plan: tuple[Any, ...]) -> None:
    pool, todo, durability, keep_warm, times = plan
    clock = None if times is None else Clock(times)
    errors = Errors()
    logger = logging.getLogger()  # the runtime's and pykka's (an actor that crashed)
    logger.addHandler(errors)
    Bomb.armed = True
    try:
        config = {"durability": durability, "keep_warm": keep_warm, "clock": clock}
        with Runtime(where, backend=backend, **config) as rt:
            world = World(rt, pool)
            if clock is not None:
                clock.armed = True
            for op in todo:
                world.run(op)
            assert rt.wait_idle(60), "the runtime did not settle"
            # Still persistable: every session takes a plain follow-up, which completes.
            for top in world.tops:
                assert not top.disposed, "a top-level agent was lost"
                top.followup("p!")
            for sid in world.away:
                rt.agents.send(sid, "p!")
            for parent, cid in world.children:
                rt.subagents.followup(parent, cid, "p!")
            assert rt.wait_idle(60), "the runtime did not settle"
            assert world.untyped == []
            roots = [a.session_id for a in world.tops] + world.away
            for sid in [*roots, *(cid for _, cid in world.children)]:
                assert _ends_plain(rt, sid), f"the plain follow-up of {sid} did not complete"
            # What the runtime shows as live, before anything more is flushed ...
            sids = {*roots, *world.known, *rt.sessions.live_ids()}
            live = _logs(rt, sids)
            rt.sessions.flush()
            store = rt.store
            assert store is not None
            found = _tree(store, roots)
            live.update(_logs(rt, found - sids))
            assert {h.id for h in store.list_headers(None)} == set(roots)
            if not store.durable:
                durable = {sid: [encode_event(r.event) for r in store.read(sid)] for sid in found}
        if isinstance(where, str):  # ... is what the store holds after the runtime closed
            reopened = open_store(where)
            assert reopened is not None
            try:
                assert _tree(reopened, roots) == set(live)
                for sid, encoded in live.items():
                    header = reopened.header(sid)
                    assert header is not None
                    stored = [encode_event(r.event) for r in reopened.read(sid)]
                    assert [encode_header(header), *stored] == encoded, f"session {sid}"
            finally:
                reopened.close()
        else:
            for sid, encoded in durable.items():
                assert encoded == live[sid][1:], f"session {sid}"
    finally:
        Bomb.armed = False
        logger.removeHandler(errors)
    assert errors.seen == []


@SETTINGS
@given(plan=plans)
def test_every_call_either_accepts_what_the_log_holds_or_raises_typed(
    backend: Backend, location: Any, plan: tuple[Any, ...]
) -> None:
    """Issue 19 point 1, R-ERR-1: see the module docstring."""
    check_example(backend, location(), plan)


# -- what the property found, each on its own ------------------------------------------


def _code(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(SubagentError) as info:
        fn(*args, **kwargs)
    return str(info.value.code)


def _runtime(backend: Backend, tmp_path: Any, store: str, **kwargs: Any) -> Runtime:
    where = MemoryStore() if store == "memory" else str(tmp_path / "r.db")
    return Runtime(where, backend=backend, **kwargs)


def _durable_is_live(rt: Runtime, *sids: SessionId) -> None:
    """After a flush, each session's store log encodes, and equals its live one."""
    live = {sid: [encode_event(r.event) for r in rt.sessions.read(sid)] for sid in sids}
    rt.sessions.flush()
    assert rt.store is not None
    for sid in sids:
        assert [encode_event(r.event) for r in rt.store.read(sid)] == live[sid]


STORES = pytest.mark.parametrize(
    ("store", "durability"),
    [("memory", "strict"), ("sqlite", "strict"), ("sqlite", "relaxed")],
)


@STORES
def test_content_nested_to_the_codecs_limit_is_refused_everywhere(
    backend: Backend, tmp_path: Any, store: str, durability: str
) -> None:
    """Issue 19 point 1: content 64 levels deep packs alone but not inside its event:
    every path refuses it (relaxed SQLite wrote it behind and lost the session; the
    memory store kept an event no store can hold); 63 levels are accepted."""
    deepest, too_deep = _nest(63, "list"), _nest(64, "list")
    with _runtime(backend, tmp_path, store, durability=durability, keep_warm=float("inf")) as rt:
        agent = rt.spawn("echo")
        child, _ = rt.subagents.start_continuable(
            ContinuableStartSpec(parent=agent, provider="local", prompt="hi", label="kid")
        )
        assert rt.wait_idle(10)
        kid = rt.agents.get(child)
        spec = ContinuableStartSpec(parent=agent, provider="local", prompt=too_deep, label="k2")
        request = SubagentStartRequest(parent=agent, prompt=too_deep, signal=AbortSignal.never())
        for refused in (
            lambda: agent.followup(too_deep),
            lambda: rt.agents.send(agent.session_id, too_deep),
            lambda: rt.subagents.followup(agent, child, too_deep),
            lambda: rt.subagents.followup(str(agent.session_id), child, too_deep),
            lambda: rt.subagents.report_from(kid, too_deep, delivery="waking"),
            lambda: rt.subagents.start_continuable(spec),
            lambda: rt.subagents.start("local", request),
        ):
            assert _code(refused) == "ENCODE_ERROR"
        agent.followup(deepest)
        rt.subagents.followup(agent, child, deepest)
        assert rt.wait_idle(10)
        assert [e.stop_reason for e in rt.sessions.turn_ends(agent.session_id)] == ["completed"]
        _durable_is_live(rt, agent.session_id, child)


@STORES
def test_a_turn_end_the_log_cannot_hold_fails_the_turn(
    backend: Backend, tmp_path: Any, store: str, durability: str
) -> None:
    """Issue 19 point 1: a turn's end is checked whole -- an output that packs alone
    but not in its ``turn/end`` (the frame's limit), output and structured output
    together past it, an exception's text of megabytes, with a lone surrogate, or
    whose ``str()`` raises -- and the turn fails with a reason the log holds; the
    session goes on."""
    near = "y" * 8388600  # two of them pack to 16 MiB less 5 bytes
    half = "h" * (5 * MIB)
    bomb = Bomb()
    turns: list[Any] = [
        lambda: [near, near],
        lambda: (_ for _ in ()).throw(RuntimeError("e" * (9 * MIB))),
        lambda: (_ for _ in ()).throw(RuntimeError("bad \ud800")),
        lambda: (_ for _ in ()).throw(RuntimeError(bomb)),
        lambda: "fine",
    ]
    steps = iter(turns)
    with _runtime(backend, tmp_path, store, durability=durability) as rt:
        rt.models.register("odd", lambda _o: lambda turn: next(steps)())
        rt.models.register("big", lambda _o: lambda turn: [half, half])
        agent = rt.spawn("odd")
        Bomb.armed = True
        try:
            for n in range(len(turns)):
                agent.followup(n)
                assert agent.wait_idle(30)
        finally:
            Bomb.armed = False
        ends = rt.sessions.turn_ends(agent.session_id)
        assert [e.stop_reason for e in ends] == ["failed"] * 4 + ["completed"]
        assert ends[0].error.startswith("output cannot be recorded: EncodeError")
        assert all(e.error.isascii() and len(e.error) <= MAX_ERROR_LEN for e in ends[:4])
        assert "\\ud800" in ends[2].error and "cannot be shown" in ends[3].error
        request = SubagentStartRequest(
            parent=agent, prompt="x", signal=AbortSignal.never(), model="big", output_schema={}
        )
        run = rt.subagents.start("local", request)
        result = run.result.get(30)
        run.dispose()
        assert result.stop_reason == "failed"  # output and structured: 20 MiB together
        _durable_is_live(rt, agent.session_id)


def test_a_cyclic_output_under_a_recursive_schema_fails_the_turn(backend: Backend) -> None:
    """Issue 19 point 1: validating an output jsonschema cannot walk (a cycle under a
    recursive schema) fails the turn, with the reason; it no longer escapes it."""
    # Earlier tests' garbage collected now, at a shallow stack: a finalizer a
    # collection runs at the recursion limit fails (a psycopg connection's
    # ctypes call raised RecursionError as an unraisable exception).
    gc.collect()
    with Runtime(MemoryStore(), backend=backend) as rt:
        rt.models.register("loop", lambda _o: lambda turn: _cycle())
        agent = rt.spawn("echo")
        request = SubagentStartRequest(
            parent=agent,
            prompt="x",
            signal=AbortSignal.never(),
            model="loop",
            output_schema=RECURSIVE,
        )
        run = rt.subagents.start("local", request)
        result = run.result.get(30)
        run.dispose()
        assert result.stop_reason == "failed"


def test_names_the_log_cannot_hold_and_objects_whose_repr_raises_are_refused_typed(
    backend: Backend,
) -> None:
    """Issue 19 point 1, R-ERR-1: a model name the log cannot hold is refused at its
    registration (it was refused only when spawned: the name is recorded); an
    object whose ``repr`` / ``==``
    raise, as an id, a name, a source kind or a delivery, is refused with a
    SubagentError, not its own exception."""
    with Runtime(MemoryStore(), backend=backend, keep_warm=float("inf")) as rt:
        factory = lambda _o: lambda turn: "x"  # noqa: E731
        assert _code(rt.models.register, "m\ud800", factory) == "INVALID_ARGUMENT"
        assert _code(rt.spawn, "m\ud800") == "INVALID_ARGUMENT"
        agent = rt.spawn("echo")
        child, _ = rt.subagents.start_continuable(
            ContinuableStartSpec(parent=agent, provider="local", prompt="hi", label="kid")
        )
        assert rt.wait_idle(10)
        Bomb.armed = True
        try:
            bomb = Bomb()
            assert _code(agent.followup, "x", message_id=bomb) == "INVALID_ARGUMENT"
            assert _code(rt.spawn, "echo", label=bomb) == "INVALID_ARGUMENT"
            assert _code(agent.followup, "x", source=MessageSource(kind=bomb)) == "ENCODE_ERROR"
            kid = rt.agents.get(child)
            assert _code(rt.subagents.report_from, kid, "r", delivery=bomb) == "INVALID_ARGUMENT"
            authority = UserAuthority(agent.session_id)
            assert _code(rt.subagents.interrupt, bomb, authority) == "INVALID_ARGUMENT"
        finally:
            Bomb.armed = False


class _Boom(dt.tzinfo):
    def utcoffset(self, _: Any) -> dt.timedelta:
        raise RuntimeError("no offset")


@pytest.mark.parametrize(
    "when",
    [
        dt.datetime(1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=5))),  # UTC: year 0
        dt.datetime(9999, 12, 31, 23, tzinfo=dt.timezone(-dt.timedelta(hours=5))),
        dt.datetime(2020, 1, 1),
        dt.datetime(2020, 1, 1, tzinfo=_Boom()),
    ],
    ids=["before-year-1", "after-9999", "naive", "offset-raises"],
)
def test_a_datetime_the_log_cannot_read_back_is_refused(backend: Backend, when: Any) -> None:
    """Issue 19 point 1: the codec packed an aware datetime whose UTC time a datetime
    cannot hold (read back: CORRUPT_RECORD) and let a ``tzinfo``'s own exception out;
    packing now refuses both, alone, in a list or as a map key, and so does
    acceptance."""
    keyed = [] if isinstance(when.tzinfo, _Boom) else [{when: 1}]  # hashing asks the offset
    for value in (when, [when], {"k": when}, *keyed):
        with pytest.raises(SubagentError) as info:
            packb(value)
        assert info.value.code == "ENCODE_ERROR"
    assert not storable_datetime(when)
    with Runtime(MemoryStore(), backend=backend) as rt:
        agent = rt.spawn("echo")
        assert _code(agent.followup, [when]) == "ENCODE_ERROR"


def test_a_quiet_report_is_refused_when_it_could_not_wait_in_a_checkpoint(
    backend: Backend, tmp_path: Any
) -> None:
    """Issue 19 point 1: a quiet report waits for the parent's next turn in the
    parent's checkpoint, three levels deep: content 62 deep is refused there (packing
    that checkpoint raised in the settling child's ``on_stop`` -- its release never
    finished); a waking report of it is accepted. A checkpoint that cannot be packed
    anyway is logged and skipped: it never breaks a release."""
    with Runtime(str(tmp_path / "q.db"), backend=backend, keep_warm=float("inf")) as rt:
        agent = rt.spawn("echo")
        child, _ = rt.subagents.start_continuable(
            ContinuableStartSpec(parent=agent, provider="local", prompt="hi", label="kid")
        )
        assert rt.wait_idle(10)
        kid = rt.agents.get(child)
        deep = _nest(62, "list")
        assert _code(rt.subagents.report_from, kid, deep) == "ENCODE_ERROR"
        rt.subagents.report_from(kid, _nest(61, "list"))
        rt.subagents.report_from(kid, deep, delivery="waking")
        assert rt.wait_idle(10)
        rt.sessions.checkpoint(kid.session, {"context": [[_nest(64, "list")]]})  # no raise
        _durable_is_live(rt, agent.session_id, child)


@pytest.mark.parametrize(
    "odd", [dt.datetime(2020, 1, 1), "now", None, RAISE], ids=["naive", "str", "none", "raises"]
)
def test_a_clock_the_log_cannot_hold(
    backend: Backend, tmp_path: Any, odd: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 19 point 1: the runtime's clock is checked per call as the log checks a
    time. A creation it would stamp is refused, INVALID_ARGUMENT, nothing created; a
    turn's times fall back to the system's (said once) and the session goes on --
    before, the memory store kept events no store can hold, and a SQLite session's
    writes failed."""
    clock = Clock([odd])
    with Runtime(str(tmp_path / "c.db"), backend=backend, clock=clock) as rt:
        agent = rt.spawn("echo")
        clock.armed = True
        assert _code(rt.spawn, "echo") == "INVALID_ARGUMENT"
        spec = ContinuableStartSpec(parent=agent, provider="local", prompt="p", label="kid")
        assert _code(rt.subagents.start_continuable, spec) == "INVALID_ARGUMENT"
        agent.followup("one")
        agent.followup("two")
        assert agent.wait_idle(10) and not agent.disposed
        assert [e.stop_reason for e in rt.sessions.turn_ends(agent.session_id)] == [
            "completed",
            "completed",
        ]
        assert [h.id for h in rt.sessions.roots()] == [agent.session_id]
        _durable_is_live(rt, agent.session_id)
    assert sum("stands in" in r.getMessage() for r in caplog.records) == 1
