"""The provider registry: named child implementations, in insertion order.

Registration is effect-scoped: ``dispose()`` of the returned registration removes
the provider so no new child starts through it, and runs already returned to
their callers stay alive. Additions and removals are announced as
``subagent/provider-added`` / ``subagent/provider-removed``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from subagents.protocol import (
    ErrorCode,
    OneShotDescriptor,
    SubagentError,
    check_name,
    snapshot_subagent_descriptor,
)

from ._events import EventBus
from ._types import CAPABILITIES, SubagentEvent, SubagentProvider

__all__ = ["ProviderRegistration", "ProviderRegistry"]


class ProviderRegistration:
    """Returned by ``register_provider``; ``dispose()`` removes the provider."""

    def __init__(self, registry: ProviderRegistry, provider: SubagentProvider) -> None:
        self._registry = registry
        self.provider = provider
        self._disposed = False

    def dispose(self) -> None:
        """Remove the provider (idempotent). Runs already returned stay alive."""
        if not self._disposed:
            self._disposed = True
            self._registry._remove(self.provider)


def _bad(message: str) -> SubagentError:
    return SubagentError(message, code=ErrorCode.INVALID_ARGUMENT)


class ProviderRegistry:
    """Providers by name. Thread-safe.

    ``on_added`` (the runtime's) is called after each registration: what a sweep
    found and could not activate for want of the provider is looked at again."""

    def __init__(self, events: EventBus) -> None:
        self._events = events
        self._lock = threading.Lock()
        self._providers: dict[str, SubagentProvider] = {}
        self.on_added: Callable[[], object] | None = None

    def register(self, provider: SubagentProvider) -> ProviderRegistration:
        """Register ``provider`` under ``provider.name``.

        Raises:
            SubagentError: ``PROVIDER_EXISTS`` for a name already registered
                (nothing changes), ``INVALID_ARGUMENT`` for a malformed provider.
        """
        name = getattr(provider, "name", None)
        if type(name) is not str or not name:
            raise _bad("a provider needs a non-empty str name")
        check_name(name, "a provider's name")  # UTF-8 can encode it
        try:  # every child it starts records it in a descriptor
            snapshot_subagent_descriptor(OneShotDescriptor(provider=name))
        except SubagentError as exc:
            raise _bad(f"a provider's name must fit a descriptor: {exc}") from None
        if not callable(getattr(provider, "start", None)):
            raise _bad(f"provider {name!r} has no start(request, descriptor)")
        caps = getattr(provider, "capabilities", None)
        if not isinstance(caps, frozenset) or not caps <= CAPABILITIES:
            raise _bad(
                f"provider {name!r} capabilities must be a frozenset of {sorted(CAPABILITIES)}"
            )
        with self._lock:
            if name in self._providers:
                raise SubagentError(
                    f"a provider named {name!r} is already registered",
                    code=ErrorCode.PROVIDER_EXISTS,
                )
            self._providers[name] = provider
        self._events.emit(SubagentEvent(type="subagent/provider-added", provider=name), None)
        if self.on_added is not None:
            self.on_added()
        return ProviderRegistration(self, provider)

    def _remove(self, provider: SubagentProvider) -> None:
        with self._lock:
            if self._providers.get(provider.name) is not provider:
                return
            del self._providers[provider.name]
        self._events.emit(
            SubagentEvent(type="subagent/provider-removed", provider=provider.name), None
        )

    def get(self, name: str) -> SubagentProvider | None:
        """The registered provider, or None."""
        return self._providers.get(name) if type(name) is str else None

    def require(self, name: str) -> SubagentProvider:
        """The registered provider; ``PROVIDER_NOT_FOUND`` when absent."""
        provider = self.get(name)
        if provider is None:
            raise SubagentError(f"no provider named {name!r}", code=ErrorCode.PROVIDER_NOT_FOUND)
        return provider

    def names(self) -> list[str]:
        """Registered provider names in insertion order."""
        with self._lock:
            return list(self._providers)
