"""The CLI tests speak HTTP to ``subagents serve`` (a process, or a server thread
here) over loopback sockets: the guard of ``tests/resource_guard.py`` fails a test
that leaves one unclosed (at that test, not at a later one whose allocations
collect it). It costs one ``gc.collect()`` a test: about 50 ms on this directory's
139 tests, 7 s of CPU in all (3 to 4 s of wall time on two workers).
"""

from resource_guard import _no_leaked_resource  # noqa: F401  (autouse)
