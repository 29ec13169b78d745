"""Cold resume reads the checkpoint and the events after it, not the whole log.

R-FUP-8 (cost does not grow with the log), counted in rows read, never timed.
"""

from __future__ import annotations

import pytest
from continuable_kit import Kit


@pytest.mark.parametrize("turns", [10, 2000])
def test_cold_resume_reads_only_the_checkpoint_and_what_follows(kit: Kit, turns: int) -> None:
    """R-FUP-8: resuming a child with 10 or 2,000 prior turns reads the checkpoint
    and only the log rows after it (none here), so the cost is the same; nor does
    the resumed epoch's settlement read the log."""
    rt = kit.rt
    store = kit.store
    root = kit.root()
    child_id, _ = kit.start(root, [["block", "g"]], label="kid")
    assert kit.gate("g").wait_reached(10)
    for i in range(turns - 1):
        rt.subagents.followup(root, child_id, f"m{i}")
    kit.gate("g").release()
    kit.wait_settled("kid", epochs=1)
    rt.sessions.flush()
    last_seq = store.last_seq(child_id)
    assert last_seq >= 3 * turns  # descriptor + (start, message, end) per turn
    store.reset_counts()
    rt.subagents.followup(root, child_id, [["block", "resumed"]])
    assert kit.gate("resumed").wait_reached(10)  # resumed, and its turn is running
    reads = list(store.reads)
    assert store.checkpoint_reads >= 1
    assert sum(rows for _, _, rows in reads) == 0, reads
    assert reads and all(from_seq == last_seq + 1 for _, from_seq, _ in reads), reads
    kit.gate("resumed").release()
    kit.wait_settled("kid", epochs=2)
    # Settling the resumed epoch does not read the log either.
    assert store.rows_read == 0, store.reads
    resumed = kit.script.turns_of("kid")[-1]
    assert resumed.index == turns  # numbering continues from the checkpoint
    # The whole history is still there for a turn that asks for it.
    assert len(kit.contents("kid")) == turns + 1
