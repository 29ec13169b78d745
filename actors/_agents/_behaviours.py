"""Behaviours by name (``runtime.models``).

A *behaviour* runs an agent's turns: an object with ``on_turn(turn)`` or a plain
callable taking the turn; its return value is the turn's output. Behaviours are
registered by *model name* because a cold-resumed child is rebuilt from its durable
descriptor alone, which records the model name, never a Python object.

A factory takes the agent's :class:`AgentOptions` and returns a fresh behaviour.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from subagents.protocol import ErrorCode, SubagentError, check_name, error_text

from ._options import AgentOptions

if TYPE_CHECKING:
    from ._turn import Turn

__all__ = ["Behaviour", "BehaviourFactory", "ModelRegistry", "as_behaviour", "echo"]


@runtime_checkable
class Behaviour(Protocol):
    """What runs an agent's turns."""

    def on_turn(self, turn: Turn) -> Any:
        """Run one turn: return its output (any value the log can hold), or raise to fail it."""


BehaviourFactory = Callable[["AgentOptions"], "Behaviour | Callable[[Turn], Any]"]


class _CallableBehaviour:
    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Turn], Any]) -> None:
        self.fn = fn

    def on_turn(self, turn: Turn) -> Any:
        return self.fn(turn)


def turn_function(behaviour: Behaviour) -> Callable[[Turn], Any]:
    """What to call for each turn of ``behaviour``: a plain callable's function
    itself, not its wrapper's method (one call less a turn)."""
    if type(behaviour) is _CallableBehaviour:
        return behaviour.fn
    return behaviour.on_turn


def as_behaviour(obj: Any) -> Behaviour:
    """Accept a behaviour object or a plain callable; else ``INVALID_ARGUMENT``."""
    # hasattr, not isinstance(obj, Behaviour): runtime-checkable Protocol checks
    # cost microseconds, and this runs for every agent created.
    if callable(getattr(obj, "on_turn", None)):
        return obj  # type: ignore[no-any-return]
    if callable(obj):
        return _CallableBehaviour(obj)
    raise SubagentError(
        f"a behaviour has on_turn(turn) or is callable, got {type(obj).__name__}",
        code=ErrorCode.INVALID_ARGUMENT,
    )


def echo(turn: Turn) -> Any:
    """The built-in ``echo`` model: the output is the last delivered content."""
    return turn.content


class ModelRegistry:
    """Model name → behaviour factory. Thread-safe.

    ``on_added`` (the runtime's) is called after each registration: what a sweep
    found and could not activate for want of the model is looked at again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._factories: dict[str, BehaviourFactory] = {"echo": lambda _options: echo}
        self.on_added: Callable[[], object] | None = None

    def register(self, name: str, factory: BehaviourFactory, *, replace: bool = False) -> None:
        """Register ``factory`` under ``name``.

        Raises:
            SubagentError: ``INVALID_ARGUMENT`` for a bad name or factory, or a
                name already registered without ``replace=True``.
        """
        if type(name) is not str or not name:
            raise SubagentError("a model name is a non-empty str", code=ErrorCode.INVALID_ARGUMENT)
        check_name(name, "a model name")  # recorded in logs: UTF-8 must encode it
        if not callable(factory):
            raise SubagentError("a model factory is callable", code=ErrorCode.INVALID_ARGUMENT)
        with self._lock:
            if name in self._factories and not replace:
                raise SubagentError(
                    f"model {name!r} is already registered", code=ErrorCode.INVALID_ARGUMENT
                )
            self._factories[name] = factory
        if self.on_added is not None:
            self.on_added()

    def unregister(self, name: str) -> None:
        """Forget a model name; agents already built from it keep their behaviour."""
        with self._lock:
            self._factories.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._factories

    def names(self) -> list[str]:
        """The registered model names, sorted."""
        with self._lock:
            return list(self._factories)

    def require(self, name: str) -> BehaviourFactory:
        """The factory for ``name``; ``MODEL_NOT_FOUND`` when absent."""
        factory = self._factories.get(name) if type(name) is str else None
        if factory is None:
            raise SubagentError(f"no model named {name!r}", code=ErrorCode.MODEL_NOT_FOUND)
        return factory

    def create(self, name: str, options: AgentOptions) -> Behaviour:
        """Build a fresh behaviour for ``options``.

        Raises:
            SubagentError: ``MODEL_NOT_FOUND``; ``MODEL_ERROR`` when the factory
                raises (its exception is the cause; a ``SubagentError`` of its own
                is raised as it is); ``INVALID_ARGUMENT`` for what is no behaviour.
        """
        factory = self.require(name)
        try:
            made = factory(options)
        except SubagentError:
            raise
        except Exception as exc:
            raise SubagentError(
                error_text(exc, f"model {name!r}: its factory raised "), code=ErrorCode.MODEL_ERROR
            ) from exc
        return as_behaviour(made)
