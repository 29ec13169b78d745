"""Runtimes across ``fork()``: the child's copy of a runtime belongs to the parent.

A child process (gunicorn ``--preload``, ``gevent.fork``, multiprocessing's fork
start method) holds a copy of every runtime its parent made: of its agents,
their leases (held under the parent's holder id) and its actors. None of it is
the child's to run. On threads the copy's actors are gone (a fork copies only
the forking thread); on gevent their greenlets are copied with the hub, and a
pending wake-up, a lease renewal's timer or a doorbell would run them in the
child -- a second process running the parent's sessions under the parent's
name. So, in the child:

* :data:`generation` is bumped, and every loop of a runtime (an actor parked on
  its inbox, the session writer, lease renewal, the mail pickup, alarms) that
  wakes up in a generation it did not start in :func:`abandon`\\ s itself: its
  greenlet parks for good, kept referenced so that no ``GreenletExit`` ever
  runs its cleanup;
* each runtime :func:`track`\\ ed here gets its ``_forked()`` call (taking no
  lock: the threads that held the copy's locks are gone) and from then on
  refuses every call with ``WRONG_PROCESS`` -- except ``close()``, which lets
  the copy go and touches nothing of the parent's. Its store refuses too
  (``subagents.store``'s own fork hook, which runs first).

The forking thread's gevent hub is prepared for the child (``gevent.reinit``)
after a plain ``os.fork()`` too, as ``gevent.fork()`` and a patched fork do:
without it the hub's threadpool is a dead copy, and a runtime the child makes of
its own on gevent (whose store calls go through that threadpool) hangs.

A turn whose greenlet was running when the process forked may finish in the
child too (what it does outside the runtime cannot be taken back); its writes
are refused, and no further turn starts there. Fork before the work starts, or
make each worker's runtime after the fork.
"""

from __future__ import annotations

import os
import weakref
from typing import Any, NoReturn, Protocol

import gevent
import greenlet
from gevent._hub_local import get_hub_if_exists
from subagents.protocol import WrongProcessError

__all__ = [
    "abandon",
    "abandon_if_forked",
    "check_born",
    "fork_generation",
    "inherited_error",
    "track",
]

#: How many forks this process is from the one that imported this module (0 there).
generation = 0
_pids = [os.getpid()]  # the process of each generation

_tracked: weakref.WeakSet[Any] = weakref.WeakSet()
#: Greenlets of inherited runtimes, parked for good (never collected: collecting a
#: suspended greenlet throws ``GreenletExit`` into it, which would run its cleanup).
_abandoned: list[Any] = []


class _Forkable(Protocol):
    def _forked(self) -> None: ...


def track(obj: _Forkable) -> None:
    """Call ``obj._forked()`` in the child of every later fork."""
    _tracked.add(obj)


def inherited_error(what: str, pid: int) -> WrongProcessError:
    """``WRONG_PROCESS``: ``what`` was made by process ``pid``, before a fork."""
    return WrongProcessError(what, pid, "make a Runtime of its own here")


def abandon() -> NoReturn:
    """Stop the calling loop of an inherited runtime for good: on gevent its
    greenlet parks forever; elsewhere (a thread that forked, in the child) it
    raises ``WRONG_PROCESS``."""
    current = greenlet.getcurrent()
    hub = get_hub_if_exists()
    if hub is None or current.parent is None or current is hub:
        raise inherited_error("this loop", os.getppid())
    _abandoned.append(current)
    while True:
        hub.switch()  # nobody switches back but a stale wake-up: park again


def fork_generation() -> int:
    """:data:`generation`: a loop notes it as it starts, for :func:`abandon_if_forked`."""
    return generation


def check_born(born: int, what: str) -> None:
    """``WRONG_PROCESS`` if this process forked since ``born`` (a
    :func:`fork_generation`): ``what`` is the parent's."""
    if generation != born:
        raise inherited_error(what, _pids[born])


def abandon_if_forked(born: int) -> None:
    """:func:`abandon` if this process forked since ``born`` (a :func:`fork_generation`):
    a loop of the parent's runtime, woken up in the child."""
    if generation != born:
        abandon()


def _after_fork_in_child() -> None:
    global generation, _tracked
    if get_hub_if_exists() is not None:  # idempotent: gevent.fork() calls it too
        gevent.reinit()
    generation += 1
    _pids.append(os.getpid())
    inherited, _tracked = list(_tracked), weakref.WeakSet()
    for obj in inherited:
        obj._forked()


os.register_at_fork(after_in_child=_after_fork_in_child)
