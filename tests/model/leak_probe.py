"""Run only by ``test_leak_guard.py`` (its name is not a test module's): a test that
leaks a socket in a reference cycle, so only the collector frees it, then a test
that leaks nothing."""

from __future__ import annotations

import socket
from typing import Any


def test_leaks_a_socket_in_a_cycle() -> None:
    mine, other = socket.socketpair()
    other.close()
    holder: list[Any] = [mine]
    holder.append(holder)  # a cycle: refcounting never frees it


def test_an_innocent_one_after() -> None:
    assert [[0] * 1000 for _ in range(1000)]  # allocations enough to run the collector
