"""The threading runtime's deque inbox: no lost wake-up, per-producer FIFO, and the
pykka actor contract (stop, ActorDeadError, teardown of queued asks) unchanged.

R-FUP-2 (each follow-up becomes exactly one FIFO turn) rests on the mailbox: these
are its race tests. They are about the threading runtime only.
"""

from __future__ import annotations

import threading
from typing import Any

import pykka
import pytest
from subagents.actors._kernel._threadinbox import ThreadActor, _ThreadInbox


class Collector(ThreadActor):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def on_receive(self, message: Any) -> Any:
        if message == "get":
            return list(self.seen)
        self.seen.append(message)
        return None


def _racing_round(producers: int = 4, per: int = 300) -> None:
    inbox = _ThreadInbox()
    got: list[tuple[int, int]] = []

    def consume() -> None:
        for _ in range(producers * per):
            got.append(inbox.get())  # type: ignore[arg-type]

    consumer = threading.Thread(target=consume)
    consumer.start()
    start = threading.Barrier(producers)

    def produce(p: int) -> None:
        start.wait()
        for i in range(per):
            inbox.put((p, i))  # type: ignore[arg-type]

    threads = [threading.Thread(target=produce, args=(p,)) for p in range(producers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    consumer.join(10)
    assert not consumer.is_alive(), "a wake-up was lost"
    assert sorted(got) == [(p, i) for p in range(producers) for i in range(per)]
    for p in range(producers):
        assert [i for q, i in got if q == p] == list(range(per))
    assert inbox.empty() and inbox.qsize() == 0


def test_producers_racing_a_parking_consumer_lose_nothing() -> None:
    """Many producers against a consumer that keeps parking (it empties the deque
    after almost every message): every message arrives, each producer's in order.
    Repeated, because a lost wake-up shows (as a consumer that never finishes) only
    when a put lands between the consumer's empty check and its parking."""
    for _ in range(30):
        _racing_round()


def _window_round() -> None:
    inbox = _ThreadInbox()
    parked = threading.Event()
    real_wake = inbox._wake

    class Spy:
        def acquire(self) -> bool:
            parked.set()  # sleeping is published; the put may now race us
            return bool(real_wake.acquire())

        def release(self) -> None:
            real_wake.release()

    inbox._wake = Spy()  # type: ignore[assignment]
    box: list[Any] = []
    consumer = threading.Thread(target=lambda: box.append(inbox.get()))
    consumer.start()
    assert parked.wait(10)
    inbox.put("late")  # type: ignore[arg-type]
    consumer.join(10)
    assert box == ["late"]


def test_a_put_between_check_and_park_wakes_the_consumer() -> None:
    """Force the window: the consumer has published ``_sleeping`` and released the
    guard, the put happens before (or just after) it acquires ``_wake``; it must
    not park forever."""
    for _ in range(50):
        _window_round()


def test_actor_contract_is_pykka_s() -> None:
    """Tells are processed in order, asks answered; after stop, tell raises
    ActorDeadError; asks queued behind a stop fail with ActorDeadError."""
    ref = Collector.start()
    for i in range(1000):
        ref.tell(i)
    assert ref.ask("get") == list(range(1000))
    ref.stop()
    with pytest.raises(pykka.ActorDeadError):
        ref.tell(1)

    gate = threading.Event()

    class Slow(ThreadActor):
        def on_receive(self, message: Any) -> Any:
            gate.wait(10)
            return message

    slow = Slow.start()
    first = slow.ask("first", block=False)
    slow.tell(pykka.messages._ActorStop())
    behind = slow.ask("behind", block=False)
    gate.set()
    assert first.get(timeout=10) == "first"
    with pytest.raises(pykka.ActorDeadError):
        behind.get(timeout=10)
    assert slow.actor_stopped.wait(10)


def test_a_foreign_thread_wakes_a_parked_actor() -> None:
    """The actor parks on an empty inbox; a tell from another thread wakes it."""
    ref = Collector.start()
    assert ref.ask("get") == []  # the actor has drained and parks again
    t = threading.Thread(target=lambda: ref.tell("from afar"))
    t.start()
    t.join()
    assert ref.ask("get") == ["from afar"]
    ref.stop()
