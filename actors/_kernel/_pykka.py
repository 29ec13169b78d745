"""pykka's private surface, named in one place.

pykka gives runtimes three hooks on :class:`pykka.Actor`
(``_create_actor_inbox``, ``_create_future``, ``_start_actor_loop``), and the
gevent runtime is written against exactly those. Everything else private that
this package touches is listed here, so an upgrade that moves one of them fails
one contract test (``tests/actors/test_pykka_contract.py``) instead of a
runtime path; setup.cfg pins ``pykka>=4.1,<5`` for the same reason.

What we rely on, and why:

* ``Actor._actor_loop``, ``Actor._stop``, ``Actor._actor_loop_teardown`` -- the
  gevent loop greenlet runs pykka's loop, and a greenlet killed from outside stops
  its actor the way pykka's own teardown does.
* ``Actor.__init__``'s body -- both runtimes' actors set its four fields
  (``actor_urn``, ``actor_inbox``, ``actor_stopped``, ``_actor_ref``) themselves
  (:mod:`._actorinit`): the gevent actor with a lighter ``actor_stopped`` event,
  both with a cheaper urn; the body is the one whose digest is
  :data:`INIT_SOURCE_SHA256`.
* ``Actor._handle_receive`` -- the agent actor dispatches its own messages before
  pykka tests four message types of its own (a measurable share of a turn).
* ``Actor._actor_loop_running`` (and the ``_handle_failure`` it calls) -- the
  agent actor runs a copy of pykka's loop that holds no message while it waits
  (:mod:`._loop`); the copy is of the source whose digest is
  :data:`LOOP_SOURCE_SHA256`.
* ``Future._get_hook`` -- the gevent future honours ``set_get_hook`` like pykka's.
* ``pykka.messages._ActorStop`` -- an agent stops itself (or is stopped by the
  supervisor, 10,000 at a time in a drain) by telling its actor this message;
  the public ``ActorRef.stop(block=False)`` makes two futures per stop for
  replies nobody reads (a third of a settlement's dispatch, measured).
* the envelope protocol of the loop: an inbox item has ``message`` and
  ``reply_to`` -- the agent puts its own messages into its inbox as their own
  envelopes, saving an allocation per follow-up.
* ``ActorRegistry._actor_refs`` (and its lock, ``_actor_refs_lock``) -- the
  registry's list of running actors' refs, swapped at import for an index with
  constant-time removal (:mod:`._refindex`): pykka removes a stopped actor's ref
  by two linear scans, quadratic over a drain or close of thousands of actors.
* typing only: ``pykka._envelope.Envelope``, ``pykka._actor.ActorInbox``,
  ``pykka._future.GetHookFunc``, ``pykka._types.OptExcInfo``.
"""

from __future__ import annotations

from typing import Final

from pykka.messages import _ActorStop

__all__ = [
    "ENVELOPE_FIELDS",
    "INIT_SOURCE_SHA256",
    "LOOP_SOURCE_SHA256",
    "PRIVATE_ATTRIBUTES",
    "REGISTRY_ATTRIBUTES",
    "RUNTIME_HOOKS",
    "STOP",
    "TYPING_NAMES",
]

#: The message that stops an actor after what it has already accepted (``tell`` it).
STOP: Final = _ActorStop()

#: The hooks pykka documents for runtimes.
RUNTIME_HOOKS: Final = ("_create_actor_inbox", "_create_future", "_start_actor_loop")

#: ``(class, attribute)`` pairs of pykka's private surface that we call or override.
PRIVATE_ATTRIBUTES: Final = (
    ("Actor", "_actor_loop"),
    ("Actor", "_stop"),
    ("Actor", "_actor_loop_teardown"),
    ("Actor", "_handle_receive"),
    ("Actor", "_actor_loop_running"),
    ("Actor", "_handle_failure"),
    ("Future", "_get_hook"),
)

#: sha256 of ``inspect.getsource(pykka.Actor._actor_loop_running)`` (pykka 4.5.0)
#: that :class:`._loop.ForgetfulLoop` copies: another digest, and the copy is stale.
LOOP_SOURCE_SHA256: Final = "4109f316d2be434e5a2a178eda154e0eb17919333986a4b505f33091e4987dbd"

#: sha256 of ``inspect.getsource(pykka.Actor.__init__)`` (pykka 4.5.0), whose body
#: :func:`._actorinit.init_actor` sets instead: another digest, and it is stale.
INIT_SOURCE_SHA256: Final = "bf2a25172af23b0c5bfe1363dd690e9355086349a253f6818ed8d4a3bdfbc2b6"

#: ``ActorRegistry``'s class attributes behind :func:`._refindex.install`.
REGISTRY_ATTRIBUTES: Final = ("_actor_refs", "_actor_refs_lock")

#: Attributes every inbox item must have for pykka's loop (and for our own messages).
ENVELOPE_FIELDS: Final = ("message", "reply_to")

#: ``module: names`` imported for type checking only.
TYPING_NAMES: Final = {
    "pykka._envelope": ("Envelope",),
    "pykka._actor": ("ActorInbox",),
    "pykka._future": ("GetHookFunc",),
    "pykka._types": ("OptExcInfo",),
}
