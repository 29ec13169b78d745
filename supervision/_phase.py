"""The lifecycle of an Activation, written down once.

Everything the runtime decides about a continuable child's epoch -- may a
follow-up enter its inbox, may it be interrupted, may it report, may it settle --
is a lookup in the tables of this module, keyed by its :class:`Phase`. The phase
itself changes only through :func:`advance`, and only the registry actor calls it.

Transitions (``TRANSITIONS``)::

    RESERVED  --publish-->        RESIDENT   a materialization published its agent
    RESERVED  --publish_closed--> DRAINING   ... below a drain cutoff
    RESERVED  --abandon-->        RELEASED   the materialization rolled back
    RESERVED  --cutoff-->         RESERVED   admitted before the cutoff: runs to its end
    RESIDENT  --cutoff-->         DRAINING   admission closed below a drained parent
    DRAINING  --cutoff-->         DRAINING
    SETTLING  --cutoff-->         SETTLING
    RESIDENT  --retire-->         SETTLING   quiescent, owns nothing: the handle goes
    DRAINING  --retire-->         SETTLING
    SETTLING  --release-->        RELEASED   the handle is disposed
    RESIDENT  --release-->        RELEASED   ... by someone else (the runtime
    DRAINING  --release-->        RELEASED       closing, the agent's holder)

What each phase allows (the columns are the derived predicates)::

    phase      follow-up  interrupt  report  settle  visible
    RESERVED   wait       no-op      no      no      no
    RESIDENT   enqueue    yes        yes     yes     yes
    DRAINING   closed     yes        yes     yes     yes
    SETTLING   wait       no-op      no      no      no
    RELEASED   resume     no-op      no      no      no

*Residency* (running / waiting / settled) is a different thing: it is derived
from the agent's quiescence and the owned-children set, never stored
(:func:`subagents.supervision.residency`); the phase says what admission allows.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from subagents.protocol import ErrorCode, SubagentError

__all__ = [
    "FOLLOW_UP",
    "INTERRUPTIBLE",
    "MAY_REPORT",
    "MAY_SETTLE",
    "TRANSITIONS",
    "VISIBLE",
    "Phase",
    "Route",
    "Trigger",
    "advance",
]


class Phase(enum.Enum):
    """Where an Activation stands in its lifecycle."""

    # Members are singletons: identity hashing, not Enum's hash of the name in
    # Python (phases key the transition table, consulted on every settle).
    __hash__ = object.__hash__

    RESERVED = "reserved"  #: a materialization is admitted; no agent is published yet
    RESIDENT = "resident"  #: published: its inbox admits follow-ups
    DRAINING = "draining"  #: below a drain cutoff: admission closed, settles when quiet
    SETTLING = "settling"  #: retired: its agent handle is being disposed
    RELEASED = "released"  #: gone: the child may be materialized again


class Trigger(enum.Enum):
    """What moves an Activation from one phase to the next."""

    # Members are singletons: identity hashing, not Enum's hash of the name in
    # Python (phases key the transition table, consulted on every settle).
    __hash__ = object.__hash__

    PUBLISH = "publish"
    PUBLISH_CLOSED = "publish_closed"
    ABANDON = "abandon"
    CUTOFF = "cutoff"
    RETIRE = "retire"
    RELEASE = "release"


class Route(enum.Enum):
    """Where a follow-up to a child in a given phase goes."""

    # Members are singletons: identity hashing, not Enum's hash of the name in
    # Python (phases key the transition table, consulted on every settle).
    __hash__ = object.__hash__

    ENQUEUE = "enqueue"  #: into the resident inbox
    WAIT = "wait"  #: behind the materialization or release in flight
    CLOSED = "closed"  #: refused: ``ADMISSION_CLOSED``
    RESUME = "resume"  #: materialize the child (cold resume)


_P, _T = Phase, Trigger

TRANSITIONS: Final[Mapping[tuple[Phase, Trigger], Phase]] = MappingProxyType(
    {
        (_P.RESERVED, _T.PUBLISH): _P.RESIDENT,
        (_P.RESERVED, _T.PUBLISH_CLOSED): _P.DRAINING,
        (_P.RESERVED, _T.ABANDON): _P.RELEASED,
        (_P.RESERVED, _T.CUTOFF): _P.RESERVED,
        (_P.RESIDENT, _T.CUTOFF): _P.DRAINING,
        (_P.DRAINING, _T.CUTOFF): _P.DRAINING,
        (_P.SETTLING, _T.CUTOFF): _P.SETTLING,
        (_P.RESIDENT, _T.RETIRE): _P.SETTLING,
        (_P.DRAINING, _T.RETIRE): _P.SETTLING,
        (_P.SETTLING, _T.RELEASE): _P.RELEASED,
        # Disposed without retiring: the runtime closing, or whoever holds the agent.
        (_P.RESIDENT, _T.RELEASE): _P.RELEASED,
        (_P.DRAINING, _T.RELEASE): _P.RELEASED,
    }
)

FOLLOW_UP: Final[Mapping[Phase, Route]] = MappingProxyType(
    {
        _P.RESERVED: Route.WAIT,
        _P.RESIDENT: Route.ENQUEUE,
        _P.DRAINING: Route.CLOSED,
        _P.SETTLING: Route.WAIT,
        _P.RELEASED: Route.RESUME,
    }
)

#: An interrupt reaches the agent (elsewhere it is an accepted no-op: the target is absent).
INTERRUPTIBLE: Final = frozenset({_P.RESIDENT, _P.DRAINING})
#: The child may report to its parent.
MAY_REPORT: Final = frozenset({_P.RESIDENT, _P.DRAINING})
#: The supervisor may retire it once its residency is ``settled``.
MAY_SETTLE: Final = frozenset({_P.RESIDENT, _P.DRAINING})
#: ``ContinuationManager.activation()`` shows it: the child is resident.
VISIBLE: Final = frozenset({_P.RESIDENT, _P.DRAINING})


def advance(phase: Phase, trigger: Trigger) -> Phase:
    """The phase after ``trigger``.

    Raises:
        SubagentError: ``INTERNAL`` for a transition the table does not have (a
            bug in the caller, never a user error).
    """
    after = TRANSITIONS.get((phase, trigger))
    if after is None:
        raise SubagentError(
            f"no transition from {phase.name} on {trigger.name}", code=ErrorCode.INTERNAL
        )
    return after
