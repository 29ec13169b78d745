"""The soak worker's operations: its model, its calls (retried with the same id)
and the random mix of operations one runtime runs.

Imported by ``worker.py`` after gevent's monkey-patching (when asked for), so
nothing here is imported at module level that patching must come before.
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from _soaklib import Recorder, read_jsonl
from subagents.actors import ContinuableStartSpec, Runtime, UserAuthority
from subagents.protocol import SessionId, SubagentError

# Codes a call is retried on, with the same id (and any error whose hint says in doubt).
RETRY = {"PERSISTENCE_UNAVAILABLE", "TIMEOUT", "LEASE_HELD", "SESSION_EXISTS", "INBOX_FULL"}


def _knob(name: str, default: str) -> float:
    return float(os.environ.get(name, default))


@dataclass
class Knobs:
    """The environment knobs (README.md): chances per message, call or turn."""

    max_roots: int = int(_knob("SOAK_MAX_ROOTS", "4"))
    kill_in_call: float = _knob("SOAK_KILL_IN_CALL", "0.01")
    die: float = _knob("SOAK_DIE", "0.01")
    report: float = _knob("SOAK_REPORT", "0.5")
    grand: float = _knob("SOAK_GRAND", "0.3")
    report_die: float = _knob("SOAK_REPORT_DIE", "0.01")
    steer: float = _knob("SOAK_STEER", "0.15")


Call = Callable[[Any, Any], Any]


class Soak:
    """One worker process's state: its randomness, recorder and run directory."""

    def __init__(self, run_dir: str, proc: str, rnd: random.Random, rec: Recorder) -> None:
        self.dir = run_dir
        self.proc = proc
        self.pid = os.getpid()
        self.rnd = rnd
        self.rec = rec
        self.knobs = Knobs()
        self.topo_fd = Recorder.open_append(os.path.join(run_dir, "topo.jsonl"))
        self.seqs: dict[str, int] = {}

    def die(self, sid: str, mids: list[str]) -> None:
        """SIGKILL this process (a crash at a chosen point), recorded first."""
        self.rec("die", sid=sid, mids=mids)
        os.kill(self.pid, signal.SIGKILL)

    # -- the model ------------------------------------------------------------

    def register_model(self, rt: Runtime) -> None:
        """Model ``soak``: records a turn's start, steer take and end; may sleep
        (the message's ``delay``), die at a turn's start or end (first run only),
        and report to its parent."""

        def factory(_options: Any) -> Any:
            def on_turn(turn: Any) -> Any:
                mids = [str(m.message_id) for m in turn.messages]
                sid = str(turn.agent.session_id)
                c = turn.content if isinstance(turn.content, dict) else {}
                self.rec(
                    "start",
                    sid=sid,
                    mids=mids,
                    red=bool(turn.redelivered),
                    turn=turn.index,
                    contents=[m.content for m in turn.messages],
                )
                if c.get("die") == "start" and not turn.redelivered:
                    self.die(sid, mids)
                delay = float(c.get("delay", 0.0))
                if delay:
                    turn.signal.wait(delay)
                if self.rnd.random() < 0.5:
                    took = turn.steering()
                    if took:
                        self.rec(
                            "took", sid=sid, mids=[str(m.message_id) for m in took], turn=turn.index
                        )
                self.rec(
                    "end", sid=sid, mids=mids, cancelled=bool(turn.signal.aborted), turn=turn.index
                )
                parent = turn.agent.parent_session
                reporting = parent is not None and mids and not turn.signal.aborted
                if reporting and self.rnd.random() < self.knobs.report:
                    self.reports(rt, turn, str(parent), sid, mids)
                if c.get("die") == "end" and not turn.redelivered:
                    self.die(sid, mids)
                return {"ran": mids}

            return on_turn

        rt.models.register("soak", factory, replace=True)

    def reports(self, rt: Runtime, turn: Any, parent: str, sid: str, mids: list[str]) -> None:
        """Several reports in a row, waking and quiet, with ids derived from the
        turn's first message (a replayed turn makes the same ones); a kill may fall
        between them."""
        for i in range(self.rnd.randint(1, 4)):
            rmid = hashlib.md5((mids[0] + "r" + str(i)).encode()).hexdigest()
            how = "quiet" if int(rmid[0], 16) < 5 else "waking"  # the same in a replay
            rc = {"report": mids[0], "i": i, "from": self.proc, "child": sid}
            by_id = self.rnd.random() < 0.3  # by the child's id instead of its Agent
            self.rec(
                "try",
                op="report",
                target=parent,
                mid=rmid,
                content=rc,
                attempt=0,
                child=sid,
                delivery=how,
            )
            try:
                if by_id:
                    got = rt.subagents.report_from(
                        SessionId(sid), rc, delivery=how, message_id=rmid
                    )
                else:
                    got = turn.subagents.report(rc, delivery=how, message_id=rmid)
                self.rec(
                    "ok",
                    th="report",
                    op="report",
                    target=parent,
                    mid=str(got),
                    asked=rmid,
                    content=rc,
                    child=sid,
                    delivery=how,
                )
            except SubagentError as exc:
                hint = exc.hint if isinstance(exc.hint, dict) else {}
                self.rec(
                    "err",
                    op="report",
                    target=parent,
                    mid=rmid,
                    content=rc,
                    code=exc.code,
                    hint=hint,
                    msg=str(exc)[:300],
                    child=sid,
                    delivery=how,
                )
            if self.rnd.random() < self.knobs.report_die and not turn.redelivered:
                self.die(sid, mids)

    # -- calls ------------------------------------------------------------------

    def content_for(self, target: str) -> dict[str, Any]:
        """A message: its sender, a per-target sequence number, a delay, maybe a die."""
        self.seqs[target] = self.seqs.get(target, 0) + 1
        d: dict[str, Any] = {
            "from": self.proc,
            "seq": self.seqs[target],
            "delay": self.rnd.choice([0, 0, 0, 0.01, 0.05, 0.2]),
        }
        r = self.rnd.random()
        if r < self.knobs.die:
            d["die"] = "start"
        elif r < 2 * self.knobs.die:
            d["die"] = "end"
        return d

    def deliver(
        self,
        kind: str,
        target: str,
        call: Call,
        explicit: bool,
        parent: str | None = None,
        again: tuple[str, Any] | None = None,
    ) -> None:
        """``call(mid or None, content)`` returns the id; retried with the same id
        (an implicit one: the id the error's hint names) on RETRY codes or in doubt.
        ``again``: a dead predecessor's call, made again with its id and content."""
        mid: str | None
        if again is not None:
            mid, content = again
        else:
            content = self.content_for(target)
            mid = uuid.uuid4().hex if explicit else None
        if self.rnd.random() < self.knobs.kill_in_call:
            killer = threading.Timer(self.rnd.uniform(0, 0.02), os.kill, (self.pid, signal.SIGKILL))
            killer.start()
        for attempt in range(6):
            self.rec(
                "try",
                op=kind,
                target=target,
                parent=parent,
                mid=mid,
                content=content,
                attempt=attempt,
            )
            try:
                got = call(mid, content)
            except SubagentError as exc:
                hint = exc.hint if isinstance(exc.hint, dict) else {}
                if mid is None and hint.get("message_id"):
                    mid = str(hint["message_id"])
                self.rec(
                    "err",
                    op=kind,
                    target=target,
                    parent=parent,
                    mid=mid,
                    content=content,
                    code=exc.code,
                    hint=hint,
                    msg=str(exc)[:300],
                )
                if exc.code in RETRY or hint.get("in_doubt"):
                    if mid is None:
                        return
                    time.sleep(self.rnd.uniform(0.01, 0.2))
                    continue
                return
            if kind == "start":
                ret, gmid, outcome = got[0], got[1], None
            elif hasattr(got, "outcome"):
                ret, gmid, outcome = got.message_id, got.message_id, got.outcome
            else:
                ret, gmid, outcome = got, got, None
            self.rec(
                "ok",
                th=threading.current_thread().name,
                op=kind,
                target=target if kind != "start" else str(ret),
                parent=parent,
                mid=str(gmid),
                asked=mid,
                content=content,
                outcome=outcome,
            )
            if kind == "start":
                self.rec("child", fd=self.topo_fd, parent=parent, sid=str(ret))
            return

    def start_call(self, rt: Runtime, parent: Any) -> Call:
        """A continuable start below ``parent`` (a live Agent or a SessionId)."""

        def call(mid: Any, content: Any) -> Any:
            spec = ContinuableStartSpec(
                parent=parent,
                provider="local",
                prompt=content,
                label="kid",
                model="soak",
                message_id=mid,
            )
            return rt.subagents.start_continuable(spec)

        return call

    # -- the mix -----------------------------------------------------------------

    def topo(self) -> tuple[list[str], list[tuple[str, str]]]:
        """Every worker's roots and (parent, child) pairs so far."""
        roots: list[str] = []
        kids: list[tuple[str, str]] = []
        for d in read_jsonl(os.path.join(self.dir, "topo.jsonl")):
            if d["k"] == "root":
                roots.append(d["sid"])
            elif d["k"] == "child":
                kids.append((d["parent"], d["sid"]))
        return roots, kids

    def op(self, rt: Runtime) -> None:
        """One random operation on the shared tree."""
        rnd, rec = self.rnd, self.rec
        roots, kids = self.topo()
        r = rnd.random()
        if r < 0.05 and len(roots) > self.knobs.max_roots:
            r = 0.3
        if r < 0.05 or not roots:
            a = rt.spawn("soak", label=f"r-{self.proc}")
            rec("root", fd=self.topo_fd, sid=str(a.session_id))
            rec("spawned", sid=str(a.session_id))
        elif r < 0.15:
            parent = rnd.choice(roots)
            if kids and rnd.random() < self.knobs.grand:  # below a child: a continuable parent
                parent = rnd.choice(kids)[1]
            live = rt.agents.get(parent)
            par: Any = live if (live is not None and rnd.random() < 0.5) else SessionId(parent)
            self.deliver("start", "?", self.start_call(rt, par), explicit=True, parent=parent)
        elif r < 0.40:
            target = rnd.choice(roots)
            self.deliver(
                "send",
                target,
                lambda m, c: rt.agents.send(target, c, message_id=m),
                rnd.random() < 0.6,
            )
        elif r < 0.75 and kids:
            parent, child = rnd.choice(kids)
            steer: Any = rnd.random() < self.knobs.steer  # a bool: either overload

            def followup(m: Any, c: Any) -> Any:
                return rt.subagents.followup(parent, child, c, message_id=m, steer=steer)

            self.deliver("followup", child, followup, rnd.random() < 0.6, parent=parent)
        elif r < 0.80 and kids:
            parent, child = rnd.choice(kids)
            try:
                rt.subagents.interrupt(child, UserAuthority(parent))
                rec("interrupt", sid=child)
            except SubagentError as exc:
                rec("interrupt_err", sid=child, code=exc.code)
        elif r < 0.83:
            self.drain(rt, rnd.choice(roots))
        elif r < 0.88:
            target = rnd.choice(roots)
            try:
                rt.agents.resume(target)
                rec("resume", sid=target)
            except SubagentError as exc:
                rec("resume_err", sid=target, code=exc.code)
        elif r < 0.91:
            live_roots = [a for a in rt.agents.list() if a.parent_session is None]
            if live_roots:
                a = rnd.choice(live_roots)
                a.dispose(timeout=20)
                rec("dispose", sid=str(a.session_id))
        elif r < 0.95:
            rt.wait_idle(5)
        else:
            time.sleep(rnd.uniform(0, 0.1))

    def drain(self, rt: Runtime, target: str) -> None:
        """Drain a root's continuable descendants, if the root is live here."""
        live = rt.agents.get(target)
        if live is None:
            return
        try:
            rt.subagents.drain_continuable_descendants([live], timeout=20)
            self.rec("drain", sid=target)
        except SubagentError as exc:
            self.rec("drain_err", sid=target, code=exc.code)

    def ops(self, rt: Runtime, stop: str, n: int) -> None:
        """Up to ``n`` operations, until the stop file appears."""
        for _ in range(n):
            if os.path.exists(stop):
                return
            try:
                self.op(rt)
            except SubagentError as exc:
                self.rec("op_err", code=exc.code, msg=str(exc)[:300])
