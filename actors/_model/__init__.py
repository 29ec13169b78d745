"""Agents that think: model-facing subagent tools and an OpenAI-compatible behaviour.

* :data:`SUBAGENT_TOOLS` / :class:`ModelTool` -- the six subagent tools
  (``delegate``, ``start_agent``, ``send_message``, ``interrupt``, ``report``,
  ``list_agents``) as JSON-schema function definitions;
* :class:`ToolDispatcher` -- validates a model's tool call and runs it through
  the turn's bound subagent service; refusals come back as tool results;
* :func:`openai_chat` -- a model factory whose agents run the tool-call loop
  against an OpenAI-compatible ``/chat/completions`` API (the ``openai`` extra,
  httpx; imported on first use);
* the sans-I/O wire helpers (:class:`SSEDecoder`, :class:`ChunkAccumulator`,
  :class:`Completion`, :class:`ModelError`).

This room imports only downward (agents, children, catalog, kernel, protocol).
"""

from ._dispatch import ToolDispatcher
from ._history import history_messages
from ._openai import DEFAULT_BASE_URL, OpenAIChat, openai_chat
from ._retry import retry_delay
from ._schemas import SUBAGENT_TOOLS, ModelTool, tool_definition
from ._wire import (
    MODEL_ERROR,
    ChunkAccumulator,
    Completion,
    ModelError,
    SSEDecoder,
    ToolCall,
    completion_from_response,
)

__all__ = [
    "DEFAULT_BASE_URL",
    "MODEL_ERROR",
    "SUBAGENT_TOOLS",
    "ChunkAccumulator",
    "Completion",
    "ModelError",
    "ModelTool",
    "OpenAIChat",
    "SSEDecoder",
    "ToolCall",
    "ToolDispatcher",
    "completion_from_response",
    "history_messages",
    "openai_chat",
    "retry_delay",
    "tool_definition",
]
