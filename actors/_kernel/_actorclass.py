"""One actor class per (backend actor base, behaviour), built once.

An actor's *behaviour* (the agent loop, the registry, the supervisor, the
dispatcher) is a plain class written without a pykka base; :func:`actor_class`
mixes it into the backend's actor base (``ThreadActor`` or ``GeventActor``) the
first time the pair is asked for, so no layer repeats a per-backend factory and
supervision never imports the runtimes.
"""

from __future__ import annotations

import threading
from typing import Any

import pykka

__all__ = ["actor_class"]

_CLASSES: dict[tuple[type[pykka.Actor], type], type[pykka.Actor]] = {}
_LOCK = threading.Lock()


def actor_class(base: type[pykka.Actor], behaviour: type[Any]) -> type[pykka.Actor]:
    """``behaviour`` mixed into ``base`` (behaviour first in the MRO), cached."""
    key = (base, behaviour)
    cls = _CLASSES.get(key)
    if cls is None:
        with _LOCK:
            cls = _CLASSES.get(key)
            if cls is None:
                cls = type(
                    f"{behaviour.__name__}[{base.__name__}]",
                    (behaviour, base),
                    {"__module__": behaviour.__module__},
                )
                _CLASSES[key] = cls
    return cls
