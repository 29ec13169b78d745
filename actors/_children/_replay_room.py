"""The inbox bound of a cold resume that replays a durable inbox (see
:mod:`._admission`)."""

from __future__ import annotations

from collections.abc import Sequence

from subagents.actors._agents import Agent
from subagents.protocol import InboxFullError, MessageId, ReportEvent
from subagents.store import InboxEntry

__all__ = ["check_replay_room"]


def check_replay_room(agent: Agent, message_id: MessageId, replay: Sequence[InboxEntry]) -> None:
    """A follow-up nothing committed (relaxed) that cold-resumes a child whose
    durable inbox holds ``replay`` (a strict runtime's, or a crash's): the bound
    counts those first, as the store would (a quiet report aside). Checked before
    anything is published: refused, the materialization rolls back whole, and the
    lease's release finds them waiting, for the next activation to run.

    Raises:
        InboxFullError: ``INBOX_FULL``, nothing of it accepted.
    """
    limit = agent.header.max_inbox
    if limit is None or any(e.message_id == message_id for e in replay):
        return
    pending = sum(
        1 for e in replay if type(e.event) is not ReportEvent or e.event.delivery == "waking"
    )
    if pending >= limit:
        raise InboxFullError(str(agent.session_id), limit, pending)
