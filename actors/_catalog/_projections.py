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

import itertools
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from subagents.protocol import (
    ErrorCode,
    Event,
    InterruptEvent,
    SubagentDescriptorEvent,
    SubagentError,
    TurnEnd,
    TurnStart,
    micros,
    parse_descriptor_payload,
)

__all__ = [
    "Marked",
    "ProjectionRegistry",
    "ProjectionUnit",
    "subagent_timing_unit",
    "subagent_unit",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ProjectionUnit:
    """``initial()`` gives a fresh state; ``step(state, seq, event)`` the next one;
    ``value(state)`` the serialisable projection. ``step`` must never raise, nor
    wait: it runs under the session's watermark lock, and on gevent a step that
    yielded to the hub there would stop the thread for another greenlet listing
    the same session."""

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


#: Watermark generations, unique across registries: a live session's watermark is
#: one registry's fold of its units as they were (two registries, one session: a
#: listing over a registry of its own).
_GENERATIONS = itertools.count(1)


class _Watermark:
    __slots__ = ("generation", "lock", "seq", "states")

    def __init__(self, generation: int, states: dict[str, Any]) -> None:
        self.generation = generation  # the registry's units it folds (see register)
        self.lock = threading.Lock()
        self.seq = -1
        self.states = states


class Marked(Protocol):
    """A live session as :meth:`ProjectionRegistry.snapshot` keeps its watermark on
    it (``LiveSession`` is one)."""

    projection_mark: Any


class ProjectionRegistry:
    """Projection units, and watermark snapshots of live sessions. Thread-safe.

    A session's watermark is kept on its live session (``projection_mark``), so it
    goes with it: a listing that folds a session just leaving the live set leaves
    nothing behind (a registry-wide map kept one per such race, for good).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._units: dict[str, ProjectionUnit] = {}
        self._generation = next(_GENERATIONS)

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
            self._generation = next(_GENERATIONS)  # every watermark folds the units anew

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
        self, live: Marked, read_from: Callable[[int], Iterable[tuple[int, Event]]]
    ) -> tuple[int, dict[str, Any]]:
        """The watermark snapshot of a live session: ``(seq, raw states)``.

        ``live``: the session's live state, which keeps the watermark;
        ``read_from(seq)`` yields the session's ``(seq, event)`` pairs from ``seq``;
        only events past the watermark are folded.
        """
        with self._lock:
            mark = live.projection_mark
            if mark is None or mark.generation != self._generation:
                mark = live.projection_mark = _Watermark(
                    self._generation, {n: u.initial() for n, u in self._units.items()}
                )
        # The read happens outside the watermark's lock: it may wait for the store
        # (a blocking store's read yields to the hub under gevent), and a plain lock
        # held across that wait stops the whole thread when another greenlet of it
        # asks for the same watermark. What another snapshot folded meanwhile is
        # skipped: the records are contiguous from the seq read at.
        with mark.lock:
            start = mark.seq + 1
        records = list(read_from(start))
        with mark.lock:
            seen = mark.seq
            last = self._fold_into(mark.states, (r for r in records if r[0] > seen))
            if last >= 0:
                mark.seq = last
            return mark.seq, dict(mark.states)
