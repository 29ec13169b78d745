"""What a continuable start checks, and a start committed unheld.

:func:`prepare_start` runs a start's checks in their order -- persistence, the
provider and its continuable capability, the parent live (when it must be), the
caller's signal, the child's options and depth, its model -- and returns what
the child is created from. Both starts use it: the ordinary one, whose parent is
live here (the continuation manager materializes the child), and a start by the
parent's id where the parent is not live here (:func:`create_unheld`), whose
parent is a :class:`~._child.StoredParent` read from the store.

:func:`create_unheld` commits the child's session, descriptor and prompt in one
write, holding no lease: nobody holds it yet, and whoever activates it -- the
parent's holder, rung by the caller, or a holder's sweep -- runs the prompt.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

from subagents.actors._agents import Agent, AgentOptions, AgentRegistry, SessionService
from subagents.actors._kernel import AbortSignal
from subagents.protocol import (
    ContinuableDescriptor,
    ErrorCode,
    MessageId,
    MessageSource,
    SessionId,
    SubagentError,
    descriptor_event,
    new_message_id,
    new_session_id,
    snapshot_subagent_descriptor,
    trusted_message,
)

from ._child import ChildContext, StoredParent, child_header, child_options
from ._intake import start_child_id
from ._placement import placement_of
from ._provider_registry import ProviderRegistry
from ._types import ContinuableHandle, ContinuableStartSpec, created_seed

__all__ = ["Prepared", "create_unheld", "prepare_start"]

_NEVER = AbortSignal.never()


class Prepared(NamedTuple):
    """What a checked start creates its child from."""

    prepare: Any  # the provider's prepare_continuable
    placement: Any  # a Placement, or None (the child runs in this process)
    options: AgentOptions
    depth: int
    descriptor: ContinuableDescriptor


def _err(code: str, message: str) -> SubagentError:
    return SubagentError(message, code=code)


def prepare_start(
    ctx: ChildContext,
    providers: ProviderRegistry,
    spec: ContinuableStartSpec,
    parent: Agent | StoredParent,
    agents: AgentRegistry | None,
) -> Prepared:
    """A start's checks, in order (see the module docstring). ``agents``: the parent
    must be live there (None: a stored parent).

    Raises:
        SubagentError: ``PERSISTENCE_UNAVAILABLE``, ``PROVIDER_NOT_FOUND``,
            ``CONTINUABLE_UNSUPPORTED``, ``UNAUTHORIZED``, ``CANCELLED``,
            ``DEPTH_EXCEEDED``, ``MODEL_NOT_FOUND``.
    """
    if ctx.sessions.persistence is None:
        raise _err(ErrorCode.PERSISTENCE_UNAVAILABLE, "start_continuable needs session persistence")
    provider = providers.require(spec.provider)
    prepare = getattr(provider, "prepare_continuable", None)
    if not callable(prepare):
        raise _err(
            ErrorCode.CONTINUABLE_UNSUPPORTED,
            f"provider {spec.provider!r} cannot create continuable children",
        )
    placement = placement_of(provider, ctx.sessions)
    if agents is not None and not agents.is_live(parent):
        raise _err(ErrorCode.UNAUTHORIZED, "the parent is not a live agent")
    (spec.signal or _NEVER).raise_if_aborted()
    options, depth = child_options(
        parent,
        model=spec.model,
        persona=spec.persona,
        tool_filter=spec.tool_filter,
        max_depth=None,
        ceiling=ctx.max_delegation_depth,
    )
    ctx.models.require(options.model)
    descriptor = snapshot_subagent_descriptor(
        ContinuableDescriptor(
            provider=provider.name,
            label=spec.label,
            agent_provider=options.provider,
            model=options.model,
            persona=options.persona,
            tool_filter=options.tool_filter,
        )
    )
    assert isinstance(descriptor, ContinuableDescriptor)
    return Prepared(prepare, placement, options, depth, descriptor)


def create_unheld(
    ctx: ChildContext, spec: ContinuableStartSpec, parent: StoredParent, p: Prepared
) -> tuple[ContinuableHandle, bool]:
    """Commit the child of a start by the parent's id (see the module docstring).
    Returns the handle and whether this call created the child (False:
    ``spec.message_id`` named one that exists).

    Raises:
        SubagentError: ``CONTINUABLE_UNSUPPORTED`` for a provider that places its
            children on hosts (start those where the parent is live),
            ``CANCELLED``, the store's errors (nothing created).
    """
    if p.placement is not None:
        raise _err(
            ErrorCode.CONTINUABLE_UNSUPPORTED,
            f"provider {spec.provider!r} places its children: start them where the parent is live",
        )
    sessions = ctx.sessions
    if spec.message_id is None:
        mid, child_id = new_message_id(), new_session_id()
    else:
        mid = MessageId(spec.message_id)
        child_id = start_child_id(parent.session_id, mid)
        if _answered(sessions, child_id, mid):
            return ContinuableHandle(child_id, mid), False
    create = p.prepare(dataclasses.replace(spec, parent=parent.session_id))
    seed = created_seed(create, spec.provider)
    source = spec.source
    if not isinstance(source, MessageSource):
        source = MessageSource(kind="parent", session_id=parent.session_id)
        if ctx.telemetry is not None:
            source = ctx.telemetry.stamp(source)
    max_inbox = spec.max_inbox if spec.max_inbox is not None else ctx.max_inbox
    header = child_header(
        ctx, parent.session_id, child_id, spec.label, p.depth, len(seed), max_inbox
    )
    (spec.signal or _NEVER).raise_if_aborted()
    try:
        sessions.create_unheld(
            header,
            (*seed, descriptor_event(p.descriptor)),
            trusted_message(mid, spec.prompt, source),
        )
    except SubagentError as exc:
        if exc.code != ErrorCode.SESSION_EXISTS or spec.message_id is None:
            raise
        if _answered(sessions, child_id, mid):
            return ContinuableHandle(child_id, mid), False
        return create_unheld(ctx, spec, parent, p)  # withdrawn meanwhile: create it again
    return ContinuableHandle(child_id, mid), True


def _answered(sessions: SessionService, child_id: SessionId, mid: MessageId) -> bool:
    """A start by id found its child created: answer for its prompt, so that a
    failing creator leaves it (``withdraw_unheld``) -- this caller is told it
    exists. False when there is no such child (never made, or withdrawn)."""
    if sessions.header(child_id) is None:
        return False
    try:
        sessions.answer_unheld(child_id, mid)  # False: done, the child ran it
    except SubagentError as exc:
        if exc.code != ErrorCode.SESSION_NOT_FOUND:
            raise
        return False
    return True
