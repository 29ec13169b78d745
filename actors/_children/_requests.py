"""What callers and the supervisor send the registry actor.

Messages (see :mod:`._admission` for what the registry does with each):
``Reserve``, ``Admit`` (carrying a :class:`Request`, whose reply settles later),
``Withdraw``, ``Publish`` (carrying the first :class:`Delivery`), ``Abandon``,
``Hold``, ``Unhold``, ``Cutoff``, ``EndCutoff``, ``Interrupt``; and the
supervisor's notices through a :class:`RegistryInbox`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from subagents.actors._agents import Agent
from subagents.actors._kernel import ResultFuture
from subagents.protocol import ContinuableDescriptor, MessageId, MessageSource, SessionId
from subagents.store import InboxEntry
from subagents.supervision import Activation, NoticeBox

from ._types import AncestorAuthority, UserAuthority

__all__ = [
    "Abandon",
    "Admit",
    "Cutoff",
    "Delivery",
    "EndCutoff",
    "Hold",
    "Interrupt",
    "Publish",
    "RegistryInbox",
    "RemoteAncestor",
    "Request",
    "Reserve",
    "Unhold",
    "Withdraw",
]


class Delivery:
    """One message on its way into a child's inbox; ``committed``: it is in the
    child's durable inbox already, taken by no activation (``accepted_at``: the
    time its acceptance stored, for a retraction); ``duplicate``: the store had
    accepted its id before (nothing new: a steer says so)."""

    __slots__ = ("accepted_at", "committed", "content", "duplicate", "message_id", "source")

    def __init__(
        self,
        content: Any,
        source: MessageSource,
        message_id: MessageId,
        committed: bool = False,
    ) -> None:
        self.content = content
        self.source = source
        self.message_id = message_id
        self.committed = committed
        self.accepted_at: float | None = None
        self.duplicate = False


class Request:
    """A follow-up routed through the registry; ``reply`` settles with the verdict.
    ``delivery`` None: a wake (the child has messages waiting in its durable inbox)."""

    __slots__ = ("child_id", "delivery", "parent", "reply")

    def __init__(self, child_id: SessionId, parent: Agent, delivery: Delivery | None) -> None:
        self.child_id = child_id
        self.parent = parent
        self.delivery = delivery
        self.reply: ResultFuture[Activation | None] = ResultFuture()


class Reserve:
    """``fresh``: the id is the caller's (an idempotent start), so the registry
    refuses it (``SESSION_EXISTS``) while any Activation of it is indexed."""

    __slots__ = ("child_id", "fresh", "parent")

    def __init__(self, child_id: SessionId, parent: Agent, *, fresh: bool = False) -> None:
        self.child_id = child_id
        self.parent = parent
        self.fresh = fresh


class Admit:
    __slots__ = ("request",)

    def __init__(self, request: Request) -> None:
        self.request = request


class Withdraw:
    __slots__ = ("request",)

    def __init__(self, request: Request) -> None:
        self.request = request


class Publish:
    """``hold``: published held, as by :class:`Hold` in the same step."""

    __slots__ = ("activation", "agent", "delivery", "descriptor", "hold", "replay")

    def __init__(
        self,
        activation: Activation,
        agent: Any,  # an Agent, or a PlacedChild
        delivery: Delivery | None,
        descriptor: ContinuableDescriptor,
        replay: Sequence[InboxEntry] = (),
        hold: bool = False,
    ) -> None:
        self.activation = activation
        self.agent = agent
        self.delivery = delivery
        self.descriptor = descriptor
        self.replay = replay  # pending inbox messages of a resumed child, first
        self.hold = hold


class Hold:
    """Keep a resident child from settling while a child below it is woken (an
    admission of its own, ended by :class:`Unhold`)."""

    __slots__ = ("child_id",)

    def __init__(self, child_id: SessionId) -> None:
        self.child_id = child_id


class Unhold:
    __slots__ = ("activation",)

    def __init__(self, activation: Activation) -> None:
        self.activation = activation


class Abandon:
    __slots__ = ("activation",)

    def __init__(self, activation: Activation) -> None:
        self.activation = activation


class Cutoff:
    """``inclusive``: the parents' own Activations are drained too (a drain another
    process asked of a child live here)."""

    __slots__ = ("inclusive", "parents")

    def __init__(self, parents: tuple[Agent, ...], inclusive: bool = False) -> None:
        self.parents = parents
        self.inclusive = inclusive


class EndCutoff:
    __slots__ = ("parent",)

    def __init__(self, parent: Agent) -> None:
        self.parent = parent


class RemoteAncestor:
    """An interrupt's authority: an ancestor of the target live in another process,
    which asked by a ring (its runtime checked the ancestor live; this one checked
    the ancestry in the store before asking the registry)."""

    __slots__ = ("session_id",)

    def __init__(self, session_id: SessionId) -> None:
        self.session_id = session_id


class Interrupt:
    __slots__ = ("authority", "target")

    def __init__(
        self, target: SessionId, authority: UserAuthority | AncestorAuthority | RemoteAncestor
    ) -> None:
        self.target = target
        self.authority = authority


class RegistryInbox(NoticeBox):
    """The registry's notices, posted by the supervisor."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(("retire", "released"))

    def retire(self, activation: Activation) -> None:
        """Retire ``activation`` if admission agrees that it is settled."""
        self.post("retire", activation)

    def released(
        self, activation: Activation, announce: Callable[[Activation], object] | None = None
    ) -> None:
        """``activation``'s epoch is over; ``announce(activation)`` (it posts the
        end's announcement) is called once the registry no longer shows it."""
        self.post("released", activation, announce)
