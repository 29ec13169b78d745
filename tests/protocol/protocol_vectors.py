"""The Python construction of every golden vector in ``tests/vectors/``.

Each vector is a value plus the *kind* of codec entry point it goes through:

``event``
    :func:`encode_event` / :func:`decode_event`
``header``
    :func:`encode_header` / :func:`decode_header`
``value``
    :func:`packb` / :func:`unpackb` (ids, timestamps)
``descriptor``
    a snapshotted descriptor, packed as its ``descriptor_payload`` and read back
    with :func:`unpackb` + :func:`parse_descriptor_payload`

The committed bytes are the on-disk and on-wire format. Changing them is a format
change: regenerate deliberately with ``python tests/protocol/make_vectors.py``
(see ``tests/vectors/README.md``) and say so in the changelog.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from subagents.protocol import (
    AgentOptionsEvent,
    ContinuableDescriptor,
    ExpectedEvent,
    InterruptEvent,
    MessageEvent,
    MessageId,
    MessageSource,
    OneShotDescriptor,
    RecordedOptions,
    ReportEvent,
    RunId,
    SessionHeader,
    SessionId,
    SubagentDescriptor,
    SubagentDescriptorEvent,
    TurnEnd,
    TurnStart,
    UnknownEvent,
    agent_options_event,
    decode_event,
    decode_header,
    descriptor_event,
    descriptor_payload,
    encode_event,
    encode_header,
    packb,
    parse_descriptor_payload,
    unpackb,
)

VECTORS_DIR = Path(__file__).resolve().parent.parent / "vectors"
MANIFEST = VECTORS_DIR / "vectors.json"

Kind = Literal["event", "header", "value", "descriptor"]

UTC = dt.UTC
PARENT = SessionId("00112233445566778899aabbccddeeff")
CHILD = SessionId("ffeeddccbbaa99887766554433221100")
MSG_A = MessageId("0123456789abcdef0123456789abcdef")
MSG_B = MessageId("fedcba9876543210fedcba9876543210")
RUN = RunId("a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5a5")
AT = dt.datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)

ONE_SHOT = OneShotDescriptor(provider="local", label="summarise the diff")
CONTINUABLE = ContinuableDescriptor(
    provider="local",
    label="reviewer",
    agent_provider="scripted",
    model="echo",
    persona="A careful reviewer.",
    tool_filter=("read_file", "search"),
)

#: A top-level agent's recorded options (``agent/options``), every field set.
AGENT_OPTIONS = RecordedOptions(
    model="echo",
    provider="scripted",
    persona="A careful reviewer.",
    tool_filter=("read_file", "search"),
)
#: Only the model: provider, persona and tool filter unset (recorded as nil).
AGENT_OPTIONS_MINIMAL = RecordedOptions(model="echo")


@dataclass(frozen=True)
class Vector:
    kind: Kind
    value: Any


VECTORS: dict[str, Vector] = {
    # -- ExtTypes and timestamps ---------------------------------------------------
    "id_session": Vector("value", PARENT),
    "id_message": Vector("value", MSG_A),
    "id_run": Vector("value", RUN),
    # msgpack picks the smallest Timestamp form: 32-bit (whole seconds after 1970),
    # 64-bit (with a fraction) and 96-bit (before 1970 or past 2514).
    "timestamp_32": Vector("value", dt.datetime(2024, 5, 6, 7, 8, 9, tzinfo=UTC)),
    "timestamp_64": Vector("value", AT),
    "timestamp_96": Vector("value", dt.datetime(1969, 7, 20, 20, 17, 40, 500000, tzinfo=UTC)),
    # -- the event vocabulary ------------------------------------------------------
    "event_message": Vector(
        "event",
        MessageEvent(
            message_id=MSG_A,
            content={"text": "hello", "parts": [1, 2.5, True, None, b"\x00\xff"]},
            source=MessageSource(kind="parent", session_id=PARENT),
        ),
    ),
    "event_message_minimal": Vector("event", MessageEvent(message_id=MSG_B, content="hi")),
    "event_report": Vector(
        "event",
        ReportEvent(
            message_id=MSG_B,
            content="found 3 issues",
            source=MessageSource(kind="child", session_id=CHILD),
            delivery="waking",
        ),
    ),
    "event_turn_start": Vector("event", TurnStart(turn=3, at=AT, message_ids=(MSG_A, MSG_B))),
    "event_turn_end": Vector(
        "event",
        TurnEnd(
            turn=3,
            at=AT,
            stop_reason="completed",
            output="done",
            structured={"issues": 3},
            error=None,
        ),
    ),
    "event_turn_end_failed": Vector(
        "event", TurnEnd(turn=4, at=AT, stop_reason="failed", error="RuntimeError: boom")
    ),
    "event_interrupt": Vector(
        "event",
        InterruptEvent(at=AT, cause="user pressed stop", authority="user", by_session=PARENT),
    ),
    "event_descriptor_one_shot": Vector("event", descriptor_event(ONE_SHOT)),
    "event_descriptor_continuable": Vector("event", descriptor_event(CONTINUABLE)),
    "event_descriptor_future_version": Vector(
        "event", SubagentDescriptorEvent(payload={"v": 2, "mode": "hibernating"})
    ),
    "event_agent_options": Vector("event", agent_options_event(AGENT_OPTIONS)),
    "event_agent_options_minimal": Vector("event", agent_options_event(AGENT_OPTIONS_MINIMAL)),
    "event_agent_options_output_schema": Vector(
        "event",
        agent_options_event(
            RecordedOptions(model="echo", output_schema={"type": "object", "required": ["n"]})
        ),
    ),
    # Version 2 is the record with an output schema: a future one is 3.
    "event_agent_options_future_version": Vector(
        "event", AgentOptionsEvent(payload={"v": 3, "model": "echo", "budget": 3})
    ),
    # A background run's result the session is owed, with its stand-in.
    "event_expected": Vector(
        "event",
        ExpectedEvent(
            message_id=MSG_B,
            content={"delegate_result": {"id": str(CHILD), "stop_reason": "cancelled"}},
            source=MessageSource(kind="child", session_id=CHILD),
        ),
    ),
    "event_unknown": Vector(
        "event", UnknownEvent(type_name="x-newer/thing", data={"n": 1, "nested": {"k": [None]}})
    ),
    # -- the session header --------------------------------------------------------
    "header_top_level": Vector(
        "header",
        SessionHeader(
            id=PARENT, parent_session=None, origin="user", delegation_depth=0, created_at=AT
        ),
    ),
    "header_child": Vector(
        "header",
        SessionHeader(
            id=CHILD,
            parent_session=PARENT,
            origin="subagent",
            delegation_depth=1,
            created_at=AT,
            label="reviewer",
        ),
    ),
    # A child whose log starts with a fork seed of 4 events (seed_len is written
    # only when non-zero, so the two headers above keep their bytes).
    "header_forked": Vector(
        "header",
        SessionHeader(
            id=CHILD,
            parent_session=PARENT,
            origin="subagent",
            delegation_depth=2,
            created_at=AT,
            label="forked reviewer",
            seed_len=4,
        ),
    ),
    # -- descriptor payloads -------------------------------------------------------
    "descriptor_one_shot": Vector("descriptor", ONE_SHOT),
    "descriptor_continuable": Vector("descriptor", CONTINUABLE),
}


def encode(vector: Vector) -> bytes:
    """The bytes of ``vector`` through its kind's encoder."""
    if vector.kind == "event":
        return encode_event(vector.value)
    if vector.kind == "header":
        return encode_header(vector.value)
    if vector.kind == "descriptor":
        return packb(descriptor_payload(vector.value))
    return packb(vector.value)


def decode(kind: Kind, data: bytes) -> Any:
    """Read ``data`` back through the decoder of ``kind``."""
    if kind == "event":
        return decode_event(data)
    if kind == "header":
        return decode_header(data)
    if kind == "descriptor":
        descriptor: SubagentDescriptor = parse_descriptor_payload(unpackb(data))
        return descriptor
    return unpackb(data)
