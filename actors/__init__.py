"""``subagents.actors``: the pykka actors and the facade.

The layer is laid out in rooms, each a private subpackage with its public names
in its ``__init__``:

* ``_kernel`` -- the runtime seam and its primitives: backends (threading,
  native gevent), futures, cancellation signals, gates, the dispatcher;
* ``_agents`` -- the agent core: the Agent whose actor mailbox is its FIFO inbox,
  turns, behaviours by name, sessions and their persistence;
* ``_children`` -- the subagent service: providers, one-shot runs, continuable
  children and the registry actor that admits them;
* ``_catalog`` -- the durable catalog: listings and projections;
* ``_model`` -- agents that think: the model-facing subagent tools, their
  dispatcher, and an OpenAI-compatible chat behaviour;
* ``_shell`` -- the command line and the demo;

and ``Runtime``, the composition root that wires them. The names below load on
first use, so importing a room that needs no actor runtime (the catalog, the
CLI's readers) does not import pykka or gevent.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._agents import (
        Agent,
        AgentHost,
        AgentOptions,
        AgentRegistry,
        AgentStatistics,
        Behaviour,
        LiveSession,
        Message,
        ModelRegistry,
        PersistenceFailure,
        Restored,
        RuntimeStatistics,
        SessionService,
        SessionStatistics,
        Steered,
        ToolRegistry,
        Turn,
        TurnAgent,
        TurnOutcome,
        echo,
    )
    from ._catalog import (
        Catalog,
        ChildRow,
        DescendantRow,
        Diagnostic,
        Listing,
        ProjectionRegistry,
        ProjectionUnit,
    )
    from ._children import (
        CAPABILITIES,
        AncestorAuthority,
        BoundSubagents,
        ChildStatistics,
        ContinuableCreateSpec,
        ContinuableHandle,
        ContinuableScope,
        ContinuableStartSpec,
        ContinuationManager,
        ForkProvider,
        LocalProvider,
        ProviderRegistration,
        ReportReceipt,
        RunResult,
        SetupRegistration,
        SubagentEvent,
        SubagentProvider,
        SubagentRun,
        SubagentService,
        SubagentStartRequest,
        Subscription,
        UserAuthority,
    )
    from ._kernel import (
        GEVENT,
        THREADING,
        AbortController,
        AbortSignal,
        Backend,
        EventLike,
        GeventActor,
        GeventFuture,
        LockLike,
        ResultFuture,
        TaskHandle,
        current_backend,
        get_backend,
    )
    from ._model import (
        SUBAGENT_TOOLS,
        Completion,
        ModelError,
        ModelTool,
        OpenAIChat,
        ToolCall,
        ToolDispatcher,
        openai_chat,
    )
    from ._runtime import Runtime

#: Public name -> the room that defines it.
_ROOMS = {
    "Agent": "_agents",
    "AgentHost": "_agents",
    "AgentOptions": "_agents",
    "AgentRegistry": "_agents",
    "AgentStatistics": "_agents",
    "Behaviour": "_agents",
    "LiveSession": "_agents",
    "Message": "_agents",
    "ModelRegistry": "_agents",
    "PersistenceFailure": "_agents",
    "Restored": "_agents",
    "RuntimeStatistics": "_agents",
    "SessionService": "_agents",
    "SessionStatistics": "_agents",
    "Steered": "_agents",
    "ToolRegistry": "_agents",
    "Turn": "_agents",
    "TurnAgent": "_agents",
    "TurnOutcome": "_agents",
    "echo": "_agents",
    "Catalog": "_catalog",
    "ChildRow": "_catalog",
    "DescendantRow": "_catalog",
    "Diagnostic": "_catalog",
    "Listing": "_catalog",
    "ProjectionRegistry": "_catalog",
    "ProjectionUnit": "_catalog",
    "CAPABILITIES": "_children",
    "AncestorAuthority": "_children",
    "BoundSubagents": "_children",
    "ChildStatistics": "_children",
    "ContinuableCreateSpec": "_children",
    "ContinuableHandle": "_children",
    "ContinuableScope": "_children",
    "ContinuableStartSpec": "_children",
    "ContinuationManager": "_children",
    "ForkProvider": "_children",
    "LocalProvider": "_children",
    "ProviderRegistration": "_children",
    "ReportReceipt": "_children",
    "RunResult": "_children",
    "SetupRegistration": "_children",
    "SubagentEvent": "_children",
    "SubagentProvider": "_children",
    "SubagentRun": "_children",
    "SubagentService": "_children",
    "SubagentStartRequest": "_children",
    "Subscription": "_children",
    "UserAuthority": "_children",
    "GEVENT": "_kernel",
    "THREADING": "_kernel",
    "AbortController": "_kernel",
    "AbortSignal": "_kernel",
    "Backend": "_kernel",
    "EventLike": "_kernel",
    "GeventActor": "_kernel",
    "LockLike": "_kernel",
    "TaskHandle": "_kernel",
    "GeventFuture": "_kernel",
    "ResultFuture": "_kernel",
    "current_backend": "_kernel",
    "get_backend": "_kernel",
    "SUBAGENT_TOOLS": "_model",
    "Completion": "_model",
    "ModelError": "_model",
    "ModelTool": "_model",
    "OpenAIChat": "_model",
    "ToolCall": "_model",
    "ToolDispatcher": "_model",
    "openai_chat": "_model",
    "Runtime": "_runtime",
}

__all__ = [
    "CAPABILITIES",
    "GEVENT",
    "SUBAGENT_TOOLS",
    "THREADING",
    "AbortController",
    "AbortSignal",
    "Agent",
    "AgentHost",
    "AgentOptions",
    "AgentRegistry",
    "AgentStatistics",
    "AncestorAuthority",
    "Backend",
    "Behaviour",
    "BoundSubagents",
    "Catalog",
    "ChildRow",
    "ChildStatistics",
    "Completion",
    "ContinuableCreateSpec",
    "ContinuableHandle",
    "ContinuableScope",
    "ContinuableStartSpec",
    "ContinuationManager",
    "DescendantRow",
    "Diagnostic",
    "EventLike",
    "ForkProvider",
    "GeventActor",
    "GeventFuture",
    "Listing",
    "LiveSession",
    "LocalProvider",
    "LockLike",
    "Message",
    "ModelError",
    "ModelRegistry",
    "ModelTool",
    "OpenAIChat",
    "PersistenceFailure",
    "ProjectionRegistry",
    "ProjectionUnit",
    "ProviderRegistration",
    "ReportReceipt",
    "Restored",
    "ResultFuture",
    "RunResult",
    "Runtime",
    "RuntimeStatistics",
    "SessionService",
    "SessionStatistics",
    "SetupRegistration",
    "Steered",
    "SubagentEvent",
    "SubagentProvider",
    "SubagentRun",
    "SubagentService",
    "SubagentStartRequest",
    "Subscription",
    "TaskHandle",
    "ToolCall",
    "ToolDispatcher",
    "ToolRegistry",
    "Turn",
    "TurnAgent",
    "TurnOutcome",
    "UserAuthority",
    "current_backend",
    "echo",
    "get_backend",
    "openai_chat",
]


def __getattr__(name: str) -> Any:
    room = _ROOMS.get(name)
    if room is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{room}"), name)
    globals()[name] = value  # once loaded, a plain module attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
