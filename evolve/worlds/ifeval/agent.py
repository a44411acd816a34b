"""The agent: the prompt as the one user message, answered in one model call.

With no prompt components the model sees exactly what IFEval's protocol gives it (lighteval's:
the prompt as the user turn of the model's chat template, whose own default system message, if it
has one, applies). A system's ``instruction`` component becomes a system message; ``demos``
(few-shot examples) and recollections from the system's memory (generated training prompts solved
before, with the reply that followed every instruction) are added to it. The ``template``
component lays the user turn out (``{prompt}`` marks where the prompt goes).

Settings (``ctx.system.workflow``): ``max_tokens`` (1,280, lighteval's cap), ``stop``.
Returns ``{"reply"}``.

:func:`revise_agent` drafts, measures the draft with a tool (:func:`evolve.worlds.ifeval.tools.measure`:
counts and facts, no verdict), and asks the model to rewrite the draft so that it follows every
instruction of the request, given those measurements; ``workflow.revisions`` (1) rounds. It never
sees a checker's verdict.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evolve.types import Message

MAX_TOKENS = 1280


def messages_for(task: dict, prompts: Any = None, recalled: Sequence[dict] = ()) -> list[Message]:
    """The messages of the model call (see the module docstring)."""
    from evolve.prompts.components import (
        get_demos,
        get_template,
        get_text,
        render_demos,
    )

    prompts = prompts or {}
    system = [t for t in [get_text(prompts, "instruction")] if t]
    demos = get_demos(prompts)
    if demos:
        system.append("Examples:\n\n" + render_demos(demos))
    if recalled:
        system.append(
            "Requests answered well before:\n\n"
            + render_demos([{"question": r["prompt"], "answer": r["reply"]} for r in recalled])
        )
    template = get_template(prompts) or "{prompt}"
    prompt = task["prompt"]
    user = template.replace("{prompt}", prompt) if "{prompt}" in template else f"{template}\n\n{prompt}"
    head = [Message(role="system", content="\n\n".join(system))] if system else []
    return [*head, Message(role="user", content=user)]


def recall(spec: dict | None, task: dict) -> list[dict]:
    """The solved training prompts ``spec`` recalls for ``task`` (never the task's own)."""
    if not spec or not spec.get("store") or spec.get("version") is None:
        return []
    from evolve.memory.recall import recall as search

    k = int(spec.get("k", 1))
    hits = search({**spec, "k": k + 4}, task["prompt"]) if k > 0 else []
    out = [
        {
            "id": h["id"],
            "prompt": h["text"],
            "reply": h["metadata"]["reply"],
            "task_id": h["metadata"].get("task_id"),
            "similarity": h["similarity"],
        }
        for h in hits
        if h["metadata"].get("task_id") != task.get("id") and h["metadata"].get("reply")
    ]
    return out[:k]


def agent(task: dict, ctx: Any) -> dict:
    """Ask the policy model once (see the module docstring)."""
    system = ctx.system
    wf = dict(getattr(system, "workflow", None) or {})
    spec = getattr(system, "memory", None) or {}
    recalled = (
        ctx.tool("recall_memory", lambda query: recall(spec, task), query=task["prompt"]) if spec.get("store") else []
    )
    stop = [str(s) for s in wf.get("stop") or []] or None
    reply = (
        ctx.llm("policy")
        .complete(
            messages_for(task, getattr(system, "prompts", None), recalled),
            max_tokens=int(wf.get("max_tokens", MAX_TOKENS)),
            stop=stop,
        )
        .text
    )
    return {"reply": reply}


REVISE = (
    "Read the request again and check your reply above against every instruction in it (length, format, "
    "words to use or avoid, case, punctuation, how it must start and end). Then write the corrected reply "
    "in full, with nothing before or after it."
)


def revision(messages: Sequence[Message], reply: str, measures: str | None = None) -> list[Message]:
    """The conversation asking for a revision of ``reply`` (with the draft's measurements when given)."""
    ask = REVISE if measures is None else f"Here are some measurements of your reply above:\n{measures}\n\n{REVISE}"
    return [*messages, Message(role="assistant", content=reply), Message(role="user", content=ask)]


def revise_agent(task: dict, ctx: Any) -> dict:
    """Draft, measure, revise (see the module docstring). Returns ``{"reply", "draft"}``."""
    from evolve.worlds.ifeval.tools import measure

    system = ctx.system
    wf = dict(getattr(system, "workflow", None) or {})
    max_tokens = int(wf.get("max_tokens", MAX_TOKENS))
    stop = [str(s) for s in wf.get("stop") or []] or None
    messages = messages_for(task, getattr(system, "prompts", None))
    llm = ctx.llm("policy")
    draft = reply = llm.complete(messages, max_tokens=max_tokens, stop=stop).text
    for _ in range(int(wf.get("revisions", 1))):
        messages = revision(messages, reply, ctx.tool("measure", measure, reply=reply))
        reply = llm.complete(messages, max_tokens=max_tokens, stop=stop).text
    return {"reply": reply, "draft": draft}


__all__ = ["MAX_TOKENS", "REVISE", "agent", "messages_for", "recall", "revise_agent", "revision"]
