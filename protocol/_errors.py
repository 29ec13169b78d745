"""One error root for the whole package.

Every failure the runtime raises on purpose is a :class:`SubagentError` carrying a
stable string ``code``. Leaf errors also inherit the stdlib type they resemble
(``DecodeError`` is a ``ValueError``, ``EncodeError`` a ``TypeError``), the way
msgpack's ``FormatError`` is both a ``ValueError`` and an ``UnpackException``, so
callers can catch either.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = [
    "CorruptRecordError",
    "DecodeError",
    "DescriptorCorruptError",
    "DescriptorInvalidError",
    "DescriptorUnsupportedError",
    "EncodeError",
    "ErrorCode",
    "InboxFullError",
    "SubagentError",
    "WrongProcessError",
]


class ErrorCode:
    """The documented error codes (``SubagentError.code``).

    The first four are the seed's own strings, verbatim; the rest name failures the
    seed implies without naming. Codes are stable: a code keeps its meaning once
    released.
    """

    UNAUTHORIZED: Final = "UNAUTHORIZED"
    CANCELLED: Final = "CANCELLED"
    PROJECTIONS_UNAVAILABLE: Final = "SUBAGENT_CONTROL_PROJECTIONS_UNAVAILABLE"
    SESSION_STORE_UNAVAILABLE: Final = "SUBAGENT_CONTROL_SESSION_STORE_UNAVAILABLE"

    INVALID_ARGUMENT: Final = "INVALID_ARGUMENT"
    PROVIDER_EXISTS: Final = "PROVIDER_EXISTS"
    PROVIDER_NOT_FOUND: Final = "PROVIDER_NOT_FOUND"
    CAPABILITY_UNSUPPORTED: Final = "CAPABILITY_UNSUPPORTED"
    CONTINUABLE_UNSUPPORTED: Final = "CONTINUABLE_UNSUPPORTED"
    MODEL_NOT_FOUND: Final = "MODEL_NOT_FOUND"
    DEPTH_EXCEEDED: Final = "DEPTH_EXCEEDED"
    PERSISTENCE_UNAVAILABLE: Final = "PERSISTENCE_UNAVAILABLE"
    AGENT_REGISTRY_UNAVAILABLE: Final = "AGENT_REGISTRY_UNAVAILABLE"
    AGENT_DISPOSED: Final = "AGENT_DISPOSED"
    ADMISSION_CLOSED: Final = "ADMISSION_CLOSED"
    SESSION_NOT_FOUND: Final = "SESSION_NOT_FOUND"
    SESSION_EXISTS: Final = "SESSION_EXISTS"
    DESCRIPTOR_INVALID: Final = "DESCRIPTOR_INVALID"
    DESCRIPTOR_CORRUPT: Final = "DESCRIPTOR_CORRUPT"
    DESCRIPTOR_UNSUPPORTED: Final = "DESCRIPTOR_UNSUPPORTED"
    DECODE_ERROR: Final = "DECODE_ERROR"
    ENCODE_ERROR: Final = "ENCODE_ERROR"
    CORRUPT_RECORD: Final = "CORRUPT_RECORD"
    NOT_A_DATABASE: Final = "NOT_A_DATABASE"
    DATABASE_CORRUPT: Final = "DATABASE_CORRUPT"
    SCHEMA_TOO_NEW: Final = "SCHEMA_TOO_NEW"
    STORE_CLOSED: Final = "STORE_CLOSED"
    TIMEOUT: Final = "TIMEOUT"
    LEASE_HELD: Final = "LEASE_HELD"
    LEASE_LOST: Final = "LEASE_LOST"
    RUNTIME_CLOSED: Final = "RUNTIME_CLOSED"
    WRONG_THREAD: Final = "WRONG_THREAD"
    WRONG_PROCESS: Final = "WRONG_PROCESS"
    RESOURCE_RELEASE_FAILED: Final = "RESOURCE_RELEASE_FAILED"
    MODEL_ERROR: Final = "MODEL_ERROR"
    TURN_NOT_OPEN: Final = "TURN_NOT_OPEN"
    INBOX_FULL: Final = "INBOX_FULL"
    INTERNAL: Final = "INTERNAL"


class SubagentError(Exception):
    """Root of every deliberate failure in ``subagents``.

    Args:
        message: a human-readable sentence.
        code: one of :class:`ErrorCode`; subclasses supply a default.
        hint: optional structured detail (ids, field names) for programs.
    """

    default_code: str = ErrorCode.INTERNAL

    def __init__(self, message: str, *, code: str | None = None, hint: Any = None) -> None:
        super().__init__(message)
        self.code: str = code if code is not None else self.default_code
        self.hint: Any = hint

    def __str__(self) -> str:
        return f"[{self.code}] {super().__str__()}"

    def __reduce__(self) -> tuple[Any, ...]:
        # Errors cross process boundaries (pickle); keep code and hint, and the
        # instance dict so subclasses' extra attributes (session_id, seq) survive.
        return (
            _rebuild_error,
            (type(self), self.args[0] if self.args else "", self.code, self.hint),
            self.__dict__,
        )


def _rebuild_error(cls: type[SubagentError], message: str, code: str, hint: Any) -> SubagentError:
    err = cls.__new__(cls)
    SubagentError.__init__(err, message, code=code, hint=hint)
    return err


class DecodeError(SubagentError, ValueError):
    """Bytes from disk or wire that are not a valid frame or event."""

    default_code = ErrorCode.DECODE_ERROR


class EncodeError(SubagentError, TypeError):
    """A value the codec cannot represent (packing refuses it)."""

    default_code = ErrorCode.ENCODE_ERROR


class CorruptRecordError(DecodeError):
    """A stored row that fails to decode; names the session and the seq."""

    default_code = ErrorCode.CORRUPT_RECORD

    def __init__(self, message: str, *, session_id: str, seq: int) -> None:
        super().__init__(message, hint={"session_id": session_id, "seq": seq})
        self.session_id = session_id
        self.seq = seq


class InboxFullError(SubagentError):
    """A follow-up found the child's bounded inbox full; nothing was accepted.

    ``pending`` messages were accepted and not yet done, of at most ``limit``.
    """

    default_code = ErrorCode.INBOX_FULL

    def __init__(self, session_id: str, limit: int, pending: int) -> None:
        super().__init__(
            f"session {session_id}: the inbox holds {pending} of at most {limit} messages",
            hint={"session_id": session_id, "limit": limit, "pending": pending},
        )
        self.session_id = session_id
        self.limit = limit
        self.pending = pending


class WrongProcessError(SubagentError):
    """A runtime or store this process inherited at a ``fork()``: it is the parent's.

    ``what`` names it, ``pid`` is the process it belongs to, ``instead`` what the
    caller should do in this one.
    """

    default_code = ErrorCode.WRONG_PROCESS

    def __init__(self, what: str, pid: int, instead: str) -> None:
        super().__init__(
            f"{what} belongs to process {pid}: this process inherited it at a fork; {instead}",
            hint={"pid": pid},
        )
        self.pid = pid


class DescriptorInvalidError(SubagentError, ValueError):
    """Descriptor input rejected by :func:`snapshot_subagent_descriptor`."""

    default_code = ErrorCode.DESCRIPTOR_INVALID


class DescriptorCorruptError(SubagentError, ValueError):
    """A current-version descriptor payload that is malformed."""

    default_code = ErrorCode.DESCRIPTOR_CORRUPT


class DescriptorUnsupportedError(SubagentError, ValueError):
    """A descriptor of a version this runtime cannot classify."""

    default_code = ErrorCode.DESCRIPTOR_UNSUPPORTED
