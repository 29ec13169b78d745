"""The delegation-depth vocabulary shared by providers and consumers.

A top-level agent has depth 0; a delegated child has its parent's depth + 1. The
child's persisted ``SessionHeader.delegation_depth`` is authoritative and
monotone: an agent's ``subagent_depth`` option may raise its effective depth but
never lower it below the header, so a resumed child is never counted as top-level.

``max_depth`` on a one-shot request counts levels *below the requesting parent*:
``max_depth=1`` lets the child exist but not delegate, ``max_depth=2`` lets it
delegate once more, and so on. The absolute cap is therefore
``parent_depth + max_depth``; :func:`assert_subagent_max_depth` refuses a new child
whose depth would exceed the cap.
"""

from __future__ import annotations

from typing import Final, Protocol

from ._errors import ErrorCode, SubagentError

__all__ = [
    "SUBAGENT_DEPTH_OPTION",
    "DepthBearing",
    "assert_subagent_max_depth",
    "delegation_depth_of",
    "resolve_delegation_depth",
]

#: Name of the agent option that declares a (minimum) delegation depth.
SUBAGENT_DEPTH_OPTION: Final = "subagent_depth"


class DepthBearing(Protocol):
    """What :func:`delegation_depth_of` reads from an agent."""

    @property
    def header_delegation_depth(self) -> int:
        """The delegation depth recorded in the session's header."""

    @property
    def subagent_depth(self) -> int | None:
        """The agent's own subagent depth limit, or ``None``."""


def resolve_delegation_depth(header_depth: int, option_depth: int | None) -> int:
    """Effective depth: the persisted floor, raised (never lowered) by the option."""
    if option_depth is None:
        return header_depth
    return max(header_depth, option_depth)


def delegation_depth_of(agent: DepthBearing) -> int:
    """The effective delegation depth of ``agent`` (0 for top-level agents)."""
    return resolve_delegation_depth(agent.header_delegation_depth, agent.subagent_depth)


def assert_subagent_max_depth(child_depth: int, depth_cap: int | None) -> None:
    """Refuse a child whose depth would exceed ``depth_cap`` (absolute; None = no cap).

    Raises:
        SubagentError: code ``DEPTH_EXCEEDED``.
    """
    if depth_cap is not None and child_depth > depth_cap:
        raise SubagentError(
            f"delegation depth {child_depth} exceeds the cap of {depth_cap}",
            code=ErrorCode.DEPTH_EXCEEDED,
            hint={"depth": child_depth, "cap": depth_cap},
        )
