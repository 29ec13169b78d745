"""The example-server tests speak HTTP to real server processes over loopback
sockets: the guard of ``tests/resource_guard.py`` fails a test that leaves one
unclosed (at that test, not at a later one whose allocations collect it). It
costs one ``gc.collect()`` a test: about 40 ms on this directory's 40 tests, under
2 s in all.
"""

from resource_guard import _no_leaked_resource  # noqa: F401  (autouse)
