"""Baselines: the raw paths every benchmark ratio is read against, measured in-run.

Not a group module (no ``_bench`` suffix): ``actors_bench`` and ``scale_bench``
both import these.
"""

from __future__ import annotations

import collections
import datetime
import os
import queue
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import pykka
from subagents.actors import GeventActor

from bench._harness import Row, best_of_each


def actor_base(backend: str) -> type[pykka.Actor]:
    return pykka.ThreadingActor if backend == "threading" else GeventActor


def raw_tell(backend: str, n: int) -> float:
    class Counter(actor_base(backend)):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.n = 0

        def on_receive(self, message: Any) -> Any:
            if message == "get":
                return self.n
            self.n += 1
            return None

    ref = Counter.start()
    start = time.perf_counter()
    for i in range(n):
        ref.tell(i)
    assert ref.ask("get") == n
    elapsed = time.perf_counter() - start
    ref.stop()
    return n / elapsed


def turn_floor(backend: str, n: int) -> float:
    """Turns/s of the least any runtime must do per follow-up -> turn, on a raw actor.

    The producer mints a message id and ``tell``s; the actor records the turn as
    the seed requires -- ``turn/start`` (with a timestamp), the message and
    ``turn/end`` (another timestamp) -- built with the event types' own
    constructors and appended to a list. No authority check, no inbox accounting,
    no idle signalling, no store: a floor, not a competitor. When it sits below a
    ratio target against raw ``tell``, that target is out of reach for any design
    that records turns as typed events in this process.
    """
    from subagents.protocol import (
        MessageEvent,
        MessageSource,
        TurnEnd,
        TurnStart,
        new_message_id,
        new_session_id,
    )

    now, utc = datetime.datetime.now, datetime.UTC
    source = MessageSource(kind="parent", session_id=new_session_id())

    class Turns(actor_base(backend)):  # type: ignore[misc,valid-type]
        def __init__(self) -> None:
            super().__init__()
            self.log: list[Any] = []
            self.turn = 0

        def on_receive(self, message: Any) -> Any:
            if message == "get":
                return self.turn
            mid, content = message
            index = self.turn
            self.turn = index + 1
            log = self.log
            log.append(TurnStart(turn=index, at=now(utc), message_ids=(mid,)))
            log.append(MessageEvent(message_id=mid, content=content, source=source))
            log.append(TurnEnd(turn=index, at=now(utc), stop_reason="completed", output=None))
            return None

    ref = Turns.start()
    start = time.perf_counter()
    for i in range(n):
        ref.tell((new_message_id(), i))
    assert ref.ask("get") == n
    elapsed = time.perf_counter() - start
    ref.stop()
    return n / elapsed


class RawAsk:
    """A raw pykka actor of ``backend`` that answers asks; :meth:`sample` times
    round trips, so a caller can take them in turn with its own."""

    def __init__(self, backend: str) -> None:
        class Echo(actor_base(backend)):  # type: ignore[misc,valid-type]
            def on_receive(self, message: Any) -> Any:
                return message

        self._ref = Echo.start()

    def sample(self, n: int) -> list[float]:
        """Seconds of each of ``n`` asks."""
        ref = self._ref
        out = []
        for i in range(n):
            t = time.perf_counter()
            ref.ask(i)
            out.append(time.perf_counter() - t)
        return out

    def stop(self) -> None:
        self._ref.stop()


def raw_cycle(backend: str, n: int) -> float:
    class Echo(actor_base(backend)):  # type: ignore[misc,valid-type]
        def on_receive(self, message: Any) -> Any:
            return message

    start = time.perf_counter()
    for i in range(n):
        ref = Echo.start()
        ref.ask(i)
        ref.stop()
    return n / (time.perf_counter() - start)


def deque_rate(n: int) -> float:
    d: collections.deque[int] = collections.deque()
    start = time.perf_counter()
    for i in range(n):
        d.append(i)
        d.popleft()
    return n / (time.perf_counter() - start)


def queue_rate(n: int) -> float:
    q: queue.Queue[int] = queue.Queue()

    def consume() -> None:
        for _ in range(n):
            q.get()

    t = threading.Thread(target=consume)
    start = time.perf_counter()
    t.start()
    for i in range(n):
        q.put(i)
    t.join()
    return n / (time.perf_counter() - start)


def gevent_queue_rate(n: int) -> float:
    import gevent
    import gevent.queue

    q: gevent.queue.Queue[int] = gevent.queue.Queue()

    def consume() -> None:
        for _ in range(n):
            q.get()

    g = gevent.spawn(consume)
    start = time.perf_counter()
    for i in range(n):
        q.put(i)
    g.join()
    return n / (time.perf_counter() - start)


def thespian_rate(n: int) -> float | None:
    try:
        from thespian.actors import Actor, ActorSystem
    except ImportError:
        return None

    class Counter(Actor):  # type: ignore[misc]
        count = 0

        def receiveMessage(self, message: Any, sender: Any) -> None:
            if message == "get":
                self.send(sender, self.count)
            elif isinstance(message, int):
                self.count += 1

    system = ActorSystem("simpleSystemBase")
    try:
        actor = system.createActor(Counter)
        start = time.perf_counter()
        for i in range(n):
            system.tell(actor, i)
        assert system.ask(actor, "get", 60) == n
        return n / (time.perf_counter() - start)
    finally:
        system.shutdown()


def autogen_rate(n: int, repeat: int = 1) -> float | None:
    """autogen-core's sequential send rate, best of ``repeat`` runs of ``n`` (None
    when the optional ``bench`` extra is not installed).

    Measured in a fresh interpreter of its own, as every group is: autogen-core
    imports pydantic and protobuf, and a heap that size in our process would make
    each of our full garbage collections walk it (and ours would slow autogen's).
    The child times only its sends, not its start-up.
    """
    if not _has_autogen():
        return None
    done = subprocess.run(
        [sys.executable, "-m", "bench._autogen_baseline", str(n), str(repeat)],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parent.parent,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the autogen-core baseline failed:\n{done.stderr}")
    return float(done.stdout.strip().splitlines()[-1])


def autogen_in_turn(
    n: int, ours: Callable[[], float], *, with_: str, repeat: int = 3
) -> tuple[Row | None, float]:
    """autogen-core's rate and ``ours`` (a rate), each the best of ``repeat`` rounds
    taken in turn (``best_of_each``), so a slow spell of the machine lands on both.

    Returns the baseline row (named after ``with_``; None without autogen-core,
    and then ``ours`` is still measured) and our best rate.
    """
    if not _has_autogen():
        return None, best_of_each(repeat, ours)[0]
    best_autogen, best_ours = best_of_each(repeat, lambda: autogen_rate(n) or 0.0, ours)
    row = Row(
        workload=f"autogen-core send_message, in turn ({with_})",
        backend="asyncio",
        store="-",
        value=best_autogen,
        unit="msg/s",
    )
    return row, best_ours


def _has_autogen() -> bool:
    try:
        import autogen_core  # noqa: F401
    except ImportError:
        return False
    return True


def raw_sqlite_group(tmp: str, n: int) -> float:
    path = os.path.join(tmp, f"raw-{n}.db")
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("pragma journal_mode=wal")
    con.execute("pragma synchronous=FULL")
    con.execute("create table ev(session text, seq integer, body blob, primary key(session, seq))")
    body = msgpack.packb(
        {"type": "message", "content": "x" * 200, "source": {"kind": "parent", "id": "abc"}}
    )
    start = time.perf_counter()
    for j in range(0, n, 1000):
        con.execute("begin")
        con.executemany(
            "insert into ev values(?,?,?)", (("s", i, body) for i in range(j, min(n, j + 1000)))
        )
        con.execute("commit")
    elapsed = time.perf_counter() - start
    con.close()
    return n / elapsed
