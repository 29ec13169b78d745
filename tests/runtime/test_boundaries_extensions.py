"""Bad values from the code a user plugs in -- listeners, providers, model
factories -- refused with a typed error where they are handed over, before
anything is created (R-ERR-1). Each case was found feeding odd values to the
extension points; each fails on the code before its fix (checked).
"""

from __future__ import annotations

from typing import Any

import pytest
from subagents.actors import (
    AbortController,
    ContinuableCreateSpec,
    ContinuableStartSpec,
    LocalProvider,
    Runtime,
)
from subagents.actors._kernel._backend import Backend
from subagents.protocol import ErrorCode, MessageEvent, MessageId, SubagentError
from subagents.store import MemoryStore


def _code(call: Any) -> str:
    with pytest.raises(SubagentError) as caught:
        call()
    return str(caught.value.code)


def test_a_listener_that_is_not_callable_is_refused(rt: Runtime) -> None:
    """R-ERR-1: an idle, dispose, cancel or abort listener must be callable -- it used
    to be taken, then logged as a TypeError at every event it was meant to hear."""
    agent = rt.spawn("echo")
    for add in (agent.add_idle_listener, agent.add_dispose_listener, agent.add_cancel_listener):
        assert _code(lambda add=add: add(5)) == ErrorCode.INVALID_ARGUMENT
    controller = AbortController()
    signal = controller.signal
    assert _code(lambda: signal.add_listener("not a function")) == ErrorCode.INVALID_ARGUMENT
    heard: list[Any] = []
    idle = rt.backend.event()
    agent.add_idle_listener(lambda a: (heard.append(a), idle.set()))  # a callable works
    agent.followup("hi")
    assert idle.wait(10)  # (it runs in the actor once idle: wait_idle may return first)
    signal.add_listener(heard.append)
    controller.abort("stop")
    assert heard[-1] == "stop" and agent in heard


class _Seeded(LocalProvider):
    """A provider whose ``prepare_continuable`` returns whatever the test sets."""

    answer: Any = None

    def prepare_continuable(self, request: ContinuableStartSpec) -> Any:
        return self.answer


_ANSWERS = [
    (5, ErrorCode.INVALID_ARGUMENT),
    (None, ErrorCode.INVALID_ARGUMENT),
    (ContinuableCreateSpec(seed=5), ErrorCode.INVALID_ARGUMENT),  # type: ignore[arg-type]
    (ContinuableCreateSpec(seed="ab"), ErrorCode.INVALID_ARGUMENT),  # type: ignore[arg-type]
    (ContinuableCreateSpec(seed=(1, 2)), ErrorCode.INVALID_ARGUMENT),  # type: ignore[arg-type]
    (
        ContinuableCreateSpec(
            seed=(MessageEvent(message_id=MessageId("ab" * 16), content={1j: 2}),)
        ),
        ErrorCode.ENCODE_ERROR,
    ),
]


@pytest.mark.parametrize("by_id", [False, True], ids=["live-parent", "parent-by-id"])
def test_a_provider_answer_that_cannot_seed_a_child_is_refused(
    backend: Backend, by_id: bool
) -> None:
    """R-ERR-1, R-CAP-9: ``prepare_continuable`` must answer a
    :class:`ContinuableCreateSpec` whose seed is events the log can hold. A seed of
    non-events was taken, the child made, and its session then failed to persist
    in the background (the child vanished); a seed that is no sequence raised a
    bare ``TypeError``. Now each is refused at the start and no child exists."""
    with Runtime(MemoryStore(), backend=backend) as rt:
        provider = _Seeded(rt, "seeded")
        rt.subagents.register_provider(provider)
        root = rt.spawn("echo")
        parent: Any = root.session_id if by_id else root
        for i, (answer, code) in enumerate(_ANSWERS):
            provider.answer = answer
            spec = ContinuableStartSpec(parent=parent, provider="seeded", prompt="x", label=f"k{i}")
            assert _code(lambda spec=spec: rt.subagents.start_continuable(spec)) == code, answer
        assert rt.subagents.list_children(root.session_id).rows == ()
        good = MessageEvent(message_id=MessageId("ab" * 16), content="from the parent")
        provider.answer = ContinuableCreateSpec(seed=[good])  # a list is a sequence too
        spec = ContinuableStartSpec(parent=parent, provider="seeded", prompt="x", label="ok")
        child = rt.subagents.start_continuable(spec).child_id
        assert rt.sessions.read(child)[0].event == good


def test_a_model_factory_that_raises_is_a_model_error(backend: Backend) -> None:
    """R-ERR-1: a registered model's factory that raises fails the spawn or start with
    ``MODEL_ERROR``, its exception as the cause, and nothing is created; a
    ``SubagentError`` of its own passes through as it is."""

    def broken(_options: Any) -> Any:
        raise ZeroDivisionError("no behaviour today")

    def refusing(_options: Any) -> Any:
        raise SubagentError("no key", code=ErrorCode.INVALID_ARGUMENT)

    with Runtime(MemoryStore(), backend=backend) as rt:
        rt.models.register("broken", broken)
        rt.models.register("refusing", refusing)
        with pytest.raises(SubagentError) as caught:
            rt.spawn("broken")
        assert caught.value.code == ErrorCode.MODEL_ERROR
        assert isinstance(caught.value.__cause__, ZeroDivisionError)
        assert "broken" in str(caught.value) and "no behaviour today" in str(caught.value)
        assert _code(lambda: rt.spawn("refusing")) == ErrorCode.INVALID_ARGUMENT
        assert rt.agents.roots() == []
        root = rt.spawn("echo")
        start = ContinuableStartSpec(
            parent=root, provider="local", prompt="x", label="kid", model="broken"
        )
        assert _code(lambda: rt.subagents.start_continuable(start)) == ErrorCode.MODEL_ERROR
        assert rt.subagents.list_children(root.session_id).rows == ()
        assert [h.id for h in rt.agents.roots()] == [root.session_id]
