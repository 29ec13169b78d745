"""Request, result and lifecycle-event types of the subagent service."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Protocol, runtime_checkable

from subagents.actors._kernel._future import ResultFuture
from subagents.actors._kernel._signal import AbortSignal
from subagents.protocol import (
    ErrorCode,
    Event,
    MessageId,
    RunId,
    SessionId,
    SubagentError,
    encode_event,
)

if TYPE_CHECKING:
    from subagents.actors._agents._agent import Agent
    from subagents.protocol import OneShotDescriptor

__all__ = [
    "CAPABILITIES",
    "AncestorAuthority",
    "ContinuableCreateSpec",
    "ContinuableHandle",
    "ContinuableStartSpec",
    "RunResult",
    "SubagentEvent",
    "SubagentProvider",
    "SubagentRun",
    "SubagentStartRequest",
    "UserAuthority",
]

#: The start-time features a provider may advertise in ``capabilities``.
CAPABILITIES: Final = frozenset({"output_schema", "depth_limit", "tool_filter", "persona"})


class RunResult(NamedTuple):
    """A one-shot run's settled result."""

    output: Any
    structured: Any
    stop_reason: str


@dataclass(kw_only=True, eq=False)
class SubagentStartRequest:
    """An ordinary one-shot delegation request.

    ``signal`` is required: it is the canonical cancellation channel of the run.
    ``label`` is the optional durable display label. ``model``, ``output_schema``
    (a JSON Schema), ``max_depth`` (levels below the parent), ``tool_filter`` and
    ``persona`` select the child's model and capabilities. The service borrows the
    request: it neither copies nor mutates it.

    ``message_id`` (32 lowercase hex digits; else ``INVALID_ARGUMENT``) makes the
    start take effect once per parent, as for a continuable start: the built-in
    providers derive the child's id from the parent's and this id (the child's
    prompt carries it). A start again with an id used under the same parent
    returns the earlier child's run already settled with its recorded result
    (no local agent, nothing runs) when that run completed; else -- it failed,
    was cancelled, or its process died in it -- the child runs once more, as a
    new child, so one id never leaves two completed children. A provider of
    your own receives the id and may deduplicate likewise.
    """

    parent: Agent
    prompt: Any
    signal: AbortSignal | None = None
    label: str | None = None
    model: str | None = None
    output_schema: Mapping[str, Any] | None = None
    max_depth: int | None = None
    tool_filter: Sequence[str] | None = None
    persona: str | None = None
    message_id: MessageId | str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class ContinuableCreateSpec:
    """What ``prepare_continuable`` returns: data only, never a capability.

    ``seed`` (events) becomes the first part of the child's log, ahead of its own
    descriptor.
    """

    seed: tuple[Event, ...] | None = None


def created_seed(create: object, provider: str) -> tuple[Event, ...]:
    """The seed events of provider ``provider``'s ``prepare_continuable`` answer,
    checked before anything of the child exists: the answer is a
    :class:`ContinuableCreateSpec` whose ``seed`` is None or a list or tuple of
    events the log can hold.

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` for another answer or seed,
            ``ENCODE_ERROR`` for an event the log cannot hold.
    """
    if not isinstance(create, ContinuableCreateSpec):
        raise SubagentError(
            f"provider {provider!r}: prepare_continuable returned {type(create).__name__},"
            " not a ContinuableCreateSpec",
            code=ErrorCode.INVALID_ARGUMENT,
        )
    seed: object = create.seed  # whatever the provider put there
    if seed is None:
        return ()
    if type(seed) is not tuple and type(seed) is not list:
        raise SubagentError(
            f"provider {provider!r}: a seed is a list or tuple of events,"
            f" got {type(seed).__name__}",
            code=ErrorCode.INVALID_ARGUMENT,
        )
    for event in seed:
        if not isinstance(event, Event):
            raise SubagentError(
                f"provider {provider!r}: a seed holds events, got {type(event).__name__}",
                code=ErrorCode.INVALID_ARGUMENT,
            )
        encode_event(event)  # write-behind would find it only after the child exists
    return tuple(seed)


@dataclass(kw_only=True, eq=False)
class ContinuableStartSpec:
    """A continuable start: parent, provider, initial prompt and required label.

    ``max_inbox`` bounds the child's inbox (default: the runtime's ``max_inbox``):
    a follow-up finding that many messages accepted and not done raises
    ``INBOX_FULL``. It is recorded in the child's session, so it holds for every
    process and every later activation.

    ``parent`` is the live parent agent, or its session id: a start by id, from a
    process where the parent may not be live (a server worker that does not hold
    the tree; see ``SubagentService.start_continuable``).
    """

    parent: Agent | SessionId | str
    provider: str
    prompt: Any
    label: str
    model: str | None = None
    persona: str | None = None
    tool_filter: Sequence[str] | None = None
    signal: AbortSignal | None = None
    source: Any = None
    message_id: MessageId | str | None = None
    max_inbox: int | None = None


class ContinuableHandle(NamedTuple):
    """``start_continuable``'s result: the child id and the accepted prompt's id."""

    child_id: SessionId
    message_id: MessageId


@dataclass(frozen=True, slots=True)
class UserAuthority:
    """A human presenting the durable direct-parent address of the target."""

    parent_session_id: SessionId | str


@dataclass(frozen=True, slots=True)
class AncestorAuthority:
    """An exact live ancestor agent of the target."""

    agent: Agent


@dataclass(frozen=True, slots=True, kw_only=True)
class SubagentEvent:
    """A lifecycle event.

    ``type`` is ``subagent/start``, ``subagent/end``, ``subagent/provider-added``
    or ``subagent/provider-removed``. Run events carry the service-minted
    ``run_id``, ``local`` (snapshotted from the run's local agent), the provider
    name recorded at creation, the delegating ``parent_session``, the ``child_id``
    and the ``mode``; ``subagent/end`` adds the ``stop_reason``.
    """

    type: str
    provider: str
    run_id: RunId | None = None
    local: bool | None = None
    parent_session: SessionId | None = None
    child_id: str | None = None
    mode: str | None = None
    stop_reason: str | None = None


class SubagentRun:
    """A holder-owned one-shot run: ``id``, ``local_agent``, ``result``, ``dispose()``.

    The holder must call :meth:`dispose` on every path. ``result`` is a future of
    :class:`RunResult`; child-level failures settle it with a non-``completed``
    stop reason.
    """

    def __init__(
        self,
        *,
        id: SessionId | str,
        local_agent: Agent | None,
        result: ResultFuture[RunResult],
        dispose: Callable[[float | None], None],
    ) -> None:
        self.id = id
        self.local_agent = local_agent
        self.result = result
        self._dispose = dispose
        self._lock = threading.Lock()
        self._disposing = False
        self._done = ResultFuture[None]()

    def dispose(self, timeout: float | None = 60.0) -> None:
        """Cancel remaining work, wait for result settlement and quiescence.

        Idempotent; a concurrent call waits for the first. Raises only when
        releasing the child's resources fails (``RESOURCE_RELEASE_FAILED``); a
        rejected result stays on ``result``.
        """
        with self._lock:
            first = not self._disposing
            self._disposing = True
        if not first:
            self._done.get(timeout)
            return
        try:
            self._dispose(timeout)
        except SubagentError as exc:
            self._done.set_exception(exc)
            raise
        except Exception as exc:
            err = SubagentError(
                f"releasing run {self.id} failed: {exc}", code=ErrorCode.RESOURCE_RELEASE_FAILED
            )
            self._done.set_exception(err)
            raise err from exc
        self._done.set_result(None)

    def __repr__(self) -> str:
        return f"<SubagentRun {self.id} {self.result!r}>"


@runtime_checkable
class SubagentProvider(Protocol):
    """A named child implementation.

    ``start(request, descriptor)`` publishes a real child and returns its run, or
    raises after rolling back every unpublished resource. A provider may also
    define ``prepare_continuable(request) -> ContinuableCreateSpec``: its presence is
    the continuable capability.
    """

    name: str
    capabilities: frozenset[str]
    inherits_parent_context: bool

    def start(self, request: SubagentStartRequest, descriptor: OneShotDescriptor) -> SubagentRun:
        """Start a one-shot child for ``request`` (recorded by ``descriptor``); its run."""
