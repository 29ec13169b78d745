"""``subagents.actors``: the pykka actors and the facade.

Runtime backends (threading, native gevent), the Agent whose actor mailbox is its
FIFO inbox, the cancellation signal, behaviours by name, the session service, the
agent registry, the built-in providers, and ``Runtime`` / ``SubagentService``.
"""

from ._agents._agent import Agent, TurnOutcome
from ._agents._behaviours import AgentOptions, Behaviour, ModelRegistry, echo
from ._agents._registry import AgentRegistry, ToolRegistry
from ._agents._sessions import LiveSession, SessionService
from ._agents._turn import BoundSubagents, Message, Turn
from ._children._providers import ForkProvider, LocalProvider
from ._children._service import ProviderRegistration, SubagentService, Subscription
from ._children._types import (
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
from ._kernel._backend import GEVENT, THREADING, Backend, current_backend, get_backend
from ._kernel._future import ResultFuture
from ._kernel._gevent import GeventActor, GeventFuture
from ._kernel._signal import AbortController, AbortSignal
from ._runtime import Runtime

__all__ = [
    "CAPABILITIES",
    "GEVENT",
    "THREADING",
    "AbortController",
    "AbortSignal",
    "Agent",
    "AgentOptions",
    "AgentRegistry",
    "AncestorAuthority",
    "Backend",
    "Behaviour",
    "BoundSubagents",
    "ContinuableCreateSpec",
    "ContinuableHandle",
    "ContinuableStartSpec",
    "ForkProvider",
    "GeventActor",
    "GeventFuture",
    "LiveSession",
    "LocalProvider",
    "Message",
    "ModelRegistry",
    "ProviderRegistration",
    "ResultFuture",
    "RunResult",
    "Runtime",
    "SessionService",
    "SubagentEvent",
    "SubagentProvider",
    "SubagentRun",
    "SubagentService",
    "SubagentStartRequest",
    "Subscription",
    "ToolRegistry",
    "Turn",
    "TurnOutcome",
    "UserAuthority",
    "current_backend",
    "echo",
    "get_backend",
]
