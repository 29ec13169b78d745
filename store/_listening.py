"""A store's wake-up channel, as the runtime's mail task reads it."""

from __future__ import annotations

from typing import Protocol

__all__ = ["Listener"]


class Listener(Protocol):
    """A store's wake-up channel (:meth:`SessionStore.listen`), read by one task.

    ``fileno()`` is what to wait on for readability (None while disconnected);
    :meth:`receive` never blocks: the payloads rung since, or None when the
    connection was lost (rings may have been lost: the caller should sweep);
    :meth:`reconnect` reopens it, and may block for as long as connecting takes.
    """

    address: str

    def fileno(self) -> int | None:
        """A descriptor that polls readable when something may be waiting, or ``None``."""

    def receive(self) -> list[bytes] | None:
        """The payloads that arrived (empty: none yet; ``None``: the connection is lost)."""

    def reconnect(self) -> bool:
        """Reopen a lost connection (blocking); True when it listens again."""

    def close(self) -> None:
        """Stop listening and free the channel. Idempotent."""
