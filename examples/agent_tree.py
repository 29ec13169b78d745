"""Spawn an agent tree from a script: a root delegates, keeps a continuable child, follows up.

Run: ``python examples/agent_tree.py [DB]`` (default ``agent-tree.db``).
"""

import sys

from subagents.actors import Runtime


def researcher(turn):
    if turn.index == 0:  # first turn: delegate a one-shot summary, report back quietly
        summary = turn.subagents.delegate("fork", f"sum up {turn.content}", model="echo")
        turn.subagents.report(f"collected: {summary.output}", delivery="quiet")
    return f"{turn.agent.label}: done with {turn.content!r}"


def root(turn):
    if turn.content == "start":
        child = turn.subagents.start_continuable(
            "local", "actor runtimes", label="researcher", model="researcher"
        )
        return str(child.child_id)
    return {"heard": [m.content for m in turn.context], "said": turn.content}


with Runtime(sys.argv[1] if len(sys.argv) > 1 else "agent-tree.db") as rt:
    rt.models.register("researcher", lambda options: researcher)
    boss = rt.spawn(root, label="root")
    boss.followup("start")
    rt.wait_idle()  # the child's first turn runs after start_continuable returned
    child_id = rt.sessions.read(boss.session_id)[-1].event.output
    rt.subagents.followup(boss, child_id, "now compare them")  # wakes or cold-resumes the child
    rt.wait_idle()
    boss.followup("what did you hear?")
    rt.wait_idle()
    for row in rt.subagents.list_descendants(boss.session_id):
        print("  " * row.depth + f"{row.label} ({row.mode}, {row.activity})")
    print(rt.sessions.read(boss.session_id)[-1].event.output)
