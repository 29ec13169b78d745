"""The group committer's leader gathers a batch: R-S7 (accepted means committed, one
commit shared by concurrent callers), issue 13 point 1.

The committer is driven directly with an executor that records its batches; the
leader's pause is injected, so what a pause lets happen (callers queueing) is
done by the test inside the pause, never by timing.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from subagents.protocol import ErrorCode, SubagentError
from subagents.store import defer_interrupt
from subagents.store._group import GATHER_PAUSE, GroupCommitter, WriteRequest

pytestmark = pytest.mark.timeout(60)


class Recorder:
    """An executor that finishes every request with its op's result and keeps the
    size of each batch; ``hold`` (when set) blocks the first batch until released."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.hold = False

    def __call__(self, batch: list[WriteRequest]) -> None:
        self.batches.append(len(batch))
        if self.hold:
            self.hold = False
            self.entered.set()
            assert self.release.wait(30)
        for request in batch:
            request.finish(request.op(None))


def _closed() -> SubagentError:
    return SubagentError("closed", code=ErrorCode.INTERNAL)


def _queue(committer: GroupCommitter, count: int) -> list[threading.Thread]:
    """Start ``count`` callers and return once every one of them is queued."""
    before = committer.pending
    threads = [
        threading.Thread(target=committer.submit, args=(lambda _t: None,)) for _ in range(count)
    ]
    for t in threads:
        t.start()
    done = threading.Event()
    while committer.pending < before + count:
        done.wait(0.001)  # a deadline poll for other threads' progress, not an ordering sleep
    return threads


def _batch_of(committer: GroupCommitter, recorder: Recorder, size: int) -> None:
    """Make the committer's last batch hold ``size`` requests: one caller leads and
    blocks in the executor while ``size`` more queue, then all of them commit."""
    recorder.hold = True
    recorder.entered.clear()
    recorder.release.clear()
    leader = threading.Thread(target=committer.submit, args=(lambda _t: None,))
    leader.start()
    assert recorder.entered.wait(30)
    followers = _queue(committer, size)
    recorder.release.set()
    for t in [leader, *followers]:
        t.join(30)
    assert recorder.batches[-1] == size


def test_a_caller_writing_alone_never_pauses() -> None:
    """One caller after another: every batch is one request and no pause is taken."""
    pauses: list[float] = []
    recorder = Recorder()
    committer = GroupCommitter(recorder, _closed, pause=pauses.append)
    for i in range(50):
        assert committer.submit(lambda _t, i=i: i) == i
    assert recorder.batches == [1] * 50
    assert pauses == []


def test_after_a_batch_of_several_the_leader_waits_for_as_many() -> None:
    """After a batch of 5, the next leader pauses while its callers come back one a
    pause, and takes them all in one batch as soon as 5 are queued."""
    recorder = Recorder()
    arrivals: list[Callable[[], Any]] = []
    pauses: list[float] = []
    started: list[threading.Thread] = []

    def pause(seconds: float) -> None:
        pauses.append(seconds)
        if arrivals:
            started.extend(arrivals.pop()())

    committer = GroupCommitter(recorder, _closed, pause=pause)
    _batch_of(committer, recorder, 5)
    assert pauses == []  # the batch of 5 followed a batch of one
    arrivals.extend([lambda: _queue(committer, 1)] * 4)
    assert committer.submit(lambda _t: "mine") == "mine"
    for t in started:
        t.join(30)
    assert pauses == [GATHER_PAUSE] * 4
    assert recorder.batches[-1] == 5  # the leader and the four that came back


def test_the_leader_stops_gathering_when_nobody_comes() -> None:
    """Two pauses that bring no caller end the wait: a lone caller after a large
    batch pays two pauses, not one per request of that batch."""
    recorder = Recorder()
    pauses: list[float] = []
    committer = GroupCommitter(recorder, _closed, pause=pauses.append)
    _batch_of(committer, recorder, 8)
    assert committer.submit(lambda _t: 1) == 1
    assert pauses == [GATHER_PAUSE] * 2
    assert recorder.batches[-1] == 1
    assert committer.submit(lambda _t: 2) == 2  # and a batch of one asks for no wait again
    assert pauses == [GATHER_PAUSE] * 2


def test_gathering_is_bounded_when_the_queue_keeps_moving() -> None:
    """A queue that changes at every pause but never reaches the last batch's size
    keeps the leader waiting for at most twice that size in pauses."""
    recorder = Recorder()
    committer = GroupCommitter(recorder, _closed)
    _batch_of(committer, recorder, 3)
    pending = committer._pending  # the queue a pause lets other callers change
    pauses: list[float] = []

    def flicker(seconds: float) -> None:
        # 0, 1, 0, 1...: always a change, never three queued.
        pauses.append(seconds)
        if pending:
            pending.clear()
        else:
            pending.append(WriteRequest(lambda _t: None))

    committer._pause = flicker
    committer._gather()
    assert pauses == [GATHER_PAUSE] * 6


# -- lazy requests: a lingering batch shares the next eager request's commit -------


def _lingering(committer: GroupCommitter) -> None:
    """Return once a leader lingers for an eager request."""
    waited = threading.Event()
    while not committer._lingering:
        waited.wait(0.001)  # a deadline poll for another thread's progress, not an ordering sleep


def _lazy_after_eager(monkeypatch: pytest.MonkeyPatch) -> tuple[GroupCommitter, Recorder, Any]:
    """A committer whose last batch held an eager request and whose linger would
    last a minute; then a lazy write, lingering in its own thread. Returns the
    committer, its recorder and that thread."""
    monkeypatch.setattr("subagents.store._group.LINGER_MAX", 60.0)
    recorder = Recorder()
    committer = GroupCommitter(recorder, _closed)
    assert committer.submit(lambda _t: "eager") == "eager"
    committer._spent = 60.0  # (the last commit "took a minute": what a linger may wait)
    out: list[Any] = []
    lazy = threading.Thread(
        target=lambda: out.extend(committer.submit_many([lambda _t: "lazy"], lazy=lambda: True))
    )
    lazy.start()
    _lingering(committer)
    return committer, recorder, (lazy, out)


def test_a_lazy_batch_lingers_for_an_eager_request_and_shares_its_commit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 20 (durable rows): the turn's records (lazy) and the next acceptance
    (eager) commit in one transaction, not two; the eager caller ends the wait."""
    for _ in range(20):
        committer, recorder, (lazy, out) = _lazy_after_eager(monkeypatch)
        assert committer.submit(lambda _t: "accept") == "accept"
        lazy.join(30)
        assert not lazy.is_alive()
        assert [r.outcome() for r in out] == ["lazy"]
        assert recorder.batches == [1, 2]  # the eager one's batch took the lazy one too


def test_hurry_and_close_end_a_linger_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Somebody waiting for the lazy write (a flush) hurries it: it commits alone,
    now; closing does the same."""
    for end in ("hurry", "close"):
        committer, recorder, (lazy, out) = _lazy_after_eager(monkeypatch)
        if end == "hurry":
            committer.hurry()
        else:
            committer.close(lambda: None)
        lazy.join(30)
        assert not lazy.is_alive()
        if end == "hurry":
            assert [r.outcome() for r in out] == ["lazy"]
            assert recorder.batches == [1, 1]
        # Closed while it lingered: refused (the batch runs after the close), never lost
        # silently: the caller reads the closed error.
        else:
            with pytest.raises(SubagentError):
                out[0].outcome()


def test_a_lazy_write_without_an_eager_one_before_it_does_not_linger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A runtime writing its turns with nobody accepting (no eager batch last): no
    wait, however long the last commit took."""
    monkeypatch.setattr("subagents.store._group.LINGER_MAX", 60.0)
    recorder = Recorder()
    committer = GroupCommitter(recorder, _closed)
    committer._spent = 60.0
    for _ in range(3):
        (request,) = committer.submit_many([lambda _t: "lazy"], lazy=lambda: True)
        assert request.outcome() == "lazy"
    assert recorder.batches == [1, 1, 1]
    assert not committer._lingering


def test_an_eager_leader_does_not_keep_leading_lazy_requests_alone() -> None:
    """The lazy requests queued behind an eager batch are handed to their own
    submitter (who lingers in its thread), not committed by the eager caller, who
    returns after its own batch."""
    recorder = Recorder()
    threads: list[str] = []

    def execute(batch: list[WriteRequest]) -> None:
        threads.append(threading.current_thread().name)
        recorder(batch)

    committer = GroupCommitter(execute, _closed)
    recorder.hold = True
    eager = threading.Thread(target=committer.submit, args=(lambda _t: None,), name="eager")
    eager.start()
    assert recorder.entered.wait(30)
    out: list[Any] = []
    lazy = threading.Thread(
        target=lambda: out.extend(committer.submit_many([lambda _t: "lazy"], lazy=lambda: True)),
        name="lazy",
    )
    lazy.start()
    while committer.pending < 1:
        threading.Event().wait(0.001)  # a deadline poll, as in _queue
    recorder.release.set()
    eager.join(30)
    lazy.join(30)
    assert [r.outcome() for r in out] == ["lazy"]
    assert recorder.batches == [1, 1]
    assert threads == ["eager", "lazy"]


def _submit_lazy(committer: GroupCommitter, out: list[Any]) -> None:
    out.extend(committer.submit_many([lambda _t: "lazy"], lazy=lambda: True))


def test_a_hurry_while_nobody_lingers_stops_the_next_linger(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A waiter whose lazy batch another submitter will lead (two runtimes on one
    store): its hurry comes before the linger starts, and the leader's own ``lazy``
    still says nobody waits. The linger must not start (it would last a minute)."""
    monkeypatch.setattr("subagents.store._group.LINGER_MAX", 60.0)
    recorder = Recorder()
    committer = GroupCommitter(recorder, _closed)
    for _ in range(5):
        assert committer.submit(lambda _t: "eager") == "eager"
        committer._spent = 60.0
        committer.hurry()  # the other submitter's waiter
        out: list[Any] = []
        lazy = threading.Thread(target=_submit_lazy, args=(committer, out))
        lazy.start()
        lazy.join(10)
        assert not lazy.is_alive(), "the batch lingered though somebody waited"
        assert [r.outcome() for r in out] == ["lazy"]
    assert recorder.batches == [1, 1] * 5


class _NudgeInterrupted:
    """The committer's nudge lock, with a SIGINT raised just before each release:
    the handler runs between the two, where a Ctrl-C can land."""

    def __init__(self, lock: Any) -> None:
        self._lock = lock

    def acquire(self, *args: Any) -> bool:
        return bool(self._lock.acquire(*args))

    def release(self) -> None:
        signal.raise_signal(signal.SIGINT)
        self._lock.release()


@pytest.fixture
def deferring_sigint() -> Iterator[None]:
    """The runtime's SIGINT handler, as installed in the main thread: it defers an
    interrupt inside a critical section."""

    def handler(_sig: int, _frame: Any) -> None:
        if not defer_interrupt():
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.usefixtures("deferring_sigint")
def test_a_ctrl_c_inside_hurry_does_not_strand_the_lingering_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A flush or a close (the main thread) hurries a lingering batch and Ctrl-C
    lands between the linger's end and its nudge: the interrupt is raised once the
    nudge went, and the batch commits -- the leader does not wait for a nudge that
    never comes, with every later writer behind it."""
    assert threading.current_thread() is threading.main_thread()
    for _ in range(5):
        committer, recorder, (lazy, out) = _lazy_after_eager(monkeypatch)
        committer._nudge = _NudgeInterrupted(committer._nudge)  # type: ignore[assignment]
        with pytest.raises(KeyboardInterrupt):
            committer.hurry()
        lazy.join(10)
        assert not lazy.is_alive(), "the lingering leader was stranded"
        assert [r.outcome() for r in out] == ["lazy"]
        assert committer.submit(lambda _t: "later") == "later"
        assert recorder.batches == [1, 1, 1]
