"""A follow-up addressed by the parent's *id*: from a process where the parent is not live.

``runtime.subagents.followup(parent_id, child_id, content)`` is what a server
worker calls for a tree another worker holds (several processes on one store,
requests reaching any of them). The caller vouches for the parent, as
:class:`~subagents.actors.UserAuthority` does for an interrupt: the child must be
a direct subagent of ``parent_id``.

* The parent is live here: it is the ordinary follow-up.
* Otherwise, under strict durability, the message is first committed to the
  child's durable inbox (its id deduplicates, as always), then whoever can run it
  is woken: the child's holder when another process has the child live; else the
  parent's holder, which activates the child on the parent's behalf; else --
  nobody holds the parent -- the parent is resumed here and wakes the child.
  Whatever moves meanwhile (a holder releasing, dying), the message is committed
  and the holders' sweeps find it.
* On a memory store or under relaxed durability the parent is made live here
  first (nothing can be committed for another process to run): see
  :meth:`Chains.with_parent`.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from subagents.actors._agents import (
    Agent,
    AgentRegistry,
    SessionService,
    Steered,
    in_doubt,
    kept,
    stored_options,
    wake_holder,
)
from subagents.protocol import (
    ErrorCode,
    InboxFullError,
    MessageId,
    MessageSource,
    ReportEvent,
    SessionId,
    SubagentError,
    check_value,
    new_message_id,
    trusted_message,
)

from ._chains import MAX_CHAIN, WAKE_TRIES, resume_here
from ._child import StoredParent
from ._continuation import ContinuationManager
from ._types import ContinuableHandle, ContinuableStartSpec
from ._validate import check_start_spec

__all__ = [
    "adopt",
    "followup_by_id",
    "start_by_id",
    "start_child",
    "wake_child",
    "wake_orphan",
]

logger = logging.getLogger("subagents")

#: Most sessions a runtime remembers having said it cannot activate.
_SAID_MAX = 10_000


def followup_by_id(
    agents: AgentRegistry,
    sessions: SessionService,
    continuation: ContinuationManager,
    parent_id: SessionId,
    child_id: SessionId,
    content: Any,
    *,
    source: MessageSource | None,
    message_id: MessageId | str | None,
    steer: Any = False,
) -> Any:
    """See the module docstring. Returns the message's id -- with ``steer`` (a
    checked steer: True or ``"strict"``), its :class:`Steered` outcome.

    Raises:
        SubagentError: ``SESSION_NOT_FOUND`` (no such child), ``UNAUTHORIZED`` (not
            a subagent of ``parent_id``), ``ENCODE_ERROR``, the store's errors, and
            those of resuming the parent (``CORRUPT_RECORD`` for a damaged log: see
            ``resume(..., damaged="skip")``); nothing is accepted then.
    """
    parent = agents.get(parent_id)
    for _attempt in range(WAKE_TRIES):
        if parent is None:
            break
        try:
            return _local(continuation, parent, child_id, content, source, message_id, steer)
        except SubagentError as exc:
            if exc.code != ErrorCode.UNAUTHORIZED:
                raise
            if continuation.published(parent_id):
                parent = agents.get(parent_id)  # resumed meanwhile: asked again
                continue
            if not continuation.left(parent):
                raise
            # The parent left residency since it was looked up (nothing was
            # accepted): the caller vouches for it, so as where it is not live.
            break
    header = sessions.header(child_id)
    if header is None:
        raise SubagentError(f"no session {child_id}", code=ErrorCode.SESSION_NOT_FOUND)
    if header.origin != "subagent" or header.parent_session != parent_id:
        raise SubagentError(
            f"session {child_id} is not a subagent of {parent_id}", code=ErrorCode.UNAUTHORIZED
        )
    if not sessions.strict or sessions.leases is None:
        return continuation.chains.with_parent(
            parent_id,
            lambda parent: _local(
                continuation, parent, child_id, content, source, message_id, steer
            ),
        )
    check_value(content)  # refuse what the log cannot hold before anything is accepted
    mid = new_message_id() if message_id is None else MessageId(message_id)
    src = source if source is not None else MessageSource(kind="parent", session_id=parent_id)
    message = trusted_message(mid, content, src)
    try:
        (accepted,) = sessions.accept(child_id, [message], limit=header.max_inbox)
    except InboxFullError:
        # Full of messages nobody may be running (the tree not live anywhere):
        # have them run, or no place would ever open.
        try:
            wake_child(agents, sessions, continuation, child_id, parent_id, True)
        except SubagentError as exc:
            logger.debug("waking %s, whose inbox is full, failed: %s", child_id, exc)
        raise
    if not accepted.duplicate:
        try:
            wake_child(agents, sessions, continuation, child_id, parent_id, True)
        except SubagentError as exc:
            # Nobody can run it (the parent cannot be resumed: a damaged log, a
            # model not registered here): an error means nothing was accepted --
            # unless it is not ours to take back (see kept).
            if not kept(sessions, child_id, mid, exc, accepted.at):
                raise
    if steer:  # no open turn of this process's to steer: queued, or nothing new
        return Steered(mid, "duplicate" if accepted.duplicate else "queued")
    return mid


def start_child(
    sessions: SessionService, continuation: ContinuationManager, spec: ContinuableStartSpec
) -> ContinuableHandle:
    """``start_continuable``: by the parent agent, or by its id (:func:`start_by_id`)."""
    if isinstance(spec, ContinuableStartSpec) and not isinstance(spec.parent, Agent):
        check_start_spec(spec)
        return start_by_id(continuation.require_agents(), sessions, continuation, spec)
    return continuation.start_continuable(spec)


def start_by_id(
    agents: AgentRegistry,
    sessions: SessionService,
    continuation: ContinuationManager,
    spec: ContinuableStartSpec,
) -> ContinuableHandle:
    """A continuable start whose ``spec.parent`` is the parent's id (see
    :meth:`SubagentService.start_continuable`).

    * The parent is live here: the ordinary start.
    * Otherwise, under strict durability, the child's session and prompt are
      committed here, unheld, and whoever can run it is woken as for a follow-up by
      id (:func:`wake_child`): the parent's holder, which activates the child on
      the parent's behalf (its sweep finds the child if the ring is lost), or --
      nobody holds the parent -- the parent resumed here. Returns once committed,
      as a start does.
    * On a memory store or under relaxed durability the parent is made live
      here first (:meth:`Chains.with_parent`).

    Raises:
        SubagentError: ``SESSION_NOT_FOUND`` (no such parent), ``INVALID_ARGUMENT``,
            those of a start, and those of resuming the parent; nothing is created
            then -- except where a start of the same ``message_id`` found the child
            meanwhile (and was told it exists), or the store could not withdraw
            it (the runtime closing): the child stays, with its prompt waiting for
            the tree's next activation, and its handle is returned.
    """
    assert not isinstance(spec.parent, Agent)
    parent_id = SessionId(spec.parent)
    for _attempt in range(WAKE_TRIES):
        parent = agents.get(parent_id)
        if parent is None or not agents.is_live(parent):
            break  # started as where it is not live
        try:
            return continuation.start_continuable(dataclasses.replace(spec, parent=parent))
        except SubagentError as exc:
            if exc.code != ErrorCode.UNAUTHORIZED:
                raise
            if continuation.published(parent_id, spec.signal):
                continue  # found as it was materialized: asked again once published
            if not continuation.left(parent):
                raise
            # Left residency since it was looked up (nothing was created): as
            # where it is not live, or through its next activation here.
    if sessions.strict and sessions.leases is not None:
        return _start_unheld(agents, sessions, continuation, spec, parent_id)
    return continuation.chains.with_parent(
        parent_id,
        lambda live: continuation.start_continuable(dataclasses.replace(spec, parent=live)),
    )


def _start_unheld(
    agents: AgentRegistry,
    sessions: SessionService,
    continuation: ContinuationManager,
    spec: ContinuableStartSpec,
    parent_id: SessionId,
) -> ContinuableHandle:
    header, options = stored_options(sessions, parent_id)
    handle, created = continuation.start_unheld(spec, StoredParent(parent_id, header, options))
    if created:
        try:
            wake_child(agents, sessions, continuation, handle.child_id, parent_id, True)
        except SubagentError:
            # Nobody can run it (nobody holds the parent and it cannot be resumed
            # here: a model not registered here, a damaged log): an error means
            # nothing was created -- unless it was taken, or a start of the same id
            # was told it exists meanwhile: then it stays, as a follow-up nobody
            # could wake does (it runs at the child's next activation).
            if _withdrawn(sessions, handle):
                raise
    return handle


def _withdrawn(sessions: SessionService, handle: ContinuableHandle) -> bool:
    """Withdraw a child committed unheld that nobody could wake (True: nothing of it
    remains, the start raises). A withdrawal the store cannot make (the runtime
    closing under the start) keeps it: it is committed with its prompt, which runs
    at the child's next activation, so the start returns it. One nobody can say
    was made or not (its answer lost, the store not answering since) raises in
    doubt: a retry with its ``message_id`` finds the child, or starts it again."""
    try:
        return sessions.withdraw_unheld(handle.child_id, handle.message_id)
    except SubagentError as exc:
        if in_doubt(exc):
            raise
        logger.warning("could not withdraw %s (%s): it stays started", handle.child_id, exc)
        return False


def wake_child(
    agents: AgentRegistry,
    sessions: SessionService,
    continuation: ContinuationManager,
    child_id: SessionId,
    parent_id: SessionId,
    adopted: bool = False,
) -> None:
    """Messages wait in a continuable child's durable inbox: wake whoever can run
    them -- the child's holder; else, climbing from its parent through settled
    subagent sessions, the first ancestor live here (the chain below it is woken
    here, :meth:`Chains.wake`) or held by another process
    (rung about the child: it wakes the chain there); else the top-level agent is
    resumed here first (``adopted``: for no user here -- the sweep's, or a
    follow-up's or start's by the parent's id -- let go once quiet, after its
    child). A committed message is never lost by a failure here: it runs at the
    child's next activation, and the holders' sweeps look again.

    Raises:
        SubagentError: resuming the top-level agent failed (not ``LEASE_HELD``).
    """
    # The chain's top may leave residency while it is woken (it settled, or was
    # disposed): then once more from the start, where it is not live.
    for attempt in range(WAKE_TRIES):
        if _wake_once(agents, sessions, continuation, child_id, parent_id, attempt, adopted):
            return


def _wake_once(
    agents: AgentRegistry,
    sessions: SessionService,
    continuation: ContinuationManager,
    child_id: SessionId,
    parent_id: SessionId,
    attempt: int,
    adopted: bool,
) -> bool:
    """One try of :func:`wake_child`: False when the chain's top left meanwhile."""
    release = None
    # A holder's doorbell nobody answers (its process died, on this host) counts as
    # no holder: the lease of a dead holder here is taken over at once.
    child_holder = sessions.wake_address(child_id)
    if child_holder is not None and sessions.ring(child_holder, child_id.to_bytes()):
        return True  # live in another process: its pickup takes it
    chain = [child_id]
    sid = parent_id
    for _ in range(MAX_CHAIN):
        chain.append(sid)
        if agents.get(sid) is not None:
            break  # live here: wake the chain below it
        holder = sessions.wake_address(sid)
        if holder is not None and sessions.ring(holder, child_id.to_bytes()):
            return True  # live in another process: it wakes the chain there
        header = sessions.header(sid)
        if header is None:
            return True  # no such parent: nothing can run it
        if header.origin == "subagent" and header.parent_session is not None:
            sid = header.parent_session
            continue
        try:  # (the sweep's own resume: one found live is somebody else's)
            if adopted:  # (held until its child below is woken: that keeps it then)
                release = agents.resume_unasked(sid)
            else:
                resume_here(agents, sid)
        except SubagentError as exc:
            if exc.code == ErrorCode.SESSION_EXISTS:  # being activated here meanwhile:
                return attempt == WAKE_TRIES - 1  # again, through it (or the sweep)
            if exc.code != ErrorCode.LEASE_HELD:
                raise
            wake_holder(sessions, exc, child_id)  # resumed elsewhere meanwhile
            return True
        break
    else:
        return True
    chain.reverse()
    try:
        return continuation.chains.wake(chain, last_try=attempt == WAKE_TRIES - 1)
    finally:
        if release is not None:
            release()


def adopt(
    agents: AgentRegistry,
    sessions: SessionService,
    continuation: ContinuationManager,
    session_id: SessionId,
) -> None:
    """Messages wait in the inbox of a session nobody holds (a sweep found it): have
    it activated -- a top-level agent here, from its recorded options; a child
    where its parent lives (:func:`wake_child`).

    Raises:
        SubagentError: ``LEASE_HELD`` / ``SESSION_EXISTS`` (somebody else did),
            or why it cannot be activated here.
    """
    header = sessions.header(session_id)
    pending = [] if header is None else sessions.pending(session_id)
    if header is None or (_only_quiet(pending) and not sessions.owes(session_id)):
        return  # quiet reports wait for the next turn: nothing to wake it for (nor owed)
    if header.origin == "subagent" and header.parent_session is not None:
        wake_child(agents, sessions, continuation, session_id, header.parent_session, True)
    elif agents.get(session_id) is None:
        agents.resume_waiting(session_id)


def wake_orphan(
    agents: AgentRegistry,
    sessions: SessionService,
    continuation: ContinuationManager,
    session_id: SessionId,
    *,
    everything: bool,
    said: set[SessionId],
) -> None:
    """A runtime's sweep or a ring found messages waiting for a session nobody holds
    here: :func:`adopt` it. ``everything=False`` (a runtime that adopts nothing, a
    placement's host): only a child of an agent live here -- a ring about one was
    dropped, and the grandchildren of placed children stranded. Errors other than
    somebody else having it are logged once per session (``said``): the sweep
    asks again."""
    if not everything and not _below_live(agents, sessions, session_id):
        return
    try:
        adopt(agents, sessions, continuation, session_id)
    except SubagentError as exc:
        if exc.code in (ErrorCode.LEASE_HELD, ErrorCode.SESSION_EXISTS):
            said.discard(session_id)  # somebody runs it: said again if it strands again
            return
        if session_id not in said:
            if len(said) >= _SAID_MAX:
                said.clear()  # a bound: at worst a session is said twice
            said.add(session_id)
            logger.warning(
                "messages wait for %s, which cannot be activated here: %s", session_id, exc
            )
    else:
        said.discard(session_id)


def _below_live(agents: AgentRegistry, sessions: SessionService, session_id: SessionId) -> bool:
    """Whether ``session_id`` is a child of an agent live here."""
    try:
        header = sessions.header(session_id)
    except SubagentError:
        return False
    parent = None if header is None else header.parent_session
    return parent is not None and agents.get(parent) is not None


def _only_quiet(pending: list[Any]) -> bool:
    return all(isinstance(e.event, ReportEvent) and e.event.delivery == "quiet" for e in pending)


def _local(
    continuation: ContinuationManager,
    parent: Agent,
    child_id: SessionId,
    content: Any,
    source: MessageSource | None,
    message_id: MessageId | str | None,
    steer: Any = False,
) -> Any:
    """A follow-up through the parent live here: its id (a :class:`Steered` with
    ``steer``)."""
    return continuation.followup(
        parent, child_id, content, source=source, message_id=message_id, steer=steer
    )
