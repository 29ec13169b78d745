"""Helpers of the continuable-children suite: a scripted tree model, a counting store.

The ``cmd`` model (:class:`Script`) runs the commands carried in a turn's message
content, so a test builds a whole continuable tree from one follow-up and forces
every interleaving with named :class:`~subagents.actors.testing.Gate`\\ s. Content
that is not a command list is echoed. Commands (all msgpack-able):

``["start", label, prompt, opts]``   start a continuable child (model ``cmd``
                                     unless ``opts`` names one); its id lands in
                                     ``script.ids[label]``
``["try_start", label, prompt]``     the same, noting ``("start-refused", me, code)``
``["block", gate]``                  wait at the gate, honouring the turn's signal;
                                     notes ``("cancelled", me)`` when cancelled
``["block_slow", gate, hold]``       like ``block``, but once cancelled note it and
                                     then wait at ``hold`` *ignoring* the signal
                                     (a slow descendant), noting ``("slow-done", me)``
``["block_try", gate, label]``       like ``block``, but once cancelled ``try_start``
                                     a child labelled ``label``
``["hold", gate]``                   wait at the gate ignoring the signal
``["report", delivery, content]``    report to the direct parent
``["followup", label, content]``     follow up a child started earlier
``["note", value]``                  note ``("note", me, value)``

Every turn is recorded in ``script.turns`` and every disposal of a ``cmd`` agent is
noted ``("disposed", label)``, from the agent's own dispose listener.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from subagents.actors import (
    Agent,
    ContinuableHandle,
    ContinuableStartSpec,
    Runtime,
    SubagentEvent,
)
from subagents.actors.testing import Gate, LifecycleProbe
from subagents.protocol import (
    ErrorCode,
    Event,
    MessageEvent,
    MessageId,
    ReportEvent,
    SessionId,
    SubagentError,
    TurnEnd,
    TurnStart,
)
from subagents.store import LogRecord, MemoryStore

__all__ = ["CountingStore", "Kit", "Notes", "Script", "TurnRecord", "left_full"]


# -- a store that counts what it reads ----------------------------------------------


class CountingStore(MemoryStore):
    """A :class:`MemoryStore` that counts the rows ``read`` returns.

    ``before_append``/``before_create`` (``fn(session_id, events)``) run before
    each write, in the session writer: a test blocks or fails writes with them.
    Its writes go through the write-behind writer (``inline_writes = False``),
    like a real persistence store's, so a blocked write never blocks the agent.
    """

    inline_writes = False

    def __init__(self) -> None:
        super().__init__()
        self._count_lock = threading.Lock()
        self.rows_read = 0
        self.reads: list[tuple[SessionId, int, int]] = []
        self.checkpoint_reads = 0
        self.before_append: Callable[[SessionId, Sequence[Event]], None] | None = None
        self.before_create: Callable[[Any, Sequence[Event]], None] | None = None

    def reset_counts(self) -> None:
        with self._count_lock:
            self.rows_read = 0
            self.reads = []
            self.checkpoint_reads = 0

    def read(self, session_id: SessionId | str, from_seq: int = 0) -> list[LogRecord]:
        rows = super().read(session_id, from_seq)
        with self._count_lock:
            self.rows_read += len(rows)
            self.reads.append((SessionId(session_id), from_seq, len(rows)))
        return rows

    def get_checkpoint(self, session_id: SessionId | str) -> tuple[int, bytes] | None:
        with self._count_lock:
            self.checkpoint_reads += 1
        return super().get_checkpoint(session_id)

    def append(self, session_id: SessionId | str, events: Sequence[Event], **kw: Any) -> list[int]:
        hook = self.before_append
        if hook is not None:
            hook(SessionId(session_id), events)
        return super().append(session_id, events, **kw)

    def create_session(self, header: Any, events: Sequence[Event] = (), **kw: Any) -> int:
        hook = self.before_create
        if hook is not None:
            hook(header, events)
        return super().create_session(header, events, **kw)


# -- notes: an ordered, waitable record of what happened -------------------------------


class Notes:
    """A thread-safe ordered list of tuples with ``wait_for(predicate)``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[tuple[Any, ...]] = []
        self._probes: list[Callable[[], None]] = []

    def add(self, *item: Any) -> None:
        with self._lock:
            self._items.append(item)
            probes = list(self._probes)
        for wake in probes:
            wake()

    def items(self) -> list[tuple[Any, ...]]:
        with self._lock:
            return list(self._items)

    def index(self, *item: Any) -> int:
        return self.items().index(item)

    def wait_for(
        self, predicate: Callable[[list[tuple[Any, ...]]], bool], timeout: float = 10.0
    ) -> bool:
        """Block (cooperatively on gevent) until ``predicate(items)`` holds."""
        from subagents.actors import AbortController

        deadline = time.monotonic() + timeout
        while True:
            controller = AbortController()

            def wake(c: AbortController = controller) -> None:
                c.abort("note")

            with self._lock:
                if predicate(list(self._items)):
                    return True
                self._probes.append(wake)
            try:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return predicate(self.items())
                controller.signal.wait(remaining)
            finally:
                with self._lock:
                    self._probes.remove(wake)

    def has(self, *item: Any, timeout: float = 10.0) -> bool:
        return self.wait_for(lambda items: item in items, timeout)


# -- the scripted model --------------------------------------------------------------


@dataclass(frozen=True)
class TurnRecord:
    label: str | None
    session_id: SessionId
    agent: Agent
    index: int
    content: Any
    kind: str
    context: tuple[Any, ...]
    persona: str | None
    tools: tuple[str, ...]
    outcome: str = "?"


class Script:
    """The ``cmd`` model: runs the commands in each turn's content (see module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._gates: dict[str, Gate] = {}
        self.ids: dict[str, SessionId] = {}
        self.turns: list[TurnRecord] = []
        self.notes = Notes()
        self.created: list[Any] = []  # options of every behaviour built
        self.on_create: Callable[[Any], None] | None = None
        self.on_turn: Callable[[Any], None] | None = None

    def gate(self, name: str) -> Gate:
        with self._lock:
            gate = self._gates.get(name)
            if gate is None:
                gate = self._gates[name] = Gate(name)
            return gate

    def release_all(self) -> None:
        with self._lock:
            gates = list(self._gates.values())
        for gate in gates:
            gate.release()

    def factory(self, options: Any) -> Any:
        with self._lock:
            self.created.append(options)
        hook = self.on_create
        if hook is not None:
            hook(options)
        return _Behaviour(self)

    def turns_of(self, label: str) -> list[TurnRecord]:
        with self._lock:
            return [t for t in self.turns if t.label == label]


class _Behaviour:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.watched: Agent | None = None

    def on_turn(self, turn: Any) -> Any:
        script = self.script
        agent = turn.agent
        me = agent.label
        if self.watched is not agent:
            self.watched = agent
            agent.add_dispose_listener(lambda a: script.notes.add("disposed", a.label))
        record = TurnRecord(
            label=me,
            session_id=agent.session_id,
            agent=agent,
            index=turn.index,
            content=turn.content,
            kind=turn.messages[-1].kind,
            context=tuple(m.content for m in turn.context),
            persona=turn.persona,
            tools=turn.tools,
        )
        with script._lock:
            script.turns.append(record)
        script.notes.add("turn", me, turn.content)
        hook = script.on_turn
        if hook is not None:
            hook(turn)
        content = turn.content
        if not _is_script(content):
            return content
        output: Any = None
        for command in content:
            output = self._run(turn, me, command)
        return output if output is not None else "ok"

    def _run(self, turn: Any, me: str | None, command: Sequence[Any]) -> Any:
        script = self.script
        op, *args = command
        if op == "start":
            label, prompt, *rest = args
            opts = dict(rest[0]) if rest else {}
            opts.setdefault("model", "cmd")
            provider = opts.pop("provider", "local")
            handle = turn.subagents.start_continuable(provider, prompt, label=label, **opts)
            with script._lock:
                script.ids[label] = handle.child_id
            script.notes.add("started", me, label)
            return None
        if op == "try_start":
            label, prompt = args
            try:
                handle = turn.subagents.start_continuable("local", prompt, label=label, model="cmd")
            except SubagentError as exc:
                script.notes.add("start-refused", me, exc.code)
            else:
                with script._lock:
                    script.ids[label] = handle.child_id
                script.notes.add("started", me, label)
            return None
        if op in ("block", "block_slow", "block_try"):
            gate = script.gate(args[0])
            try:
                gate.pass_through(turn.signal)
            except SubagentError as exc:
                if exc.code != ErrorCode.CANCELLED:
                    raise
                script.notes.add("cancelled", me)
                if op == "block_slow":
                    script.gate(args[1]).pass_through(None)
                    script.notes.add("slow-done", me)
                if op == "block_try":
                    self._run(turn, me, ["try_start", args[1], "hi"])
                raise
            return None
        if op == "hold":
            script.gate(args[0]).pass_through(None)
            script.notes.add("held", me, args[0])
            return None
        if op == "report":
            delivery, content = args
            try:
                mid = turn.subagents.report(content, delivery=delivery)
            except SubagentError as exc:
                script.notes.add("report-refused", me, exc.code)
                return None
            script.notes.add("reported", me, mid)
            return None
        if op == "followup":
            label, content = args
            turn.subagents.followup(script.ids[label], content)
            return None
        if op == "note":
            script.notes.add("note", me, args[0])
            return None
        raise AssertionError(f"unknown command {command!r}")


def _is_script(content: Any) -> bool:
    return (
        isinstance(content, (list, tuple))
        and len(content) > 0
        and all(isinstance(c, (list, tuple)) and c and isinstance(c[0], str) for c in content)
    )


# -- the kit -------------------------------------------------------------------------


class Kit:
    """A runtime with the ``cmd`` model, a lifecycle probe and log helpers."""

    def __init__(self, rt: Runtime) -> None:
        self.rt = rt
        self.script = Script()
        rt.models.register("cmd", self.script.factory)
        self.probe = LifecycleProbe(rt)
        # Starts and ends per child, indexed once for every wait (see _epoch_counts_of).
        self._epoch_counts: dict[str, list[int]] = {}
        self._indexed = 0

    def close(self) -> None:
        self.script.release_all()
        self.probe.close()

    @property
    def store(self) -> CountingStore:
        """The runtime's counting store (only under ``rt_mem``)."""
        store = self.rt.store
        assert isinstance(store, CountingStore), "this test needs the counting store"
        return store

    # -- building ---------------------------------------------------------------------

    @property
    def ids(self) -> dict[str, SessionId]:
        return self.script.ids

    def gate(self, name: str) -> Gate:
        return self.script.gate(name)

    def root(self, label: str = "root") -> Agent:
        return self.rt.spawn("cmd", label=label)

    def start(
        self, parent: Agent, prompt: Any = "hello", label: str = "kid", **fields: Any
    ) -> ContinuableHandle:
        fields.setdefault("model", "cmd")
        fields.setdefault("provider", "local")
        handle = self.rt.subagents.start_continuable(
            ContinuableStartSpec(parent=parent, prompt=prompt, label=label, **fields)
        )
        self.script.ids[label] = handle.child_id
        return handle

    def sid(self, label_or_id: str) -> SessionId:
        """The session id of a label (waiting for its start to be noted) or an id."""
        if label_or_id not in self.script.ids:
            try:
                return SessionId(label_or_id)
            except SubagentError:
                pass
            started = self.script.notes.wait_for(
                lambda items: any(n[0] == "started" and n[2] == label_or_id for n in items)
            )
            assert started, f"no child labelled {label_or_id!r} was started"
        return self.script.ids[label_or_id]

    def agent(self, label_or_id: str) -> Agent | None:
        return self.rt.agents.get(self.sid(label_or_id))

    def live(self, label_or_id: str) -> Agent:
        """The live agent of a label or id (asserted to exist)."""
        agent = self.agent(label_or_id)
        assert agent is not None, f"{label_or_id} is not live"
        return agent

    def act(self, label_or_id: str) -> Any:
        return self.rt.continuation.activation(self.sid(label_or_id))

    # -- lifecycle events ---------------------------------------------------------------

    def events_of(self, cid: str, kind: str | None = None) -> list[SubagentEvent]:
        sid = str(self.sid(cid))
        return [
            e for e in self.probe.events if e.child_id == sid and (kind is None or e.type == kind)
        ]

    def epochs(self, cid: str) -> int:
        return len(self.events_of(cid, "subagent/start"))

    def wait_settled(self, cid: str, epochs: int | None = None, timeout: float = 10.0) -> None:
        """Wait until every epoch of ``cid`` emitted ``subagent/end`` (and ``epochs`` began)."""
        sid = str(self.sid(cid))

        def settled(evs: list[SubagentEvent]) -> bool:
            starts, ends = self._epoch_counts_of(evs, sid)
            # A follow-up that raced settlement can reopen the child: its start is
            # announced only after the previous end left the dispatcher, so "starts ==
            # ends" alone can hold for an instant between two epochs.  The activation
            # index is dropped before an epoch's end is announced, so the final end
            # makes both hold.
            return (
                starts == ends
                and (epochs is None or starts == epochs)
                and self.rt.continuation.activation(sid) is None
            )

        # An epoch can open, run and leave the index before the dispatcher has
        # delivered its ``subagent/start``: the counts then still read "settled"
        # from the epoch before. Once the dispatcher has handled everything posted
        # so far, a start it had queued is counted and the wait goes on.
        while True:
            assert self.probe.wait_for(settled, timeout), (
                f"{cid} did not settle: {self.probe.events}"
            )
            self.barrier()
            if self.probe.wait_for(settled, 0):
                break
        assert self.rt.continuation.activation(sid) is None

    def _epoch_counts_of(self, evs: list[SubagentEvent], sid: str) -> tuple[int, int]:
        """``sid``'s starts and ends among ``evs`` (the probe's events; called under
        its lock, so one caller at a time). Indexed incrementally for every child at
        once (the list only grows): the stress tests wait on a thousand children in
        turn, whose events number in the tens of thousands."""
        counts = self._epoch_counts
        for e in evs[self._indexed :]:
            kind = 0 if e.type == "subagent/start" else 1 if e.type == "subagent/end" else -1
            if kind >= 0:
                pair = counts.get(e.child_id)
                if pair is None:
                    pair = counts[e.child_id] = [0, 0]
                pair[kind] += 1
        self._indexed = len(evs)
        pair = counts.get(sid, [0, 0])
        return pair[0], pair[1]

    def barrier(self) -> None:
        """Wait until the registry, supervisor and dispatcher handled what was sent so far."""
        self.barrier_without_dispatcher()
        self.rt.continuation._dispatcher.ask(lambda: None)

    def barrier_without_dispatcher(self) -> None:
        """Wait until the registry and supervisor actors handled what was sent so far."""
        cont = self.rt.continuation
        for _ in range(2):  # a notice handled by one may post one to the other
            cont._registry.ask(lambda: None)
            cont._supervisor.ask(lambda: None)

    # -- logs -------------------------------------------------------------------------

    def log(self, cid: str) -> list[Event]:
        sid = self.sid(cid)
        self.rt.sessions.flush()
        return [r.event for r in self.rt.sessions.read(sid)]

    def started_ids(self, cid: str) -> list[MessageId]:
        """Every message id claimed by a ``turn/start`` of ``cid``, in log order."""
        return [m for e in self.log(cid) if isinstance(e, TurnStart) for m in e.message_ids]

    def contents(self, cid: str) -> list[Any]:
        return [e.content for e in self.log(cid) if isinstance(e, MessageEvent)]

    def reports(self, cid: str) -> list[ReportEvent]:
        return [e for e in self.log(cid) if isinstance(e, ReportEvent)]

    def ends(self, cid: str) -> list[TurnEnd]:
        return [e for e in self.log(cid) if isinstance(e, TurnEnd)]

    def persisted(self, cid: str) -> bool:
        store = self.rt.store
        assert store is not None
        self.rt.sessions.flush()
        return store.header(self.sid(cid)) is not None


def spawn(rt: Runtime, fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn`` in a backend task; ``.result(timeout)`` returns or re-raises."""
    return _Task(rt, fn, args)


class _Task:
    def __init__(self, rt: Runtime, fn: Callable[..., Any], args: Iterable[Any]) -> None:
        self.box: dict[str, Any] = {}
        args = tuple(args)

        def target() -> None:
            try:
                self.box["value"] = fn(*args)
            except BaseException as exc:
                self.box["error"] = exc

        self.handle = rt.backend.spawn(target, name=f"test-{getattr(fn, '__name__', 'fn')}")

    def join(self, timeout: float | None = 10.0) -> bool:
        return self.handle.join(timeout)

    def done(self) -> bool:
        return not self.handle.is_alive()

    def result(self, timeout: float = 10.0) -> Any:
        assert self.handle.join(timeout), "task did not finish"
        if "error" in self.box:
            raise self.box["error"]
        return self.box.get("value")

    def error(self, timeout: float = 10.0) -> BaseException | None:
        assert self.handle.join(timeout), "task did not finish"
        return self.box.get("error")


def left_full(db: str, backend: Any) -> tuple[SessionId, SessionId, Callable[[Any], Any]]:
    """A strict runtime on ``db`` closes with a child bounded at two messages holding
    its cut prompt (``"block"``) and a follow-up (``"a"``) in its durable inbox (2 of
    2). Returns the parent's id, the child's, and the ``worker`` behaviour the next
    runtime registers as ``"worker"``: from then on it runs every message, and
    answers ``"did <content>"``."""
    released = [False]

    def worker(turn: Any) -> Any:
        if turn.content == "block" and not released[0]:
            turn.signal.wait(30)  # cut by the close
        return f"did {turn.content}"

    with Runtime(db, backend=backend) as rt:
        rt.models.register("worker", lambda _o: worker)
        parent = rt.spawn("worker", label="p")
        spec = ContinuableStartSpec(
            parent=parent, provider="local", prompt="block", label="c", model="worker", max_inbox=2
        )
        cid, _ = rt.subagents.start_continuable(spec)
        rt.subagents.followup(parent, cid, "a")  # 2 of 2
    released[0] = True
    return parent.session_id, cid, worker
