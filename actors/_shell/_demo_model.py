"""``subagents demo --model NAME``: the demo tree, driven by a real model.

Every model name the scripted demo registers is registered here as
:func:`~subagents.actors.openai_chat` on the model ``NAME`` (base URL and key from
``OPENAI_BASE_URL`` / ``OPENAI_API_KEY``), each with a system prompt for its role.
The first run hands the root a research task; the root decides which children to
start (the prompt asks for two continuable researchers and a one-shot lookup),
then is asked to follow them up. The second run resumes the tree as the scripted
demo does: the root from its session, each continuable child cold-resumed by a
follow-up -- now answered by the model.
"""

from __future__ import annotations

from typing import Any, Final

from subagents.actors._model import openai_chat
from subagents.actors._runtime import Runtime

__all__ = ["PROMPTS", "TASK", "register_models", "run_model_first"]

#: The task the root is given on the first run.
TASK: Final = "Compare the mailbox designs of two actor runtimes, pykka and Erlang/OTP."

#: A system prompt per model name of the demo.
PROMPTS: Final = {
    "lead": (
        "You lead a small research team. For a task: start two continuable researchers"
        " with start_agent (labels researcher-A and researcher-B, model researcher), one"
        " per half of the task, and delegate one quick fact to a one-shot subagent with"
        " delegate (label lookup, model lookup). When asked to follow up, find your"
        " researchers with list_agents and send each one question with send_message."
        " Answer in at most three sentences."
    ),
    "researcher": (
        "You are a researcher on a team. Answer your task in at most three sentences."
        " You may delegate one quick fact with delegate (model lookup) and report a"
        " finding to your lead with report."
    ),
    "lookup": "Answer with one short, factual sentence.",
    "summarizer": "Summarise what you are given in one sentence.",
    "writer": "You write short drafts. Answer in at most three sentences.",
    "fact-checker": "Check the claims you are given; answer in one sentence.",
    "slow-researcher": "You are a researcher. Answer in at most three sentences.",
    "sketch": "Sketch an idea in one sentence.",
}


def register_models(rt: Runtime, model: str) -> None:
    """Register every demo model name as ``model`` behind an OpenAI-compatible API.

    Raises:
        SubagentError: ``INVALID_ARGUMENT`` without an API key (see ``openai_chat``).
    """
    for name, prompt in PROMPTS.items():
        rt.models.register(name, openai_chat(model, system=prompt), replace=True)


def run_model_first(rt: Runtime, root: Any, show: Any, quiet: Any) -> None:
    """The first run with a model: a task, then a follow-up round, each until quiet."""
    show.step(f"the root ({root.label}) thinks about its task and starts its team")
    root.followup(TASK)
    show.wait(lambda: quiet(rt), "the team's first answers", timeout=600.0)
    show.step("the root follows up its researchers")
    root.followup("Follow up each of your researchers once, then summarise.")
    show.wait(lambda: quiet(rt), "the follow-ups", timeout=600.0)
    show.step("first run complete; run `subagents demo --model ...` again to resume this tree")
