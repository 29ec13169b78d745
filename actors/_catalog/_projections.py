"""Session projections (``runtime.session_projections``): units folded from session events.

A *unit* folds a session's events into a small serialisable value. The registry
keeps, per live session, a watermark snapshot -- the folded state of every unit and
the seq it was folded through -- and folds only the new events on each read. For a
cold session, :meth:`ProjectionRegistry.fold` folds a loaded log from scratch.

Two units ship, registered by the runtime:

* ``subagent`` -- the durable identity ``{"mode", "label"}`` from
  ``subagent/descriptor`` events, last wins; a malformed or unknown-version
  descriptor folds to ``None`` (indistinguishable from no descriptor, and it
  replaces an earlier identity). Never raises.
* ``subagent_timing`` -- resets at each descriptor (so a fork seed's ancestor
  turns never count; a turn open at the descriptor, the one a one-shot child
  appends its descriptor in, stays open and counts), sums ``turn/start`` ->
  ``turn/end`` active time, and keeps
  ``active.since``/``active.through`` for an open turn, ``through`` following the
  latest folded event that carries a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from subagents.protocol import (
    ErrorCode,
    Event,
    InterruptEvent,
    SessionId,
    SubagentDescriptorEvent,
    SubagentError,
    TurnEnd,
    TurnStart,
    micros,
    parse_descriptor_payload,
)

__all__ = ["ProjectionRegistry", "ProjectionUnit", "subagent_timing_unit", "subagent_unit"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProjectionUnit:
    """``initial()`` gives a fresh state; ``step(state, seq, event)`` the next one;
    ``value(state)`` the serialisable projection. ``step`` must never raise."""

    name: str
    initial: Callable[[], Any]
    step: Callable[[Any, int, Event], Any]
    value: Callable[[Any], Any]


# -- subagent -------------------------------------------------------------------------


def _identity_step(state: Any, seq: int, event: Event) -> Any:
    if not isinstance(event, SubagentDescriptorEvent):
        return state
    try:
        descriptor = parse_descriptor_payload(event.payload)
    except Exception:  # malformed or unsupported: the null sentinel, last wins
        return None
    return {"mode": descriptor.mode, "label": descriptor.label, "seq": seq}


def _identity_value(state: Any) -> Any:
    return None if state is None else {"mode": state["mode"], "label": state["label"]}


subagent_unit = ProjectionUnit(
    name="subagent", initial=lambda: None, step=_identity_step, value=_identity_value
)


# -- subagent_timing -----------------------------------------------------------------


def _timing_initial() -> dict[str, Any]:
    return {"active_us": 0, "since": None, "through": None}


def _timing_step(state: dict[str, Any], seq: int, event: Event) -> dict[str, Any]:
    if isinstance(event, SubagentDescriptorEvent):
        # The total resets (a fork seed's turns never count). A turn open at the
        # descriptor is the child's own -- a one-shot child appends its descriptor
        # inside its initial turn, and a seed holds only completed turns -- so it
        # stays open and counts when it ends.
        return {**_timing_initial(), "since": state["since"], "through": state["through"]}
    if isinstance(event, TurnStart):
        return {**state, "since": event.at, "through": event.at}
    if isinstance(event, TurnEnd):
        since = state["since"]
        if since is None:
            return state
        spent = max(0, micros(event.at - since))
        return {"active_us": state["active_us"] + spent, "since": None, "through": None}
    if state["since"] is not None and isinstance(event, InterruptEvent):
        return {**state, "through": max(state["through"], event.at)}
    return state


def _timing_value(state: dict[str, Any]) -> dict[str, Any]:
    active = None
    if state["since"] is not None:
        active = {"since": state["since"].isoformat(), "through": state["through"].isoformat()}
    return {"active_seconds": state["active_us"] / 1e6, "active": active}


subagent_timing_unit = ProjectionUnit(
    name="subagent_timing", initial=_timing_initial, step=_timing_step, value=_timing_value
)


# -- registry -------------------------------------------------------------------------


class _Watermark:
    __slots__ = ("lock", "seq", "states")

    def __init__(self, states: dict[str, Any]) -> None:
        self.lock = threading.Lock()
        self.seq = -1
        self.states = states


class ProjectionRegistry:
    """Projection units and per-live-session watermark snapshots. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._units: dict[str, ProjectionUnit] = {}
        self._marks: dict[SessionId, _Watermark] = {}

    def register(self, unit: ProjectionUnit) -> None:
        """Add a unit (``INVALID_ARGUMENT`` for a duplicate name)."""
        if not isinstance(unit, ProjectionUnit):
            raise SubagentError("register takes a ProjectionUnit", code=ErrorCode.INVALID_ARGUMENT)
        with self._lock:
            if unit.name in self._units:
                raise SubagentError(
                    f"projection unit {unit.name!r} exists", code=ErrorCode.INVALID_ARGUMENT
                )
            self._units[unit.name] = unit
            self._marks.clear()

    def units(self) -> list[str]:
        """The registered unit names, in registration order."""
        return list(self._units)

    def __contains__(self, name: object) -> bool:
        return name in self._units

    def _fold_into(self, states: dict[str, Any], records: Iterable[tuple[int, Event]]) -> int:
        last = -1
        units = list(self._units.values())
        for seq, event in records:
            for unit in units:
                try:
                    states[unit.name] = unit.step(states[unit.name], seq, event)
                except Exception:  # a unit must not break listing: its state resets
                    states[unit.name] = unit.initial()
            last = seq
        return last

    def fold(self, records: Iterable[tuple[int, Event]]) -> dict[str, Any]:
        """Fold a whole log (``(seq, event)`` pairs) from scratch; the raw states."""
        states = {name: unit.initial() for name, unit in self._units.items()}
        self._fold_into(states, records)
        return states

    def values(self, states: Mapping[str, Any]) -> dict[str, Any]:
        """The serialisable projection of each unit."""
        return {
            name: unit.value(states[name]) for name, unit in self._units.items() if name in states
        }

    def snapshot(
        self, session_id: SessionId, read_from: Callable[[int], Iterable[tuple[int, Event]]]
    ) -> tuple[int, dict[str, Any]]:
        """The watermark snapshot of a live session: ``(seq, raw states)``.

        ``read_from(seq)`` yields the session's ``(seq, event)`` pairs from ``seq``;
        only events past the watermark are folded.
        """
        with self._lock:
            mark = self._marks.get(session_id)
            if mark is None:
                mark = self._marks[session_id] = _Watermark(
                    {n: u.initial() for n, u in self._units.items()}
                )
        with mark.lock:
            last = self._fold_into(mark.states, read_from(mark.seq + 1))
            if last >= 0:
                mark.seq = last
            return mark.seq, dict(mark.states)

    def forget(self, session_id: SessionId) -> None:
        """Drop a session's watermark (it left the live set)."""
        with self._lock:
            self._marks.pop(session_id, None)
