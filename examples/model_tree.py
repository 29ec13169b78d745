"""An agent tree a model drives: the root thinks, and its tools start the children.

Run against any OpenAI-compatible API::

    OPENAI_API_KEY=... python examples/model_tree.py [DB] --model gpt-4o-mini

(``OPENAI_BASE_URL`` points it elsewhere, e.g. a local server). ``--offline`` runs
the same script against the testing kit's loopback fake server instead, with a
stand-in model that plays the root's part -- no network, no key.
"""

import argparse
import json
import os

from subagents.actors import AgentOptions, Runtime, openai_chat
from subagents.actors.testing import Answer, FakeCall, FakeOpenAI

PERSONA = (
    "You plan research. Start one continuable researcher per topic with start_agent"
    " (model researcher), delegate quick facts with delegate (model researcher), and"
    " when your researchers have answered, reply with a two-sentence summary."
)


def stand_in(request):
    """The offline model: the root starts two researchers; everyone else answers."""
    messages = request.messages
    if messages[0]["content"] != PERSONA:
        return Answer(content=f"notes on {messages[-1]['content']}")
    if messages[-1]["role"] == "user":
        return Answer(
            tool_calls=[
                FakeCall("start_agent", {"prompt": t, "label": t, "model": "researcher"})
                for t in ("mailboxes", "supervision")
            ]
        )
    started = [json.loads(m["content"])["id"] for m in messages if m["role"] == "tool"]
    return Answer(content=f"started {len(started)} researchers")


def run(db, model):
    with Runtime(db) as rt:
        rt.models.register("planner", openai_chat(model))
        rt.models.register("researcher", openai_chat(model, system="Answer in two sentences."))
        root = rt.spawn("planner", label="planner", options=AgentOptions(persona=PERSONA))
        root.followup("Compare actor runtimes: mailboxes and supervision.")
        rt.wait_idle()
        for row in rt.subagents.list_descendants(root.session_id):
            print("  " * row.depth + f"{row.label} ({row.mode}, {row.activity})")
        end = rt.sessions.turn_ends(root.session_id)[-1]
        print(f"root: {end.output} [{end.stop_reason}, usage {end.usage}]")


parser = argparse.ArgumentParser()
parser.add_argument("db", nargs="?", default="model-tree.db")
parser.add_argument("--model", default="gpt-4o-mini")
parser.add_argument("--offline", action="store_true", help="use a loopback fake server")
args = parser.parse_args()
if args.offline:
    with FakeOpenAI(responder=stand_in) as fake:
        os.environ["OPENAI_BASE_URL"] = fake.base_url
        os.environ["OPENAI_API_KEY"] = fake.api_key
        run(args.db, args.model)
else:
    run(args.db, args.model)
