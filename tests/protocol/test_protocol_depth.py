"""The delegation-depth vocabulary (R-DEPTH-1, R-DEPTH-2, R-DEPTH-3, R-DEPTH-4).

Counting: a top-level agent has depth 0 and a delegated child its parent's depth
plus one. ``max_depth`` on a request counts levels below the requesting parent, so
the absolute cap handed to :func:`assert_subagent_max_depth` is
``parent_depth + max_depth``, and a child *at* the cap is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st
from subagents.protocol import (
    SUBAGENT_DEPTH_OPTION,
    DepthBearing,
    ErrorCode,
    SubagentError,
    assert_subagent_max_depth,
    delegation_depth_of,
    resolve_delegation_depth,
)

depths = st.integers(min_value=0, max_value=10_000)


@dataclass(frozen=True)
class StandIn:
    """The smallest thing that satisfies ``DepthBearing``: two read-only attributes."""

    header_delegation_depth: int
    subagent_depth: int | None = None


def _depth(agent: DepthBearing) -> int:  # mypy checks StandIn against the protocol here
    return delegation_depth_of(agent)


def test_the_option_name_is_the_documented_one() -> None:
    """R-DEPTH-1: one option name shared by providers and consumers."""
    assert SUBAGENT_DEPTH_OPTION == "subagent_depth"


def test_top_level_agent_has_depth_zero() -> None:
    """R-DEPTH-1: a top-level agent (header depth 0, no option) is at depth 0."""
    assert _depth(StandIn(header_delegation_depth=0)) == 0


def test_child_depth_is_parent_plus_one_through_the_header() -> None:
    """R-DEPTH-1: a child's header records parent depth + 1, which is its depth."""
    parent = StandIn(header_delegation_depth=2)
    child = StandIn(header_delegation_depth=_depth(parent) + 1)
    assert _depth(child) == 3


@pytest.mark.parametrize(
    ("header", "option", "expected"),
    [
        (0, None, 0),
        (3, None, 3),
        (3, 0, 3),  # a lower option never lowers the floor
        (3, 2, 3),
        (3, 3, 3),
        (3, 4, 4),  # a higher option raises it
        (0, 5, 5),
    ],
)
def test_option_raises_never_lowers(header: int, option: int | None, expected: int) -> None:
    """R-DEPTH-2: the persisted header depth is a floor the option can only raise."""
    assert resolve_delegation_depth(header, option) == expected
    assert _depth(StandIn(header_delegation_depth=header, subagent_depth=option)) == expected


@given(header=depths, option=st.none() | depths)
def test_resolved_depth_is_monotone(header: int, option: int | None) -> None:
    """R-DEPTH-2: never below the header, never below the option, equal to one of them."""
    resolved = resolve_delegation_depth(header, option)
    assert resolved >= header
    if option is not None:
        assert resolved >= option
    assert resolved in {header, option}


def test_a_resumed_child_is_not_counted_as_top_level() -> None:
    """R-DEPTH-3: rebuilt from its header alone (no option), a child keeps its depth."""
    resumed = StandIn(header_delegation_depth=2, subagent_depth=None)
    assert _depth(resumed) == 2
    reset_attempt = StandIn(header_delegation_depth=2, subagent_depth=0)
    assert _depth(reset_attempt) == 2


@pytest.mark.parametrize(("child", "cap"), [(0, 0), (1, 1), (3, 3), (1, 5), (7, None), (0, None)])
def test_within_the_cap_returns_quietly(child: int, cap: int | None) -> None:
    """R-DEPTH-4: a child at the cap (or below it, or with no cap) is allowed."""
    assert_subagent_max_depth(child, cap)


@pytest.mark.parametrize(("child", "cap"), [(1, 0), (2, 1), (4, 3), (100, 5)])
def test_one_over_the_cap_raises_depth_exceeded(child: int, cap: int) -> None:
    """R-DEPTH-4: the first depth past the cap raises SubagentError(DEPTH_EXCEEDED)."""
    with pytest.raises(SubagentError) as info:
        assert_subagent_max_depth(child, cap)
    assert info.value.code == ErrorCode.DEPTH_EXCEEDED == "DEPTH_EXCEEDED"
    assert info.value.hint == {"depth": child, "cap": cap}


@given(parent=depths, max_depth=st.integers(min_value=1, max_value=50), extra=depths)
def test_max_depth_counts_levels_below_the_parent(parent: int, max_depth: int, extra: int) -> None:
    """R-DEPTH-4: with cap = parent + max_depth, exactly max_depth levels fit below."""
    cap = parent + max_depth
    for level in range(1, max_depth + 1):
        assert_subagent_max_depth(parent + level, cap)
    with pytest.raises(SubagentError):
        assert_subagent_max_depth(parent + max_depth + 1 + extra, cap)
