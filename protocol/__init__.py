"""``subagents.protocol``: pure data, no threads, clocks or I/O (sans-IO).

The msgpack codec and its ExtType registry, the session-event vocabulary, the
versioned ``subagent/descriptor`` (snapshot and fold) and ``agent/options`` (a
top-level agent's recorded options and their fold), the delegation-depth
vocabulary, and the error root shared by every layer.
"""

from ._agent_options import (
    AGENT_OPTIONS_VERSION,
    OptionsFold,
    RecordedOptions,
    agent_options_event,
    fold_agent_options,
)
from ._codec import EXT_CODES, pack_shaped, packb, unpackb
from ._depth import (
    SUBAGENT_DEPTH_OPTION,
    DepthBearing,
    assert_subagent_max_depth,
    delegation_depth_of,
    resolve_delegation_depth,
)
from ._descriptor import (
    DESCRIPTOR_VERSION,
    ContinuableDescriptor,
    DescriptorFold,
    OneShotDescriptor,
    SubagentDescriptor,
    descriptor_event,
    descriptor_payload,
    fold_subagent_descriptor,
    parse_descriptor_payload,
    snapshot_subagent_descriptor,
    try_fold_subagent_descriptor,
)
from ._errors import (
    CorruptRecordError,
    DecodeError,
    DescriptorCorruptError,
    DescriptorInvalidError,
    DescriptorUnsupportedError,
    EncodeError,
    ErrorCode,
    SubagentError,
)
from ._events import (
    EVENT_TYPES,
    decode_event,
    decode_header,
    encode_event,
    encode_header,
    event_from_wire,
    event_to_wire,
    header_from_wire,
    header_to_wire,
)
from ._frames import FrameDecoder
from ._ids import MessageId, RunId, SessionId, new_message_id, new_run_id, new_session_id
from ._limits import DEFAULT_LIMITS, Limits
from ._time import micros
from ._trusted import trusted_message, trusted_turn_end, trusted_turn_start
from ._vocabulary import (
    ORIGINS,
    STOP_REASONS,
    AgentOptionsEvent,
    Event,
    InterruptEvent,
    MessageEvent,
    MessageSource,
    ReportEvent,
    SessionHeader,
    SubagentDescriptorEvent,
    TurnEnd,
    TurnStart,
    UnknownEvent,
)

__all__ = [
    "AGENT_OPTIONS_VERSION",
    "DEFAULT_LIMITS",
    "DESCRIPTOR_VERSION",
    "EVENT_TYPES",
    "EXT_CODES",
    "ORIGINS",
    "STOP_REASONS",
    "SUBAGENT_DEPTH_OPTION",
    "AgentOptionsEvent",
    "ContinuableDescriptor",
    "CorruptRecordError",
    "DecodeError",
    "DepthBearing",
    "DescriptorCorruptError",
    "DescriptorFold",
    "DescriptorInvalidError",
    "DescriptorUnsupportedError",
    "EncodeError",
    "ErrorCode",
    "Event",
    "FrameDecoder",
    "InterruptEvent",
    "Limits",
    "MessageEvent",
    "MessageId",
    "MessageSource",
    "OneShotDescriptor",
    "OptionsFold",
    "RecordedOptions",
    "ReportEvent",
    "RunId",
    "SessionHeader",
    "SessionId",
    "SubagentDescriptor",
    "SubagentDescriptorEvent",
    "SubagentError",
    "TurnEnd",
    "TurnStart",
    "UnknownEvent",
    "agent_options_event",
    "assert_subagent_max_depth",
    "decode_event",
    "decode_header",
    "delegation_depth_of",
    "descriptor_event",
    "descriptor_payload",
    "encode_event",
    "encode_header",
    "event_from_wire",
    "event_to_wire",
    "fold_agent_options",
    "fold_subagent_descriptor",
    "header_from_wire",
    "header_to_wire",
    "micros",
    "new_message_id",
    "new_run_id",
    "new_session_id",
    "pack_shaped",
    "packb",
    "parse_descriptor_payload",
    "resolve_delegation_depth",
    "snapshot_subagent_descriptor",
    "trusted_message",
    "trusted_turn_end",
    "trusted_turn_start",
    "try_fold_subagent_descriptor",
    "unpackb",
]
