"""gevent: a model request waiting for a free worker of the hub's waiting pool (every
worker busy with another request) ends at once when its turn is cancelled, and
within its ``timeout`` -- counted from when it was queued -- instead of when some
other request frees a worker. R-ERR-6 (an abort raises ``CANCELLED``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import gevent
import gevent.event
import pytest
from subagents.actors import Runtime, openai_chat
from subagents.actors._kernel import _waiting
from subagents.actors._kernel._backend import GEVENT
from subagents.actors.testing import Answer, FakeOpenAI
from subagents.store import MemoryStore

pytestmark = pytest.mark.backend_specific


class _Pool(gevent.threadpool.ThreadPool):  # type: ignore[misc]
    """One worker; ``queued`` is set when a second call asks for it."""

    def __init__(self, hub: Any) -> None:
        super().__init__(1, hub=hub)
        self.calls = 0
        self.queued = gevent.event.Event()

    def spawn(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        if self.calls == 2:
            self.queued.set()
        return super().spawn(fn, *args, **kwargs)


@pytest.fixture
def full_pool(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Pool]:
    """The calling hub's waiting pool, one worker wide (killed afterwards)."""
    hub = gevent.get_hub()
    pool = _Pool(hub)
    monkeypatch.setitem(_waiting._POOLS, hub, pool)
    yield pool
    pool.kill()


def _runtime(fake: FakeOpenAI, **queued: Any) -> Runtime:
    rt = Runtime(MemoryStore(), backend=GEVENT)
    url, key = fake.base_url, "test-key"
    rt.models.register("slow", openai_chat("gpt-test", base_url=url, api_key=key))
    rt.models.register(
        "queued", openai_chat("gpt-test", base_url=url, api_key=key, max_retries=0, **queued)
    )
    return rt


def _fill(rt: Runtime, fake: FakeOpenAI, pool: _Pool) -> tuple[Any, Any]:
    """A request holding the only worker (stalled), and a turn queued behind it."""
    fake.script(Answer(stall=True))
    busy = rt.spawn("slow")
    busy.followup("hold the worker")
    assert fake.wait_requests(1)
    queued = rt.spawn("queued")
    queued.followup("wait for a worker")
    assert pool.queued.wait(10)
    return busy, queued


def test_a_turn_queued_for_a_worker_is_cancelled_at_once(
    fake: FakeOpenAI, full_pool: _Pool
) -> None:
    with _runtime(fake) as rt:
        busy, queued = _fill(rt, fake, full_pool)
        queued.cancel("stop")
        assert queued.wait_idle(10), "the queued turn ignored its cancel"
        end = rt.sessions.turn_ends(queued.session_id)[-1]
        assert end.stop_reason == "cancelled"
        assert len(fake.requests) == 1  # it never reached the model
        fake.release()
        assert busy.wait_idle(10)
        assert rt.sessions.turn_ends(busy.session_id)[-1].stop_reason == "completed"


def test_the_timeout_counts_from_when_the_request_was_queued(
    fake: FakeOpenAI, full_pool: _Pool
) -> None:
    with _runtime(fake, timeout=0.2) as rt:
        busy, queued = _fill(rt, fake, full_pool)
        assert queued.wait_idle(10), "the queued turn outlived its timeout"
        end = rt.sessions.turn_ends(queued.session_id)[-1]
        assert end.stop_reason == "failed" and "TIMEOUT" in end.error, end.error
        assert len(fake.requests) == 1
        fake.release()
        assert busy.wait_idle(10)
