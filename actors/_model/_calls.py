"""The subagent tools a :class:`~._dispatch.ToolDispatcher` runs without state of
its own (``start_agent``, ``send_message``, ``interrupt``, ``report``,
``list_agents``), and the message ids of a model's side-effecting calls.

A turn a crash cut short runs again (``turn.redelivered``), and its model asks
again -- usually for the same calls. Each call that starts a child (one-shot or
continuable), follows one up or reports carries a message id derived from the
turn's message id, the call's place in the turn (its round and its position in
the answer) and a hash of its name and canonical JSON arguments
(:func:`call_message_id`): the same call at the same place gets the same id, and
the runtime accepts a message id once. A continuable start returns the same
child. A one-shot ``delegate`` (``SubagentStartRequest.message_id``) whose earlier
child completed returns that child's recorded result -- the same id, output and
stop reason the first call returned -- and runs nothing; one whose child did not
complete (the crash came during its run) runs it once more, as a new child: one
call never leaves two completed children. A background ``delegate`` delivers its
result under an id derived from the call's and its child's
(:func:`result_message_id`), so a result delivered before the crash is not
delivered again where the inbox remembers ids across a restart (strict
durability), and a child run again delivers its own. A call that differs, or
comes elsewhere, is a new one.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from subagents.actors._agents import Turn
from subagents.actors._catalog import Listing
from subagents.protocol import MessageId

__all__ = [
    "call_message_id",
    "child_fields",
    "interrupt",
    "list_agents",
    "report",
    "result_message_id",
    "send_message",
    "start_agent",
]


def call_message_id(turn: Turn, place: str, name: str, args: Mapping[str, Any]) -> str:
    """32 hex digits for the call ``name(args)`` at ``place`` of ``turn``."""
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256()
    for part in (str(turn.messages[0].message_id), place, name, canonical):
        digest.update(part.encode("utf-8", "surrogatepass"))
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def result_message_id(mid: str | None, child: object) -> MessageId:
    """The id a background ``delegate`` with message id ``mid`` delivers the result
    of its child ``child`` under (without ``mid``, a call no replay repeats: from
    the child's id alone, unique all the same). The child's id is part of it: a
    start run again as a new child (the earlier one did not complete) delivers its
    own result, never dropped as the earlier's. Known when the run starts, it is
    the id its turn promises the agent (``Turn.expect``)."""
    key = f"{mid or ''}\0{child}\0delegate-result".encode()
    return MessageId(hashlib.sha256(key).hexdigest()[:32])


def child_fields(args: dict[str, Any]) -> dict[str, Any]:
    """A child's fields from a tool call's arguments (``tools``: its tool filter)."""
    fields: dict[str, Any] = {k: args[k] for k in ("model", "persona", "label") if k in args}
    if "tools" in args:
        fields["tool_filter"] = tuple(args["tools"])
    return fields


def start_agent(
    turn: Turn,
    mid: str | None,
    prompt: str,
    label: str,
    provider: str = "local",
    **rest: Any,
) -> Any:
    fields = child_fields(rest)
    fields.pop("label", None)
    subs = turn.subagents
    handle = subs.start_continuable(provider, prompt, label=label, message_id=mid, **fields)
    return {"id": str(handle.child_id), "message_id": str(handle.message_id)}


def send_message(turn: Turn, mid: str | None, id: str, content: str, steer: bool = False) -> Any:
    if steer is True:
        result = turn.subagents.followup(id, content, steer=True, message_id=mid)
        return {"message_id": str(result.message_id), "delivered": result.outcome}
    sent = turn.subagents.followup(id, content, message_id=mid)
    return {"message_id": str(sent), "delivered": "queued"}


def interrupt(turn: Turn, _mid: str | None, id: str) -> Any:
    turn.subagents.interrupt(id)
    # Accepted: a target that is not resident has no turn to cancel (a no-op).
    return {"interrupt": "accepted", "id": id}


def report(turn: Turn, mid: str | None, content: str, delivery: str = "quiet") -> Any:
    sent = turn.subagents.report(content, delivery=delivery, message_id=mid)
    return {"message_id": str(sent)}


def list_agents(turn: Turn, _mid: str | None, scope: str = "children") -> Any:
    subs = turn.subagents
    listing: Listing = subs.list_children() if scope == "children" else subs.list_descendants()
    rows = []
    for row in listing.rows:
        entry = {
            "id": str(row.id),
            "label": row.label,
            "mode": row.mode,
            "state": row.activity,
            "has_children": row.has_children,
        }
        if scope == "descendants":
            entry["parent_id"] = str(row.parent_id)
            entry["depth"] = row.depth
        rows.append(entry)
    problems = [{"id": str(d.id), "kind": d.kind} for d in listing.diagnostics]
    return {"agents": rows, **({"problems": problems} if problems else {})}
