"""The private surface of pykka we rely on (``actors/_kernel/_pykka.py``) is there.

pykka is pinned below its next major version; this checks, name by name, that the
installed one still has what the runtimes call or override, with the shape they
expect, so an upgrade that moves something fails here first.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.metadata
import inspect
from typing import Any

import pykka
import pytest
from subagents.actors._kernel import _pykka
from subagents.actors._kernel._refindex import RefIndex

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
    expected = {
        "_handle_receive": ["self", "message"],
        "_handle_failure": ["self", "exception_type", "exception_value", "traceback"],
    }.get(name, ["self"])
    assert params == expected, (name, params)


def test_the_loop_we_copy_is_the_one_we_copied() -> None:
    """The agent actor runs a copy of pykka's loop (``_kernel/_loop.py``): an
    upgrade that changes pykka's must fail here, so the copy is made again."""
    source = inspect.getsource(pykka.Actor._actor_loop_running)
    assert hashlib.sha256(source.encode()).hexdigest() == _pykka.LOOP_SOURCE_SHA256


def test_the_constructor_we_replace_is_the_one_we_replaced() -> None:
    """Both runtimes' actors set what ``pykka.Actor.__init__`` sets themselves
    (``_kernel/_actorinit.py``): an upgrade that changes it must fail here."""
    source = inspect.getsource(pykka.Actor.__init__)
    assert hashlib.sha256(source.encode()).hexdigest() == _pykka.INIT_SOURCE_SHA256


@pytest.mark.parametrize("backend", ["threading", "gevent"])
def test_an_actor_has_what_pykkas_constructor_gives(backend: str) -> None:
    """urn (a version-4 UUID urn, unique), inbox, stopped event and ref, as pykka's."""
    import uuid

    from subagents.actors import get_backend

    base = get_backend(backend).actor_class

    class Echo(base):  # type: ignore[misc,valid-type]
        def on_receive(self, message: Any) -> Any:
            return message

    refs = [Echo.start() for _ in range(3)]
    try:
        assert len({ref.actor_urn for ref in refs}) == 3
        for ref in refs:
            parsed = uuid.UUID(ref.actor_urn.removeprefix("urn:uuid:"))
            assert parsed.urn == ref.actor_urn and parsed.version == 4
            assert parsed.variant == uuid.RFC_4122
            assert ref.ask("x") == "x"
            assert not ref.actor_stopped.is_set()
            assert pykka.ActorRegistry.get_by_urn(ref.actor_urn) is ref
    finally:
        for ref in refs:
            ref.stop()
    assert all(ref.actor_stopped.is_set() for ref in refs)


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


@pytest.mark.parametrize("name", _pykka.REGISTRY_ATTRIBUTES)
def test_the_registry_attributes_exist(name: str) -> None:
    assert hasattr(pykka.ActorRegistry, name)


def test_the_registry_keeps_its_meaning_over_the_index(backend: Any) -> None:
    """The registry's refs are a ``RefIndex`` once the runtime is imported, and every
    registry call means what it meant: start order, lookups by class, name and
    urn, an actor gone once stopped, ``stop_all`` newest first."""
    assert isinstance(pykka.ActorRegistry._actor_refs, RefIndex)
    stopped: list[int] = []

    class Numbered(backend.actor_class):  # type: ignore[misc,name-defined]
        def __init__(self, n: int) -> None:
            super().__init__()
            self.n = n

        def on_stop(self) -> None:
            stopped.append(self.n)

    refs = [Numbered.start(n) for n in range(5)]
    assert pykka.ActorRegistry.get_all() == refs
    assert pykka.ActorRegistry.get_by_class(Numbered) == refs
    assert pykka.ActorRegistry.get_by_class_name("Numbered") == refs
    assert pykka.ActorRegistry.get_by_urn(refs[2].actor_urn) is refs[2]
    refs[2].stop()
    assert pykka.ActorRegistry.get_all() == refs[:2] + refs[3:]
    assert pykka.ActorRegistry.get_by_urn(refs[2].actor_urn) is None
    pykka.ActorRegistry.stop_all()
    assert stopped == [2, 4, 3, 1, 0]
    assert pykka.ActorRegistry.get_all() == []


def test_removing_a_ref_compares_it_with_no_other() -> None:
    """Unregistering costs the same however many actors run: no ref is compared
    with the others (pykka's own list compares it with every ref before it, twice),
    and a ref listed twice is removed once at a time, as from a list."""

    class Ref:
        compared = 0

        def __eq__(self, other: object) -> bool:
            Ref.compared += 1
            return self is other

        __hash__ = object.__hash__

    refs = [Ref() for _ in range(2000)]
    index = RefIndex(refs)
    for ref in reversed(refs):  # newest first: the far end of the list
        assert ref in index
        index.remove(ref)
    assert Ref.compared == 0 and len(index) == 0
    listed = [Ref() for _ in range(1000)]
    for ref in reversed(listed):
        assert ref in listed
        listed.remove(ref)
    assert Ref.compared > 100_000  # what the list costs: the test can tell them apart
    one, other = Ref(), Ref()
    index = RefIndex([one, other, one])
    assert list(index) == [one, one, other] and len(index) == 3 and index[:] == list(index)
    index.remove(one)
    assert list(index) == [one, other]
    index.remove(one)
    with pytest.raises(ValueError):
        index.remove(one)
