"""Mail pickup: messages other processes accepted for the sessions this runtime holds.

A process that does not hold a session's lease delivers a message to it by
committing it to the session's durable inbox, taken by nobody, and ringing the
holder's :class:`~subagents.actors._kernel.Doorbell` with the session's id.
The holder's :class:`Mailman` -- one task, blocked on the doorbell -- wakes and,
for each rung session that is live here, asks the agent to pick its mail up *in
its own loop* (after what it accepted already): read the messages nobody took,
take them by compare-and-swap (so a message this process also routed to the
agent runs once, whoever takes it first) and queue them, in acceptance order.

A write whose connection was lost may have committed all the same (its answer
lost): a hand-over (the messages stay taken by this activation, which never
queued them) -- the pickup's own, or one a follow-up's take-ahead could not
settle at once (``SessionService.doubts``, see :mod:`._doubts`) -- or one of the
agent's own acceptances (``Agent._doubt``). The pickup
settles such messages in the agent's loop, once the store answers -- at once, and
then at each sweep: after the session's writes so far are in (a turn that ran
one of them has marked it done), those the store holds taken by this activation
are queued, in acceptance order with the rest; the others were not committed.

Rings are hints. A second after the task starts (``FIRST_SWEEP``), and then every
``period`` seconds (a third of the lease ttl), rung or not, the mailman sweeps:
it asks the store which of its sessions have untaken messages, and which
sessions have accepted work and no lease at all (their holder released them with
messages waiting, or died and its lease expired) or the lease of a holder of this
host whose process ended, or of a holder whose presence the store finds ended
(SQLite: its lock on a file beside the database is free, from whatever PID
namespace), or of a holder of any host its store found unheard for a grace
period (a sweep is made as that grace ends; :mod:`._sweep_reads`). A
ring for a session that is not live here -- its holder released it meanwhile, or
another process rang about a child of a parent that lives here -- and every such
orphan go to ``orphan``,
which makes somebody activate it (see the runtime): accepted work runs as long
as some process on the store can run it. The first sweep does not wait a period:
a worker restarted in the place of one that was killed takes its work up a
second after it opened (the second is the opener's, to register its models and
resume its own sessions first). What a sweep could not activate for want of a
model or provider registered later is looked at again as soon as one is
registered (:meth:`Mailman.sweep_soon`), not a period later.

A ring may also carry an *interrupt* (:func:`interrupt_ring`): another process
asked to interrupt a child this runtime runs, by its parent's address. It is
handed to ``interrupt(child, parent, asked_at)``, which decides as an interrupt
asked here would, for the turn that was running when it was asked -- or a
*drain* (``drain=True``): a process draining the descendants of a parent it runs
asks the holder of one of them to drain it here (its turn cut, what waits
dropped, its forest here drained, each released once idle). Its payload is
never a multiple of 16 bytes, so a ring of session ids is never read as one
(and a process of an earlier version reads the two ids in it as rings: a
harmless look at their mail; it skips a kind it does not know).
"""

from __future__ import annotations

import contextlib
import logging
import struct
import time
from collections.abc import Callable
from typing import Any, Final

from subagents.actors._kernel import (
    Backend,
    Doorbell,
    TaskHandle,
    abandon_if_forked,
    fork_generation,
    ring,
)
from subagents.protocol import ErrorCode, MessageId, SessionId, SubagentError

from ._agent import Agent
from ._ahead import stand_back
from ._resume import replay
from ._sessions import SessionService
from ._write_faults import unsure

__all__ = ["Mailman", "interrupt_ring"]

logger = logging.getLogger("subagents")

_ID = 16  # bytes of a session id in a ring
#: An interrupt ring: ``b"I"`` (asked by the child's parent's address) or ``b"A"``
#: (by an ancestor, live in the asking process), the child's id, the asker's id,
#: when it was asked (wall-clock seconds): 41 bytes. (A runtime of an earlier
#: version skips an ``A`` ring: the interrupt is lost, as any ring may be.)
_INTERRUPT = struct.Struct(">c16s16sd")

#: ``interrupt(child, by, asked_at, kind)``: an interrupt (kind ``"user"`` or
#: ``"ancestor"``) or a drain (``"drain"``) another process asked.
InterruptAsked = Callable[[SessionId, SessionId, float, str], object]
_KINDS = {b"I": "user", b"A": "ancestor", b"D": "drain"}
#: Seconds after the mail task starts that it first sweeps (at most a period).
FIRST_SWEEP: Final = 1.0
#: This runtime's own ring asking for a sweep now (:meth:`Mailman.sweep_soon`):
#: one byte, so neither session ids nor an interrupt.
_SWEEP = b"S"
#: Seconds the pickup waits, in the agent's loop, for the session's writes before it
#: settles messages in doubt (longer, and it would hold the agent's turns up).
_WRITTEN_WAIT = 0.5


def interrupt_ring(
    child: SessionId, by: SessionId, asked_at: float, *, ancestor: bool = False, drain: bool = False
) -> bytes:
    """The ring that asks a child's holder to interrupt it (see the module docstring):
    ``by`` its parent's address, or an ``ancestor`` live in the asking process; with
    ``drain``, to drain it, ``by`` its parent (whose descendants are drained)."""
    kind = b"D" if drain else b"A" if ancestor else b"I"
    return _INTERRUPT.pack(kind, child.to_bytes(), by.to_bytes(), asked_at)


class Mailman:
    """This runtime's mail pickup (see the module docstring)."""

    def __init__(
        self,
        sessions: SessionService,
        backend: Backend,
        *,
        holder: str,
        live: Callable[[SessionId], Agent | None],
        holds: Callable[[SessionId], bool],
        orphan: Callable[[SessionId], object],
        period: float,
        interrupt: InterruptAsked | None = None,
    ) -> None:
        # A fork before this runs its first round: the child's copy still abandons.
        self._born = fork_generation()
        self._sessions = sessions
        self._interrupt = interrupt
        self._backend = backend
        self._holder = holder
        self._live = live
        self._holds = holds
        self._orphan = orphan
        self._period = period
        # A store that wakes holders itself (PostgreSQL's LISTEN/NOTIFY; SQLite's
        # socket file beside the database, reached from any network namespace)
        # gives this runtime a channel of its own; else the host's doorbell alone.
        self._listener = sessions.listen()
        self.doorbell = Doorbell(backend, self._listener)
        self._task: TaskHandle | None = None
        # Sessions with messages in doubt, looked at again by every sweep: by
        # session, those a hand-over of this runtime may have taken (see the module
        # doc): the pickup's, a take-ahead's (one registry: see _doubts).
        self._doubts = sessions.doubts
        # A sweep asked by sweep_soon and not begun yet: asks made meanwhile ring
        # once (a race of two asks rings twice: one sweep more, harmless).
        self._asked = False
        #: Sweeps made so far (each looked at the store once, whatever it found).
        self.sweeps = 0

    @property
    def address(self) -> str:
        return self.doorbell.address

    def start(self) -> None:
        self._task = self._backend.spawn(self._run, name="subagents-mail")

    @classmethod
    def started(
        cls,
        sessions: SessionService,
        backend: Backend,
        leases: Any,
        live: Callable[[SessionId], Agent | None],
        orphan: Callable[[SessionId], object],
        interrupt: InterruptAsked | None = None,
    ) -> Mailman:
        """The pickup of a runtime whose sessions ``leases`` holds, wired (leases
        name its doorbell; a session with messages nobody took rings it) and
        running; it sweeps every third of the lease ttl."""
        mail = cls(
            sessions, backend, holder=leases.holder.id, live=live, holds=leases.holds,
            orphan=orphan, period=float(leases.ttl) / 3, interrupt=interrupt,
        )  # fmt: skip
        leases.wake = mail.address
        sessions.on_waiting = mail.rung
        mail.start()
        return mail

    def close(self) -> None:
        """Stop picking up and sweeping. The store's listener stays open (unread)
        until :meth:`hang_up`."""
        self.doorbell.close()
        if self._task is not None:
            self._task.join(30)
        # No pickup from now on: nothing is owed (a wait_idle after close returns).
        self._sessions.on_waiting = None
        self._sessions.rung.clear()

    def hang_up(self) -> None:
        """Close the store's listener (after :meth:`close`, once every lease is given
        back): on PostgreSQL its connection is what shows other hosts this holder
        still runs (``store/_pg_listen.py``), so a close that disposes many agents
        for longer than the grace must not look like a death. Idempotent."""
        if self._listener is not None:
            self._listener.close()

    def rung(self, session_id: SessionId) -> None:
        """Look at ``session_id`` from the mail task (a ring of our own doorbell)."""
        ring(self.doorbell.local_address, session_id.to_bytes())

    def sweep_soon(self) -> None:
        """Have the mail task sweep now, not at the end of its period (a model or
        provider was registered: what the last sweep could not activate may be
        activated now). Asks made before that sweep begins ring once."""
        if not self._asked:
            # A ring lost (the doorbell's queue full: the task is busy) asks again.
            self._asked = ring(self.doorbell.local_address, _SWEEP)

    # -- the task ------------------------------------------------------------------

    def _run(self) -> None:
        # The first sweep soon: a worker restarted after its predecessor was killed
        # finds the work the dead holder leased (and the orphans) a second after
        # its start, not a period after it -- and not at once: the script or server
        # that opened the runtime registers its models and resumes its own sessions
        # first (a resume that met the sweep's adoption would be SESSION_EXISTS).
        swept = time.monotonic() - self._period + min(self._period, FIRST_SWEEP)
        while True:
            # A sweep every period, rung or not: a runtime rung more often than
            # that would otherwise never look for orphans or missed rings.
            due = swept + self._period
            # Early when an unheard holder's grace ends before (once: a sweep past it
            # judged it, or failed -- and the store is asked again a period later).
            recheck = self._sessions.recheck_at()
            if recheck is not None and swept < recheck < due:
                due = recheck
            try:
                rings = self.doorbell.wait(max(0.0, due - time.monotonic()))
            except Exception:
                # This task is the runtime's only way to hear of mail, interrupts and
                # orphans: it outlives a failed wait (a ring may be lost: sweep now).
                logger.exception("waiting for rings failed")
                self._backend.sleep(min(self._period, 1.0))  # never a busy loop
                rings = None
            abandon_if_forked(self._born)  # the parent's rings are not the child's to answer
            if rings == []:
                return  # closed
            try:
                rung: list[SessionId] = []
                if rings is not None:
                    rung = _session_ids(rings)
                    self._interrupts(rings)
                asked = rings is not None and _SWEEP in rings
                owed: dict[SessionId, int] = {}
                if rings is None or asked or time.monotonic() >= due:
                    swept = time.monotonic()
                    self._asked = False  # (before the sweep: a later ask sweeps again)
                    owed = self._sessions.rung.owed()
                    rung += self._sweep()
                    self.sweeps += 1
                self._pickups(rung)
                # A sweep found every message nobody took: the rings before it are
                # answered, a lost one's too (its session's messages were taken since).
                for sid, mark in owed.items():
                    self._sessions.rung.answered(sid, mark)
            except Exception:  # (the parts fail on their own: a bug of the round's)
                logger.exception("mail pickup failed")

    def _pickups(self, rung: list[SessionId]) -> None:
        """Each pickup on its own: one that fails (every time, for a session that
        cannot be taken up) must not keep the round's others from their mail."""
        for sid in dict.fromkeys(rung):
            try:
                self.pickup(sid)
            except SubagentError as exc:  # the store's, typed (an outage)
                logger.warning("picking up the mail of %s failed: %s", sid, exc)
            except Exception:
                logger.exception("picking up the mail of %s failed", sid)

    def _sweep(self) -> list[SessionId]:
        """The sessions a sweep looks at: this holder's with messages nobody took,
        the orphans, those with messages in doubt. Each asked on its own: a query
        that fails (every time, a damaged row) leaves the others' answers."""
        found: list[SessionId] = []
        queries: list[tuple[str, Callable[[], list[SessionId]]]] = [
            ("the waiting mail", lambda: self._sessions.waiting(self._holder)),
            ("the orphans", self._sessions.orphans),
            ("the work of ended holders", self._sessions.abandoned),
            ("the work of holders whose presence ended", self._sessions.ended),
            ("the work of unheard holders", lambda: self._sessions.unheard(self._deaf)),
        ]
        for what, ask in queries:
            try:
                found += ask()
            except SubagentError as exc:  # the store's, typed: an outage says so once
                logger.warning("sweeping for %s failed: %s", what, exc)
            except Exception:
                logger.exception("sweeping for %s failed", what)
        return found + self._doubts.sessions()

    def _deaf(self) -> None:
        """The store no longer shows this runtime's listening connection (see
        ``SweepReads.unheard``): it is dropped and, at the next wait, reopened."""
        logger.warning(
            "the store no longer shows this runtime's listening connection: reconnecting it"
        )
        self.doorbell.drop_listener()

    def _interrupts(self, rings: list[bytes]) -> None:
        handle = self._interrupt
        if handle is None:
            return
        for payload in rings:
            if len(payload) != _INTERRUPT.size or payload[:1] not in _KINDS:
                continue
            kind, child, by, asked_at = _INTERRUPT.unpack(payload)
            try:
                handle(
                    SessionId.from_bytes(child), SessionId.from_bytes(by), asked_at, _KINDS[kind]
                )
            except SubagentError as exc:  # not authorized, or it left residency
                logger.warning("an interrupt asked from another process failed: %s", exc)
            except Exception:  # the batch's pickups still run
                logger.exception("an interrupt asked from another process failed")

    def pickup(self, sid: SessionId) -> None:
        """Deliver what waits for ``sid`` if it is live here, else hand it to ``orphan``;
        the rings of ``sid`` before it are answered then (``SessionService.rung``):
        what it found is in the agent's loop, counted in flight. One that raises
        answers nothing: they stay owed until the next sweep, which looks again."""
        rung = self._sessions.rung
        mark = rung.mark(sid)
        self._pick(sid)
        rung.answered(sid, mark)

    def _pick(self, sid: SessionId) -> None:
        agent = self._live(sid)
        if agent is None:
            self._doubts.forget(sid)  # its next activation replays what the store holds
            if not self._holds(sid):  # released, or never ours: somebody must activate it
                self._orphan(sid)
            return  # materializing: its resume reads the inbox, the sweep the rest
        # Leaving residency (refused): its lease release finds what waits.
        with contextlib.suppress(SubagentError):
            agent.call_in_loop(lambda: self._deliver(agent))

    def _deliver(self, agent: Agent) -> None:
        """In ``agent``'s loop: take and queue its untaken messages, and settle those
        in doubt -- tried again at once when a write of it may have committed, then
        at each sweep while any stay in doubt (see the module docstring)."""
        sid = agent.session_id
        for again in (False, True):
            try:
                with agent._taking:  # one taker at a time (see _ahead.committed_at)
                    if stand_back(agent.session):
                        return  # its replay is not queued yet: rung again once it is
                    self._take(agent)
                break
            except SubagentError as exc:
                if again or not self._doubted(agent) or exc.code == ErrorCode.TIMEOUT:
                    logger.warning("picking up the mail of %s failed: %s", sid, exc)
                    break
        # Looked at by every sweep while any stay in doubt.
        self._doubts.watch(sid, self._doubted(agent))

    def _doubted(self, agent: Agent) -> bool:
        return bool(self._doubts.held(agent.session_id) or agent._in_doubt())

    def _take(self, agent: Agent) -> None:
        """One pickup of ``agent``'s mail (see :meth:`_deliver`)."""
        sessions = self._sessions
        sid = agent.session_id
        held = self._doubts.held(sid)
        asked = agent._in_doubt()
        # (In the agent's loop: a short wait, the next sweep looks again.)
        if held and not sessions.written(agent.session, _WRITTEN_WAIT):
            raise SubagentError(f"the writes of {sid} are late", code=ErrorCode.TIMEOUT)
        # (Settling doubts needs the taken ones too; else only what nobody took.)
        entries = sessions.pending(sid) if held or asked else sessions.untaken(sid)
        untaken = [e.message_id for e in entries if e.epoch is None]
        taken: set[MessageId] = set()
        if untaken:
            try:
                taken = set(sessions.hand_over(sid, untaken, agent.session))
            except SubagentError as exc:
                if unsure(exc):  # taken, or not: the next look settles them
                    self._doubts.add(sid, untaken)
                raise
        handed = [e for e in entries if e.message_id in taken]
        try:
            if held or asked:
                epoch = agent.session.token[1] if agent.session.token is not None else None
                mine = [e for e in entries if e.message_id in held and e.epoch == epoch]
                agent._settle_unsure(asked, entries, [*mine, *handed])
                # Settled: taken now, or shown taken (ours: queued). One shown untaken
                # or not at all may be a hand-over the server is still finishing.
                settled = taken | {e.message_id for e in entries if e.epoch is not None}
                self._doubts.settle(sid, held, settled)
            elif handed:
                replay(agent, handed)
        except SubagentError:
            # Disposed meanwhile: what it took goes back, for the next holder.
            token = agent.session.token
            if token is not None and taken:
                sessions.give_back(sid, list(taken), token[1])


def _session_ids(rings: list[bytes]) -> list[SessionId]:
    seen: dict[SessionId, None] = {}
    for payload in rings:
        if len(payload) % _ID:
            continue  # a command (an interrupt), not session ids
        for i in range(0, len(payload) - _ID + 1, _ID):
            seen[SessionId.from_bytes(payload[i : i + _ID])] = None
    return list(seen)
