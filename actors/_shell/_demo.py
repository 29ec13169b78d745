"""``subagents demo``: an agent tree on the embedded SQLite store, offline and deterministic.

The first run builds a tree of three levels below a root agent -- continuable
researchers (``local``) and a writer (``fork``), one-shot summarizers and
lookups, a continuable fact-checker -- then follows up, receives quiet and waking
reports, interrupts one child and drains a side project. A second run on the same
database resumes: the root is resumed from its session and its persisted
children cold-resume when it follows up with them.

The root has one well-known session id, so runs started at once on one new
file build one tree: one creates the root, the others find it, wait for the
lease of the run that holds it, and resume it.

Every turn is scripted -- unless ``--model`` names a model to drive the tree
(:mod:`._demo_model`): no model is called, nothing sleeps to order things
(blocking points are :class:`~subagents.actors.testing.Gate` objects released by
the demo itself).
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from subagents.actors._agents import Turn
from subagents.actors._children import ContinuableStartSpec, UserAuthority
from subagents.actors._kernel import Gate
from subagents.actors._runtime import Runtime
from subagents.protocol import (
    ErrorCode,
    MessageEvent,
    SessionId,
    SubagentError,
    try_fold_subagent_descriptor,
)
from subagents.store import redacted_url

from ._defaults import DEFAULT_DB
from ._demo_model import register_models, run_model_first
from ._demo_view import (
    ROOT_ID,
    ROOT_LABEL,
    SIDE_LABEL,
    Show,
    headers,
    render,
    side_projects,
    summary,
)

__all__ = ["run_demo"]


@dataclass
class _Script:
    """The gates and records one demo run shares with its behaviours."""

    slow_started: Gate = field(default_factory=lambda: Gate("researcher-B working"))
    sketches_started: list[Gate] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _lead(turn: Turn) -> Any:
    """The root: plans the tree, then acknowledges reports and follow-ups."""
    if turn.content == "plan":
        subs = turn.subagents
        a = subs.start_continuable(
            "local", "survey actor runtimes", label="researcher-A", model="researcher"
        )
        b = subs.start_continuable(
            "local", "benchmark mailboxes", label="researcher-B", model="slow-researcher"
        )
        w = subs.start_continuable("fork", "draft the report", label="writer", model="writer")
        return {"started": [str(a.child_id), str(b.child_id), str(w.child_id)]}
    context = [str(m.content) for m in turn.context]
    return {"ack": turn.content, "context": context}


def _researcher(turn: Turn) -> Any:
    subs = turn.subagents
    if turn.index == 0:
        summary = subs.delegate(
            "fork",
            f"summarise what is known about: {turn.content}",
            model="summarizer",
            label="summary",
        )
        subs.start_continuable(
            "local", "check the claims", label="fact-checker", model="fact-checker"
        )
        subs.report(f"{turn.agent.label}: collected sources", delivery="quiet")
        return {"summary": summary.output}
    subs.report(f"{turn.agent.label}: finished '{turn.content}'", delivery="waking")
    return f"{turn.agent.label} handled {turn.content!r} with {len(turn.context)} new reports"


def _slow_researcher(script: _Script) -> Callable[[Turn], Any]:
    def behaviour(turn: Turn) -> Any:
        if turn.index == 0:
            script.slow_started.pass_through(turn.signal)  # a long step, until interrupted
        return f"{turn.agent.label} resumed with {turn.content!r}"

    return behaviour


def _fact_checker(turn: Turn) -> Any:
    if turn.index == 0:
        looked = turn.subagents.delegate("local", "look up claim 1", model="lookup", label="lookup")
        turn.subagents.report(f"fact-checker: {looked.output}", delivery="quiet")
        return "checked 3 claims"
    return f"re-checked after {turn.content!r}"


def _writer(turn: Turn) -> Any:
    seen = sum(1 for e in turn.history if isinstance(e, MessageEvent))
    return f"draft v{turn.index + 1}, built on {seen} earlier messages"


def _sketch(script: _Script) -> Callable[[Turn], Any]:
    def behaviour(turn: Turn) -> Any:
        gate = Gate(f"sketch {turn.agent.label}")
        script.sketches_started.append(gate)
        gate.pass_through(turn.signal)  # drained before release
        return "sketched"

    return behaviour


def _register(rt: Runtime, script: _Script) -> None:
    rt.models.register("lead", lambda _o: _lead)
    rt.models.register("researcher", lambda _o: _researcher)
    rt.models.register("slow-researcher", lambda _o: _slow_researcher(script))
    rt.models.register("fact-checker", lambda _o: _fact_checker)
    rt.models.register("summarizer", lambda _o: lambda t: f"summary of {t.content!r}")
    rt.models.register("lookup", lambda _o: lambda t: "claim 1 holds")
    rt.models.register("writer", lambda _o: _writer)
    rt.models.register("sketch", lambda _o: _sketch(script))


# -- the live view --------------------------------------------------------------------


def _quiet(rt: Runtime) -> bool:
    """Every live agent idle (waiting Activations are idle agents that own children)."""
    return all(a.idle for a in rt.agents.list())


def _first_run(rt: Runtime, root: Any, script: _Script, show: Show) -> None:
    show.step("root plans the tree (continuable researchers, a fork writer)")
    root.followup("plan")
    show.wait(lambda: script.slow_started.arrivals > 0, "researcher-B starting")
    show.wait(lambda: len(_children(rt, root.session_id)) >= 3, "three children")
    children = _children(rt, root.session_id)
    show.step("researcher-B is in a long step: the host interrupts it")
    rt.subagents.interrupt(children["researcher-B"], UserAuthority(root.session_id))
    show.wait(lambda: _quiet(rt), "the first wave to finish")
    show.step("root follows up researcher-A and the writer")
    for label in ("researcher-A", "writer"):
        rt.subagents.followup(root, children[label], f"go deeper ({label})")
    show.wait(lambda: _quiet(rt), "the follow-ups")
    show.step("a side project starts three sketches, then the host drains it")
    side = rt.spawn("echo", label=SIDE_LABEL)
    for i in range(3):
        rt.subagents.start_continuable(
            ContinuableStartSpec(
                parent=side,
                provider="local",
                prompt=f"idea {i}",
                label=f"sketch-{i}",
                model="sketch",
            )
        )
    show.wait(lambda: len(script.sketches_started) >= 3, "the sketches to start")
    rt.subagents.drain_continuable_descendants([side])
    show.wait(lambda: _quiet(rt), "the drain")
    show.step("first run complete")


def _nothing(turn: Turn) -> None:
    """The root while its tree is looked at: it starts nothing."""


def _unfinished_script(rt: Runtime, root_id: SessionId) -> bool:
    """Whether a scripted first run built this tree (the root's first message is
    its ``plan``, or it has none) and stopped before its end: the root's three
    children, and the side project with its three sketches (its last step). A
    tree ``--model`` built is never one."""
    first = next(
        (r.event.content for r in rt.sessions.read(root_id) if isinstance(r.event, MessageEvent)),
        "plan",
    )
    if first != "plan":
        return False
    found = headers(rt)
    below = {h.label for h in found if h.parent_session == root_id}
    sketches = [h for h in found if h.parent_session in side_projects(found)]
    return not ({"researcher-A", "researcher-B", "writer"} <= below and len(sketches) >= 3)


def _answered(rt: Runtime, root_id: SessionId) -> bool:
    """Whether the model's root completed a turn (its task)."""
    return any(e.stop_reason == "completed" for e in rt.sessions.turn_ends(root_id))


def _failure(rt: Runtime, root_id: SessionId) -> str | None:
    """The error of the root's last turn, when it failed (a model not reached)."""
    ends = rt.sessions.turn_ends(root_id)
    if not ends or ends[-1].stop_reason != "failed":
        return None
    return ends[-1].error or "failed"


def _discard(rt: Runtime, root: Any) -> Any:
    """Delete what an unfinished first run built (the root's tree and the side
    projects'), deepest first, and make the root again. The caller holds the root
    (nothing of the tree runs: this runtime adopts nothing)."""
    found = sorted(headers(rt), key=lambda h: h.delegation_depth)
    doomed = {root.session_id} | side_projects(found)
    while below := {h.id for h in found if h.parent_session in doomed} - doomed:
        doomed |= below
    for sid in doomed:
        agent = rt.agents.get(sid)  # the root, held by this run
        if agent is not None:
            agent.dispose()
    rt.sessions.flush()  # nothing of theirs is still on its way to the store
    assert rt.store is not None  # a demo tree is in a store
    for h in reversed(found):  # deepest first
        if h.id in doomed:
            rt.store.delete_session(h.id)
    return rt.spawn("lead", label=ROOT_LABEL, session_id=ROOT_ID)


def _children(rt: Runtime, parent: SessionId) -> dict[str, SessionId]:
    return {h.label or "": h.id for h in headers(rt) if h.parent_session == parent}


def _resume_root(rt: Runtime, root_id: SessionId, console: Console, behaviour: Any) -> Any:
    """Resume the root, waiting (up to a minute) while another run holds it."""
    deadline = time.monotonic() + 60
    told = False
    while True:
        try:
            return rt.agents.resume(root_id, behaviour=behaviour)
        except SubagentError as exc:
            if exc.code != ErrorCode.LEASE_HELD or time.monotonic() > deadline:
                raise
            if not told:
                console.print("another demo run holds the tree: waiting for it to finish")
                told = True
            rt.backend.sleep(0.1)


def _second_run(rt: Runtime, root: Any, show: Show, timeout: float = 30.0) -> list[str]:
    said: list[str] = []
    root_id = root.session_id
    show.step(f"resumed the root {ROOT_LABEL} from its session")
    said.append(f"resumed {ROOT_LABEL} ({root_id})")
    for label, cid in _children(rt, root_id).items():
        events = [r.event for r in rt.sessions.read(cid)]
        fold = try_fold_subagent_descriptor(events)
        if fold.descriptor is None or fold.descriptor.mode != "continuable":
            continue
        prior = len(events)
        rt.subagents.followup(root, cid, "welcome back: what changed?")
        said.append(f"cold-resumed {label} from {prior} persisted events and followed up")
        show.step(f"cold-resumed {label} ({prior} prior events)")
    show.wait(lambda: _quiet(rt), "the resumed turns", timeout)
    return said


def run_demo(
    db: str, backend: str, console: Console | None = None, model: str | None = None
) -> int:
    """Run the demo on ``db``; returns a process exit code.

    With ``model`` the agents think through an OpenAI-compatible API (``OPENAI_BASE_URL``,
    ``OPENAI_API_KEY``) instead of following a script (see :mod:`._demo_model`).
    """
    console = console or Console()
    script = _Script()
    shown = redacted_url(db)
    # No adoption: an unfinished tree's children with work waiting would start
    # (and wait on steps no run takes) while this run looks at the tree; a
    # resumed tree's children cold-resume when the root follows them up.
    with Runtime(db, backend=backend, adopt=False) as rt:
        if model is None:
            _register(rt, script)
        else:
            register_models(rt, model)
        # A tree an older demo made has a random root id: found by its label.
        older = [h.id for h in rt.agents.roots() if h.label == ROOT_LABEL and h.id != ROOT_ID]
        root = None
        if not older:
            try:
                root = rt.spawn("lead", label=ROOT_LABEL, session_id=ROOT_ID)
            except SubagentError as exc:
                if exc.code != ErrorCode.SESSION_EXISTS:
                    raise  # resumed below when it exists
        previous = root is None
        show = Show(rt, console)
        said: list[str] = []
        with show.live if console.is_terminal else contextlib.nullcontext():
            if previous:
                root_id = older[-1] if older else ROOT_ID
                lead = _lead if model is None else None  # None: the recorded model
                unfinished = False
                if model is None:
                    # Held first by a root that starts nothing (what it accepted
                    # and never ran is dropped with it): the tree is looked at
                    # while this run holds it and nothing of it runs.
                    idle = _resume_root(rt, root_id, console, _nothing)
                    idle.wait_idle(30.0)
                    unfinished = _unfinished_script(rt, root_id)
                    if unfinished:
                        root = _discard(rt, idle)
                    else:
                        idle.dispose()
                if unfinished:
                    # A first run stopped part way (Ctrl-C, a crash): its children
                    # wait on steps no later run takes. Built again from the root.
                    console.print(
                        f"found an unfinished demo tree in {shown} (its first run"
                        " stopped part way): building it again"
                    )
                    _first_run(rt, root, script, show)
                    previous = False
                else:
                    root = _resume_root(rt, root_id, console, lead)
                    if model is not None and not _answered(rt, root_id):
                        console.print(
                            f"the demo tree in {shown} has no answer yet: {model} goes on"
                        )
                        run_model_first(rt, root, show, _quiet)
                        previous = False
                    else:
                        console.print(f"found a demo tree in {shown}: resuming it")
                        said = _second_run(rt, root, show, 30.0 if model is None else 600.0)
            elif model is not None:
                console.print(f"no demo tree in {shown} yet: {model} builds one")
                run_model_first(rt, root, show, _quiet)
            else:
                console.print(f"no demo tree in {shown} yet: building one")
                _first_run(rt, root, script, show)
            group, nodes = render(rt, "done")
            if console.is_terminal:
                show.live.update(group, refresh=True)
        if not console.is_terminal:
            console.print(group)
        for line in said:
            console.print(line)
        console.print(summary(nodes))
        assert root is not None
        failed = _failure(rt, root.session_id)
        if failed is not None:
            console.print(f"the root's last turn failed: {failed}", markup=False)
            return 1
        mode = "resumed" if previous else "created"
        console.print(f"{mode}: {len(nodes)} sessions in {shown} on the {backend} backend")
        again = demo_command(shown, backend, model)
        if not previous:
            console.print(f"run `{again}` again to resume this tree", markup=False)
        console.print(f"look at it: `subagents tree {shlex.quote(shown)}`", markup=False)
    return 0


def demo_command(db: str, backend: str, model: str | None) -> str:
    """The ``subagents demo`` command line that repeats these options (defaults left out)."""
    words = ["subagents", "demo"]
    if db != DEFAULT_DB:
        words += ["--db", db]
    if backend != "threading":
        words += ["--backend", backend]
    if model is not None:
        words += ["--model", model]
    return shlex.join(words)
