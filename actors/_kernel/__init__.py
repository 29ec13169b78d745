"""The runtime seam and its primitives.

Backends (threading, native gevent), pykka's hooks and the one place that names
its private surface, futures, cancellation signals, latches and gates, the
dispatcher actor that runs user callbacks outside every owner, the alarm, and
the doorbell that wakes another process's runtime, and process exit and Ctrl-C.
Nothing here knows agents or children.
"""

from ._actorclass import actor_class
from ._alarm import Alarm
from ._backend import (
    GEVENT,
    THREADING,
    Backend,
    EventLike,
    LockLike,
    TaskHandle,
    current_backend,
    get_backend,
    threading_is_patched,
)
from ._checks import (
    check_keep_warm,
    check_max_inbox,
    check_runtime_arguments,
    check_timeout,
    checked_clock,
    stamping_clock,
    utcnow,
)
from ._dispatch import DispatchBox, Dispatcher
from ._doorbell import Doorbell, ring
from ._exit import close_at_exit, closed, deliver_interrupt, install_sigint
from ._fork import abandon, abandon_if_forked, check_born, fork_generation
from ._future import ResultFuture, Waiter
from ._gate import Gate, Latch
from ._gevent import GeventActor, GeventFuture, native_get_ident
from ._refindex import install as _install_ref_index
from ._signal import AbortController, AbortSignal
from ._telemetry import Telemetry, stamp, telemetry_for, traced
from ._threadinbox import ThreadActor

# pykka's registry of running actors, with constant-time removal (see _refindex).
_install_ref_index()

__all__ = [
    "GEVENT",
    "THREADING",
    "AbortController",
    "AbortSignal",
    "Alarm",
    "Backend",
    "DispatchBox",
    "Dispatcher",
    "Doorbell",
    "EventLike",
    "Gate",
    "GeventActor",
    "GeventFuture",
    "Latch",
    "LockLike",
    "ResultFuture",
    "TaskHandle",
    "Telemetry",
    "ThreadActor",
    "Waiter",
    "abandon",
    "abandon_if_forked",
    "actor_class",
    "check_born",
    "check_keep_warm",
    "check_max_inbox",
    "check_runtime_arguments",
    "check_timeout",
    "checked_clock",
    "close_at_exit",
    "closed",
    "current_backend",
    "deliver_interrupt",
    "fork_generation",
    "get_backend",
    "install_sigint",
    "native_get_ident",
    "ring",
    "stamp",
    "stamping_clock",
    "telemetry_for",
    "threading_is_patched",
    "traced",
    "utcnow",
]
