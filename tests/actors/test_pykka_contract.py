"""The private surface of pykka we rely on (``actors/_kernel/_pykka.py``) is there.

pykka is pinned below its next major version; this checks, name by name, that the
installed one still has what the runtimes call or override, with the shape they
expect, so an upgrade that moves something fails here first.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
from typing import Any

import pykka
import pytest
from subagents.actors._kernel import _pykka

OWNERS = {"Actor": pykka.Actor, "Future": pykka.Future}


@pytest.mark.parametrize("hook", _pykka.RUNTIME_HOOKS)
def test_runtime_hooks_exist(hook: str) -> None:
    assert callable(getattr(pykka.Actor, hook))


@pytest.mark.parametrize(("owner", "name"), _pykka.PRIVATE_ATTRIBUTES)
def test_private_attributes_exist(owner: str, name: str) -> None:
    if owner == "Future":
        future = pykka.ThreadingFuture[object]()
        assert hasattr(future, name)
        assert getattr(future, name) is None  # no get hook until one is set
        return
    member = getattr(OWNERS[owner], name)
    assert callable(member)
    params = list(inspect.signature(member).parameters)
    assert params[0] == "self"
    expected = ["self", "message"] if name == "_handle_receive" else ["self"]
    assert params == expected, (name, params)


def test_the_envelope_protocol_of_the_loop() -> None:
    """An inbox item has ``message`` and ``reply_to``; ``tell`` puts ``reply_to=None``."""
    from pykka._envelope import Envelope

    envelope = Envelope("m")
    assert all(hasattr(envelope, field) for field in _pykka.ENVELOPE_FIELDS)
    assert envelope.message == "m" and envelope.reply_to is None
    source = inspect.getsource(pykka.Actor._actor_loop_running)
    assert "envelope.message" in source and "envelope.reply_to" in source


@pytest.mark.parametrize(
    ("module", "name"),
    [(m, n) for m, names in _pykka.TYPING_NAMES.items() for n in names],
)
def test_typing_names_import(module: str, name: str) -> None:
    assert hasattr(importlib.import_module(module), name)


def test_the_stop_message_stops_an_actor_after_what_it_accepted(backend: Any) -> None:
    """``tell(STOP)`` is what ``ActorRef.stop`` sends: messages told before it run first."""
    seen: list[str] = []

    class Recorder(backend.actor_class):  # type: ignore[misc,name-defined]
        def on_receive(self, message: Any) -> Any:
            seen.append(message)

        def on_stop(self) -> None:
            seen.append("stopped")

    ref = Recorder.start()
    ref.tell("first")
    ref.tell(_pykka.STOP)
    assert ref.actor_stopped.wait(10)
    assert seen == ["first", "stopped"]
    assert not ref.is_alive()


def test_the_version_is_inside_the_pin() -> None:
    version = importlib.metadata.version("pykka")
    assert version.split(".")[0] == "4", version
