"""``subagents.supervision``: residency and child-first release of continuable children.

The :class:`Activation` record, the residency table (running / waiting /
settled, derived from agent quiescence and the owned-children set), and the
supervisor actor that settles Activations and releases them child-first.
"""

from ._activation import Activation, Residency, ResidentAgent, residency
from ._supervisor import Notices, SupervisorHooks, supervisor_actor_class

__all__ = [
    "Activation",
    "Notices",
    "Residency",
    "ResidentAgent",
    "SupervisorHooks",
    "residency",
    "supervisor_actor_class",
]
