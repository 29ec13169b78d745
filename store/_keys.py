"""Stored session keys that are not session ids.

A SQL store keys every session row by its id's 16 raw bytes. A row whose key is
anything else (another length, a text or a number: hand-edited or damaged data)
has no :class:`~subagents.protocol.SessionId`; reads name it by a
:class:`StoredKey` instead (a :class:`~subagents.protocol.CorruptRecordError`'s
``session_id``, a listing diagnostic's ``id``), so the damage stays local to that
row and the key is still shown to a person.
"""

from __future__ import annotations

from typing import Final

__all__ = ["StoredKey", "raw_key"]

_ID_BYTES: Final = 16


class StoredKey(str):
    """A stored key that is no session id, spelled as an SQL literal.

    A blob is ``x'<hex>'`` (``x'0102'``), a text is quoted (``'abc'``), a number is
    its digits, a missing value ``NULL``: what ``sqlite3``'s shell takes in
    ``WHERE id = ...``. It is never 32 bare hex digits, so it cannot be mistaken
    for a :class:`~subagents.protocol.SessionId` (both are ``str``).
    """

    __slots__ = ()

    @classmethod
    def of(cls, value: object) -> StoredKey:
        """The key for a stored value (bytes, memoryview, text, number or None)."""
        if isinstance(value, (bytes, bytearray, memoryview)):
            text = f"x'{bytes(value).hex()}'"
        elif isinstance(value, str):
            text = "'" + value.replace("'", "''") + "'"
        elif value is None:
            text = "NULL"
        else:
            text = str(value)
        return str.__new__(cls, text)

    def describe(self) -> str:
        """What is wrong with the key, for a diagnostic's detail."""
        if self.startswith("x'"):
            return f"stored session key {self} is {(len(self) - 3) // 2} bytes, not a 16-byte id"
        return f"stored session key {self} is not a 16-byte id"

    def __repr__(self) -> str:
        return f"StoredKey({str.__repr__(self)})"


def raw_key(value: object) -> bytes | StoredKey:
    """A stored id column's value as the 16 bytes of a session id, or as the
    :class:`StoredKey` naming it when it is anything else."""
    if type(value) is not bytes:
        if not isinstance(value, (bytearray, memoryview)):
            return StoredKey.of(value)
        value = bytes(value)
    if len(value) != _ID_BYTES:
        return StoredKey.of(value)
    return value
