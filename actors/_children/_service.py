"""``runtime.subagents``: the seed's ``ctx.subagents``, one facade over its parts.

Theory of operation
-------------------
Callers delegate only through this service; the named provider decides where
the child runs. The service is a facade: providers live in the
:class:`ProviderRegistry`, listeners in the :class:`EventBus`, continuable
children in the :class:`ContinuationManager`, listings in the catalog. What it
does itself is the one-shot start: ``start(name, request)`` validates the request
(types, the required signal, its message id, requested capabilities) and
snapshots the one-shot descriptor *before* any provider work, hands both to the
provider -- which publishes the child or raises after rolling back, or, for a
message id an earlier start used, returns that start's settled run
(:mod:`._once`) -- and opens the run's ``subagent/start`` / ``subagent/end`` pair.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal, overload

from subagents.actors._agents import (
    Agent,
    Steered,
)
from subagents.actors._kernel import AbortSignal, Telemetry, check_born, fork_generation, traced
from subagents.protocol import (
    MessageId,
    MessageSource,
    SessionId,
)

from ._continuation import ContinuationManager
from ._events import EventBus, Listener, Subscription
from ._once import check_message_id
from ._oneshot import start_oneshot
from ._placement import check_same_store
from ._provider_registry import ProviderRegistration, ProviderRegistry
from ._remote import start_child
from ._reports import ReportReceipt, report_from, report_receipt
from ._sending import send_followup
from ._service_reads import CatalogReads, ServiceContext
from ._setup import SetupRegistration
from ._types import (
    AncestorAuthority,
    ContinuableHandle,
    ContinuableStartSpec,
    SubagentProvider,
    SubagentRun,
    SubagentStartRequest,
    UserAuthority,
)

__all__ = ["ServiceContext", "SubagentService"]


class SubagentService(CatalogReads):
    """The seed's ``ctx.subagents`` (``runtime.subagents``)."""

    def __init__(
        self,
        *,
        ctx: ServiceContext,
        providers: ProviderRegistry,
        events: EventBus,
        continuation: ContinuationManager,
        check_thread: Callable[[], None],
    ) -> None:
        self._ctx = ctx
        self._providers = providers
        self._events = events
        self._continuation = continuation
        self._check_thread = check_thread
        self._born = fork_generation()

    def _check_process(self) -> None:
        """``WRONG_PROCESS`` in the child of a fork (for the calls a foreign thread
        may make, which ``check_thread`` would refuse on gevent)."""
        check_born(self._born, "this Runtime")

    # -- provider registry ---------------------------------------------------------------

    def register_provider(self, provider: SubagentProvider) -> ProviderRegistration:
        """Register ``provider`` under ``provider.name``.

        Raises:
            SubagentError: ``PROVIDER_EXISTS`` for a name already registered
                (nothing changes), ``INVALID_ARGUMENT`` for a malformed provider,
                or one that places its children on hosts of another store.
        """
        check_same_store(provider, self._ctx.sessions.persistence)
        return self._providers.register(provider)

    def get_provider(self, name: str) -> SubagentProvider | None:
        """The registered provider, or None."""
        return self._providers.get(name)

    def list(self) -> list[str]:
        """Registered provider names in insertion order."""
        return self._providers.names()

    # -- lifecycle events ----------------------------------------------------------------

    def subscribe(
        self, listener: Listener, *, scope: Agent | SessionId | str | None = None
    ) -> Subscription:
        """Observe lifecycle events.

        With ``scope`` (a parent agent or its session id) the listener receives the
        run events of children delegated by that parent; without, every run event
        and the provider events. Listeners of continuable epochs run in the
        runtime's dispatcher, in order, never inside admission or release. A
        listener hears the whole ``subagent/start``/``subagent/end`` pair of each
        run or epoch started after it subscribed; one started while nobody listened
        emits neither event (not a lone end).
        """
        return self._events.subscribe(listener, scope=scope)

    # -- one-shot --------------------------------------------------------------------

    def start(self, name: str, request: SubagentStartRequest) -> SubagentRun:
        """Start a one-shot child through provider ``name``; see the module docstring.

        ``request.message_id`` makes it take effect once per parent: a start again
        with the id returns the earlier child's settled run when that run
        completed, else runs it once more (see :class:`SubagentStartRequest`).

        Raises:
            SubagentError: ``INVALID_ARGUMENT`` (bad request, missing signal, a
                message id that is none), ``PROVIDER_NOT_FOUND``,
                ``CAPABILITY_UNSUPPORTED``, ``DESCRIPTOR_INVALID``,
                ``AGENT_DISPOSED`` (parent not live), ``CANCELLED`` (signal aborted
                before publication), and whatever the provider raises after its
                rollback (``MODEL_NOT_FOUND``, ``DEPTH_EXCEEDED``; with a message
                id, ``SESSION_EXISTS`` while a start of it runs, ...).
        """
        self._check_thread()
        check_message_id(request)  # before any provider work
        ctx = self._ctx
        return start_oneshot(
            ctx.agents, self._providers, self._events, ctx.telemetry, name, request
        )

    # -- continuable children (the continuation manager) -----------------------------------

    def start_continuable(self, spec: ContinuableStartSpec) -> ContinuableHandle:
        """Establish one durable continuable child and deliver its initial prompt.

        Returns ``(child_id, message_id)`` once the child's inbox accepted the
        prompt (under strict durability: once the child and its prompt are
        committed), without waiting for the turn. Any earlier failure raises and
        rolls the child back entirely (no session, agent, Activation, ownership,
        setup contribution or event remains). The caller's signal owns admission
        only. ``spec.message_id`` makes it idempotent: the same id from the same
        parent returns the same handle and starts nothing new, across processes
        and restarts (the child's id is derived from the two).

        ``spec.parent`` may be the parent's session id instead of the agent: the
        caller vouches for it (as :class:`UserAuthority` does), and the child is
        started wherever the parent lives -- here; in the process holding it, on a
        strict durable store (the child and its prompt are committed here, and
        that process activates it); else the parent is made live here first
        (resumed; a subagent parent woken below its lineage).

        Raises:
            SubagentError: ``PERSISTENCE_UNAVAILABLE``, ``PROVIDER_NOT_FOUND``,
                ``CONTINUABLE_UNSUPPORTED``, ``DESCRIPTOR_INVALID`` (no label),
                ``UNAUTHORIZED`` (parent not live), ``ADMISSION_CLOSED`` (drained),
                ``CANCELLED``, ``MODEL_NOT_FOUND``, ``DEPTH_EXCEEDED``; by id,
                ``SESSION_NOT_FOUND`` (no such parent) and those of resuming it.
        """
        self._check_thread()
        tel = self._ctx.telemetry
        if tel is None:
            return start_child(self._ctx.sessions, self._continuation, spec)
        parent = spec.parent
        parent_id = parent.session_id if isinstance(parent, Agent) else SessionId(parent)
        attrs = {"parent_session_id": parent_id, "provider": spec.provider}
        return traced(tel, "subagents.start", attrs, lambda: self._start_traced(tel, spec))

    def _start_traced(self, tel: Telemetry, spec: ContinuableStartSpec) -> ContinuableHandle:
        if isinstance(spec.source, MessageSource):  # else the parent's, stamped already
            spec = dataclasses.replace(spec, source=tel.stamp(spec.source))
        return start_child(self._ctx.sessions, self._continuation, spec)

    @overload
    def followup(
        self,
        parent: Agent | SessionId | str,
        child_id: SessionId | str,
        content: Any,
        *,
        source: MessageSource | None = None,
        signal: AbortSignal | None = None,
        message_id: MessageId | str | None = None,
        steer: Literal[False] = False,
        wait_for_room: float | None = 0.0,
    ) -> MessageId: ...

    @overload
    def followup(
        self,
        parent: Agent | SessionId | str,
        child_id: SessionId | str,
        content: Any,
        *,
        source: MessageSource | None = None,
        signal: AbortSignal | None = None,
        message_id: MessageId | str | None = None,
        steer: Literal[True, "strict"],
        wait_for_room: float | None = 0.0,
    ) -> Steered: ...

    def followup(
        self,
        parent: Agent | SessionId | str,
        child_id: SessionId | str,
        content: Any,
        *,
        source: MessageSource | None = None,
        signal: AbortSignal | None = None,
        message_id: MessageId | str | None = None,
        steer: bool | str = False,
        wait_for_room: float | None = 0.0,
    ) -> MessageId | Steered:
        """Deliver one message from the exact live direct parent as the child's next turn.

        ``steer=True`` hands it to the child's open turn instead, when the child is
        resident here with a turn running (it sees it at its next safe point),
        else follows up as usual; ``steer="strict"`` raises ``TURN_NOT_OPEN``
        rather than queue or resume a cold child (under strict durability, one
        whose commit cannot be taken back -- the store refuses, or a repeat of its
        ``message_id`` was accepted meanwhile -- is accepted all the same, and
        queued). Either returns a
        :class:`~subagents.actors.Steered` (the id, and ``steered`` / ``queued`` /
        ``duplicate``).

        Running children enqueue it, waiting ones wake, absent ones cold-resume
        from their persisted session (no provider involved). ``source`` is recorded
        and grants nothing. Under strict durability the message is committed to
        the child's durable inbox before this returns; ``message_id`` makes it
        idempotent (the same id for the same child queues nothing new, see
        ``docs/durability.md``).

        A child started with ``max_inbox`` refuses a follow-up while that many
        messages are accepted and not done (``INBOX_FULL``, accepting nothing);
        ``wait_for_room`` seconds (``None``: no limit) waits for room instead,
        trying again until then (see ``docs/backpressure.md``). A steered message
        goes to the running turn, not the inbox: it is not bounded.

        ``parent`` may also be the parent's session id, from a process where the
        parent is not live (a server worker serving a tree another worker holds):
        the caller vouches for it, and the message is committed to the child's
        inbox and run wherever the tree lives (see ``_children/_remote.py``).

        Raises:
            SubagentError: ``UNAUTHORIZED``, ``SESSION_NOT_FOUND``,
                ``PERSISTENCE_UNAVAILABLE``, ``ADMISSION_CLOSED``, ``CANCELLED``,
                ``TIMEOUT``, ``DESCRIPTOR_CORRUPT`` / ``DESCRIPTOR_UNSUPPORTED``,
                ``CORRUPT_RECORD`` (a cold child's log, or by id its parent's, holds
                a row that does not decode), ``TURN_NOT_OPEN`` (a strict steer),
                ``INBOX_FULL`` (:class:`~subagents.protocol.InboxFullError`).
        """
        self._check_thread()
        ctx = self._ctx
        tel = ctx.telemetry
        if (
            type(parent) is Agent
            and tel is None
            and wait_for_room == 0.0
            and type(wait_for_room) is float
        ):  # the common cases, straight through
            if source is None and signal is None and message_id is None and steer is False:
                return self._continuation.followup_plain(parent, child_id, content)
            return self._continuation.followup(
                parent, child_id, content, source=source, signal=signal,
                message_id=message_id, steer=steer,
            )  # fmt: skip
        return send_followup(
            ctx.agents, ctx.sessions, self._continuation, tel, parent, child_id, content,
            source=source, signal=signal, message_id=message_id, steer=steer,
            wait_for_room=wait_for_room,
        )  # fmt: skip

    def hold_residency(self, agent: Agent) -> Callable[[], None] | None:
        """Keep ``agent`` resident until the returned release (None: it is neither a
        resident continuable child nor a live top-level agent); see
        ``BoundSubagents.hold_residency``."""
        self._check_process()
        return self._continuation.hold(agent)

    def interrupt(
        self, target_session_id: SessionId | str, authority: UserAuthority | AncestorAuthority
    ) -> None:
        """Cancel a live continuable child's current turn, keeping its inbox.

        Returns without waiting for the child to observe it; an absent target is
        an accepted no-op. The registry decides the authority. A child live in
        another process sharing the store is interrupted there (a
        ``UserAuthority``: this runtime checks the child is the parent's and asks
        the child's lease holder through its doorbell, which cuts the turn that
        was running when it was asked -- best effort, like every wake-up between
        processes; see ``docs/durability.md``).

        Raises:
            SubagentError: ``UNAUTHORIZED`` for a wrong parent address or a stale,
                self-targeting or non-ancestor agent.
        """
        self._check_process()
        self._continuation.interrupt(target_session_id, authority)

    def report_from(
        self,
        child: Agent | SessionId | str,
        content: Any,
        *,
        delivery: str = "quiet",
        signal: AbortSignal | None = None,
        message_id: MessageId | str | None = None,
    ) -> MessageId:
        """Deliver a message from the exact live continuable child to its direct parent.

        ``quiet`` injects context into the parent's next turn; ``waking`` submits
        one later parent turn. Under strict durability the report is committed to
        the parent's durable inbox before this returns, and a parent that is not
        live (leaving residency, or live in no process) keeps it: it is delivered
        when the parent is next live, once (see :meth:`report_receipt`). Without
        it, the parent must be live. ``message_id``: idempotent, as for :meth:`followup`.

        ``child`` may also be a continuable child's session id: the caller vouches
        for the child (a server relaying a report for a child that settled, or
        lives in another process), as a follow-up by the parent's id does for the
        parent. The child need not be live; the report goes to its direct parent.

        Raises:
            SubagentError: ``UNAUTHORIZED`` (not an exact live continuable child --
                by id: not a continuable subagent; or, relaxed, the parent is not
                live), ``SESSION_NOT_FOUND`` (by id), ``INVALID_ARGUMENT``,
                ``CANCELLED``; ``PERSISTENCE_UNAVAILABLE`` (strict) when the store
                cannot commit the report, or when the live parent stopped (its
                write failed) as the report was handed over and it was taken back:
                nothing is accepted (a report that could not be taken back is
                accepted instead, and its id returned); one in doubt says so in
                ``hint["in_doubt"]`` -- retry with its id.
        """
        self._check_process()
        continuation = self._continuation
        agents = continuation.require_agents()
        tel = self._ctx.telemetry

        def live(parent_id: SessionId) -> Agent | None:
            # A parent being materialized here: delivered once it is published
            # (strict: kept in its inbox meanwhile, replayed in order, see _reports).
            if not self._ctx.sessions.strict:
                aborts = signal if isinstance(signal, AbortSignal) else None
                continuation.published(parent_id, aborts)
            return agents.get(parent_id)

        parts = (self._ctx.sessions, continuation.index, live, agents.is_live)
        return traced(
            tel,
            "subagents.report",
            {"session_id": getattr(child, "session_id", child), "delivery": delivery},
            lambda: report_from(
                *parts, child, content, hosted=continuation.hosted, delivery=delivery,
                signal=signal, message_id=message_id, telemetry=tel,
            ),
        )  # fmt: skip

    def report_receipt(
        self, child: Agent | SessionId | str, message_id: MessageId | str
    ) -> ReportReceipt:
        """What became of a report ``child`` sent: delivered (with the parent turn that
        consumed it), pending, or unknown -- read from the parent's log and inbox.

        Raises:
            SubagentError: ``SESSION_NOT_FOUND``, ``UNAUTHORIZED`` (not a subagent),
                ``INVALID_ARGUMENT``.
        """
        self._check_process()
        cid = child.session_id if isinstance(child, Agent) else SessionId(child)
        return report_receipt(self._ctx.sessions, cid, MessageId(message_id))

    def register_continuable_setup(self, contribution: Any) -> SetupRegistration:
        """Install ``contribution(scope)`` into every newly materialized continuable child.

        ``contribution`` may return a release callable. Disposing the returned
        registration revokes it from every resident child before returning.
        """
        return self._continuation.register_continuable_setup(contribution)

    def drain_continuable_descendants(self, parents: Any, *, timeout: float | None = 60.0) -> None:
        """Close admission below exact live host-owned parents and release their forests.

        Cancels top-down, awaits admitted materializations, releases child-first,
        and returns once every selected forest is released (and its ends were
        announced). The cutoff lasts until each parent leaves the registry.
        ``timeout`` (seconds; None waits for ever) bounds the whole drain:
        ``TIMEOUT`` when it passes first.
        """
        self._check_thread()
        self._continuation.drain(parents, timeout)
