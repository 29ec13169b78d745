"""The group committer's leader gathers a batch: R-S7 (accepted means committed, one
commit shared by concurrent callers), issue 13 point 1.

The committer is driven directly with an executor that records its batches; the
leader's pause is injected, so what a pause lets happen (callers queueing) is
done by the test inside the pause, never by timing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from subagents.protocol import ErrorCode, SubagentError
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
