"""pykka's actor loop, holding no message while it waits for the next.

pykka's ``Actor._actor_loop_running`` keeps the envelope it handled last (and
its response) in locals while it waits in ``actor_inbox.get()`` for the next
one. An agent's envelope is its message itself (see :mod:`._pykka`): an idle
continuable child kept its last follow-up -- content, id, source -- for as long
as it stayed resident, a million of them at once. :class:`ForgetfulLoop` is
pykka 4's loop with the two locals dropped after each message, and nothing else
changed; ``tests/actors/test_pykka_contract.py`` holds pykka's loop to the
source this copy was made from (:data:`._pykka.LOOP_SOURCE_SHA256`).
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from pykka import ActorRegistry

__all__ = ["ForgetfulLoop"]

logger = logging.getLogger("pykka")  # (pykka's own: its records stay where they were)


class ForgetfulLoop:
    """Mixed in before a pykka actor base: its loop forgets each message once handled."""

    actor_stopped: Any
    actor_inbox: Any

    def _actor_loop_running(self) -> None:
        actor: Any = self
        while not actor.actor_stopped.is_set():
            envelope = actor.actor_inbox.get()
            try:
                response = actor._handle_receive(envelope.message)
                if envelope.reply_to is not None:
                    envelope.reply_to.set(response)
            except Exception:
                if envelope.reply_to is not None:
                    logger.info(
                        f"Exception returned from {actor} to caller:",
                        exc_info=sys.exc_info(),
                    )
                    envelope.reply_to.set_exception()
                else:
                    actor._handle_failure(*sys.exc_info())
                    try:
                        actor.on_failure(*sys.exc_info())
                    except Exception:
                        actor._handle_failure(*sys.exc_info())
            except BaseException:
                exception_value = sys.exc_info()[1]
                logger.debug(f"{exception_value!r} in {actor}. Stopping all actors.")
                actor._stop()
                ActorRegistry.stop_all()
            envelope = response = None  # the one change: nothing held while waiting
