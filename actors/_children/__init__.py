"""Children: the subagent service, its providers, and continuable children.

The :class:`SubagentService` facade (the seed's ``ctx.subagents``) over the
provider registry, lifecycle events, the one-shot providers (``local``,
``fork``), and the :class:`ContinuationManager` with its registry actor
(admission), the supervisor it wires (residency) and setup contributions.
"""

from ._bound import BoundSubagents
from ._child import ChildContext
from ._child_stats import ChildStatistics
from ._continuation import ContinuationManager
from ._events import EventBus, Listener, Subscription
from ._hosted import Hosting
from ._placed import PlacedChild, Placement
from ._provider_registry import ProviderRegistration, ProviderRegistry
from ._providers import ForkProvider, LocalProvider
from ._remote import adopt, wake_child, wake_orphan
from ._reports import ReportReceipt
from ._service import SubagentService
from ._setup import ContinuableScope, SetupRegistration
from ._types import (
    CAPABILITIES,
    AncestorAuthority,
    ContinuableCreateSpec,
    ContinuableHandle,
    ContinuableStartSpec,
    RunResult,
    SubagentEvent,
    SubagentProvider,
    SubagentRun,
    SubagentStartRequest,
    UserAuthority,
)

__all__ = [
    "CAPABILITIES",
    "AncestorAuthority",
    "BoundSubagents",
    "ChildContext",
    "ChildStatistics",
    "ContinuableCreateSpec",
    "ContinuableHandle",
    "ContinuableScope",
    "ContinuableStartSpec",
    "ContinuationManager",
    "EventBus",
    "ForkProvider",
    "Hosting",
    "Listener",
    "LocalProvider",
    "PlacedChild",
    "Placement",
    "ProviderRegistration",
    "ProviderRegistry",
    "ReportReceipt",
    "RunResult",
    "SetupRegistration",
    "SubagentEvent",
    "SubagentProvider",
    "SubagentRun",
    "SubagentService",
    "SubagentStartRequest",
    "Subscription",
    "UserAuthority",
    "adopt",
    "wake_child",
    "wake_orphan",
]
