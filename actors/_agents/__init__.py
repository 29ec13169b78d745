"""The agent core: the Agent actor, its turns, behaviours, sessions.

An :class:`Agent` is a pykka actor whose mailbox is its FIFO inbox; its turns run
behaviours registered by model name; its session lives in :class:`SessionService`
(a live tail plus write-behind persistence). The core sees the rest of the runtime
only through :class:`AgentHost`, and never imports the subagent service.
"""

from ._agent import Agent
from ._ahead import committed_at, keep_untaken, replay_first, replayed
from ._behaviours import Behaviour, BehaviourFactory, ModelRegistry, as_behaviour, echo
from ._claims import runtime_closed
from ._failures import PersistenceFailure, SessionStatistics
from ._host import AgentHost
from ._kept import kept, wake_holder
from ._leases import Holder, Leases
from ._live import LiveSession
from ._mail import Mailman, interrupt_ring
from ._messages import UNTAKEN, plain
from ._options import AgentOptions, recorded_model
from ._outcome import KEPT, TurnOutcome
from ._output import check_output_schema, validate_output
from ._registry import AgentRegistry
from ._resume import CUT_SHORT, Restored, replay, stored_options
from ._rung import Rung
from ._sessions import SessionService
from ._spawn import close_agents, dispose_by_depth, spawn_agent, wait_all_idle
from ._stats import AgentStatistics, RuntimeCounters, RuntimeStatistics, runtime_statistics
from ._steering import STEER_OUTCOMES, Steered, check_steer, not_open
from ._tools import TOOL_NAME_PATTERN, ToolFn, ToolRegistry, check_tool_fn, valid_tool_name
from ._turn import Message, Turn, TurnAgent
from ._write_faults import in_doubt

__all__ = [
    "CUT_SHORT",
    "KEPT",
    "STEER_OUTCOMES",
    "TOOL_NAME_PATTERN",
    "UNTAKEN",
    "Agent",
    "AgentHost",
    "AgentOptions",
    "AgentRegistry",
    "AgentStatistics",
    "Behaviour",
    "BehaviourFactory",
    "Holder",
    "Leases",
    "LiveSession",
    "Mailman",
    "Message",
    "ModelRegistry",
    "PersistenceFailure",
    "Restored",
    "Rung",
    "RuntimeCounters",
    "RuntimeStatistics",
    "SessionService",
    "SessionStatistics",
    "Steered",
    "ToolFn",
    "ToolRegistry",
    "Turn",
    "TurnAgent",
    "TurnOutcome",
    "as_behaviour",
    "check_output_schema",
    "check_steer",
    "check_tool_fn",
    "close_agents",
    "committed_at",
    "dispose_by_depth",
    "echo",
    "in_doubt",
    "interrupt_ring",
    "keep_untaken",
    "kept",
    "not_open",
    "plain",
    "recorded_model",
    "replay",
    "replay_first",
    "replayed",
    "runtime_closed",
    "runtime_statistics",
    "spawn_agent",
    "stored_options",
    "valid_tool_name",
    "validate_output",
    "wait_all_idle",
    "wake_holder",
]
