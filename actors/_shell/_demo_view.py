"""What ``subagents demo`` shows: the tree read from the store, drawn with rich,
redrawn while the demo waits (:class:`Show`), and the closing summary table."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text
from rich.tree import Tree
from subagents.actors._runtime import Runtime
from subagents.protocol import (
    MessageEvent,
    ReportEvent,
    SessionHeader,
    SessionId,
    TurnEnd,
    TurnStart,
    try_fold_subagent_descriptor,
)

from ._tree_text import printable

__all__ = ["Show", "headers", "render", "summary"]


@dataclass
class _Node:
    header: SessionHeader
    mode: str
    state: str
    turns: int
    messages: int
    active: float


def _inspect(rt: Runtime, header: SessionHeader) -> _Node:
    events = [r.event for r in rt.sessions.read(header.id)]
    fold = try_fold_subagent_descriptor(events)
    mode = (
        fold.descriptor.mode
        if fold.descriptor is not None
        else ("top-level" if header.parent_session is None else "?")
    )
    turns = [e for e in events if isinstance(e, TurnStart)]
    ends = [e for e in events if isinstance(e, TurnEnd)]
    active = 0.0
    starts = {e.turn: e.at for e in turns}
    for end in ends:
        if end.turn in starts:
            active += (end.at - starts[end.turn]).total_seconds()
    agent = rt.agents.get(header.id)
    act = rt.continuation.activation(header.id)
    if agent is not None and not agent.idle:
        state = "running"
    elif act is not None and act.owned:
        state = "waiting"
    elif agent is not None:
        state = "idle"
    elif ends and ends[-1].stop_reason == "cancelled":
        state = "cancelled"
    elif mode == "one-shot" and ends:
        state = "ended"  # as `subagents tree` says: it takes no more work
    else:
        state = "settled"
    messages = sum(isinstance(e, (MessageEvent, ReportEvent)) for e in events)
    return _Node(header, mode, state, len(turns), messages, active)


_STYLE = {
    "running": "bold green",
    "waiting": "yellow",
    "idle": "cyan",
    "settled": "dim",
    "ended": "dim",
    "cancelled": "red",
}


ROOT_LABEL = "demo-root"
SIDE_LABEL = "side-project"
#: The demo root's session id: the same in every run (a get-or-create).
ROOT_ID = SessionId(hashlib.blake2b(b"subagents demo root", digest_size=16).hexdigest())


def side_projects(found: list[SessionHeader]) -> set[SessionId]:
    """The demo's side projects: top-level, labelled so, with only sketches below."""
    sides = {h.id for h in found if h.parent_session is None and h.label == SIDE_LABEL}
    for h in found:
        if h.parent_session in sides and not (h.label or "").startswith("sketch-"):
            sides.discard(h.parent_session)
    return sides


def headers(rt: Runtime) -> list[SessionHeader]:
    """The demo's sessions, by ``(created_at, id)``: its root's tree and its side
    projects' -- not whatever else the store holds (``--db`` names a file in use)."""
    rt.sessions.flush()
    found: dict[SessionId, SessionHeader] = {}
    if rt.store is not None:
        for h in rt.store.all_headers():
            found[h.id] = h
    for sid in rt.sessions.live_ids():
        live = rt.sessions.live(sid)
        if live is not None:
            found[sid] = live.header
    every = sorted(found.values(), key=lambda h: (h.created_at, h.id))
    family = {ROOT_ID} | side_projects(every)
    for h in sorted(every, key=lambda h: h.delegation_depth):
        if h.parent_session in family:
            family.add(h.id)
    return [h for h in every if h.id in family]


def render(rt: Runtime, status: str) -> tuple[Group, list[_Node]]:
    found = headers(rt)
    nodes = {h.id: _inspect(rt, h) for h in found}
    tree = Tree(Text("agent tree", style="bold"))
    branches: dict[SessionId, Tree] = {}
    for h in found:
        node = nodes[h.id]
        label = Text.assemble(
            (printable(h.label or "(unlabelled)"), "bold"),
            f"  {node.mode}  ",
            (node.state, _STYLE.get(node.state, "")),
            f"  turns {node.turns}  active {node.active * 1000:.1f} ms",
        )
        parent = branches.get(h.parent_session) if h.parent_session is not None else None
        branches[h.id] = (parent or tree).add(label)
    total_turns = sum(n.turns for n in nodes.values())
    total_msgs = sum(n.messages for n in nodes.values())
    progress = Text(f"{status} | agents {len(nodes)} | turns {total_turns} | messages {total_msgs}")
    return Group(tree, progress), list(nodes.values())


def summary(nodes: list[_Node]) -> Table:
    table = Table(title="summary")
    for col in ("agent", "mode", "state", "turns", "messages", "active ms"):
        table.add_column(col)
    for n in nodes:
        table.add_row(
            printable(n.header.label or "-"),
            n.mode,
            n.state,
            str(n.turns),
            str(n.messages),
            f"{n.active * 1000:.1f}",
        )
    return table


class Show:
    def __init__(self, rt: Runtime, console: Console) -> None:
        self.rt = rt
        self.console = console
        self.live = Live(console=console, auto_refresh=False, transient=False)
        self.status = "starting"

    def step(self, status: str) -> None:
        self.status = status
        if self.console.is_terminal:
            self.live.update(render(self.rt, status)[0], refresh=True)
        else:
            self.console.print(f"- {status}")

    def wait(self, predicate: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() > deadline:
                raise TimeoutError(f"demo: {what} did not happen within {timeout} s")
            self.rt.backend.sleep(0.02)
            if self.console.is_terminal:
                self.live.update(render(self.rt, self.status)[0], refresh=True)
