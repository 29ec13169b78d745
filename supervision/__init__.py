"""``subagents.supervision``: residency and child-first release of continuable children.

The lifecycle table (:class:`Phase`, :func:`advance` and the predicates derived
from it), the :class:`Activation` record and the residency table (running /
waiting / settled, derived from agent quiescence and the owned-children set),
notice boxes, and the supervisor actor's behaviour, which settles Activations and
releases them child-first. Nothing here imports the actors layer: agents are seen
through :class:`ResidentAgent`, and the actors layer builds the supervisor's actor
class from its backend's actor base.
"""

from ._activation import Activation, Latch, Residency, ResidentAgent, residency
from ._notices import DRAIN, NoticeBox, NoticeLoop
from ._phase import (
    FOLLOW_UP,
    INTERRUPTIBLE,
    MAY_REPORT,
    MAY_SETTLE,
    TRANSITIONS,
    VISIBLE,
    Phase,
    Route,
    Trigger,
    advance,
)
from ._supervisor import Supervisor, SupervisorHooks, SupervisorInbox

__all__ = [
    "DRAIN",
    "FOLLOW_UP",
    "INTERRUPTIBLE",
    "MAY_REPORT",
    "MAY_SETTLE",
    "TRANSITIONS",
    "VISIBLE",
    "Activation",
    "Latch",
    "NoticeBox",
    "NoticeLoop",
    "Phase",
    "Residency",
    "ResidentAgent",
    "Route",
    "Supervisor",
    "SupervisorHooks",
    "SupervisorInbox",
    "Trigger",
    "advance",
    "residency",
]
