"""The durable catalog: listings of session trees, and the projections behind them.

Imports no actor runtime: ``subagents tree`` and ``show`` use it without pykka or
gevent, and a runtime hands it its backend as the :class:`Runner`.
"""

from ._catalog import Catalog
from ._corpus import LiveSessions
from ._forest import Detached, Forest, forest
from ._identity import IDENTITY_CACHE_MAX, INSPECTION_CONCURRENCY
from ._projections import ProjectionRegistry, ProjectionUnit, subagent_timing_unit, subagent_unit
from ._retain import retain_identity
from ._rows import ChildRow, DescendantRow, Diagnostic, Listing
from ._runner import THREADS, Runner, SignalLike
from ._state import STATES, SessionState, session_state, session_state_unit

__all__ = [
    "IDENTITY_CACHE_MAX",
    "INSPECTION_CONCURRENCY",
    "STATES",
    "THREADS",
    "Catalog",
    "ChildRow",
    "DescendantRow",
    "Detached",
    "Diagnostic",
    "Forest",
    "Listing",
    "LiveSessions",
    "ProjectionRegistry",
    "ProjectionUnit",
    "Runner",
    "SessionState",
    "SignalLike",
    "forest",
    "retain_identity",
    "session_state",
    "session_state_unit",
    "subagent_timing_unit",
    "subagent_unit",
]
