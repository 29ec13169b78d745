"""autogen-core's ``SingleThreadedAgentRuntime``: sequential ``send_message`` rate.

A module of its own without ``from __future__ import annotations``: autogen-core
reads the handler's type hints at class creation, so they must be real types.
"""

import asyncio
import gc
import sys
import time
from dataclasses import dataclass

from autogen_core import (
    AgentId,
    MessageContext,
    RoutedAgent,
    SingleThreadedAgentRuntime,
    message_handler,
)


@dataclass
class Msg:
    n: int


class Counter(RoutedAgent):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__("counter")
        self.count = 0

    @message_handler  # type: ignore[untyped-decorator,misc]
    async def on_msg(self, message: Msg, ctx: MessageContext) -> int:
        self.count += 1
        return self.count


async def _main(n: int) -> float:
    runtime = SingleThreadedAgentRuntime()
    await Counter.register(runtime, "counter", lambda: Counter())
    runtime.start()
    aid = AgentId("counter", "default")
    start = time.perf_counter()
    for i in range(n):
        await runtime.send_message(Msg(i), aid)
    rate = n / (time.perf_counter() - start)
    await runtime.stop()
    return rate


def send_rate(n: int) -> float:
    """Messages per second, each awaited before the next."""
    return asyncio.run(_main(n))


def best_rate(n: int, repeat: int) -> float:
    """The best of ``repeat`` runs, each started after a garbage collection."""
    best = 0.0
    for _ in range(repeat):
        gc.collect()
        best = max(best, send_rate(n))
    return best


if __name__ == "__main__":
    # ``python -m bench._autogen_baseline N REPEAT`` prints the best rate: the
    # bench measures autogen-core in an interpreter of its own, so neither its
    # imported heap nor ours is walked by the other's garbage collections.
    print(best_rate(int(sys.argv[1]), int(sys.argv[2])))
