"""The agent: one model call with the question, under an instruction that says the answer format.

The system message is the ``instruction`` prompt component (the format's default,
:data:`~evolve.worlds.reasoning_gym.answer.INSTRUCTIONS`, when the system has none or it is
empty), then the ``demos`` component (few-shot examples, :func:`evolve.prompts.components.render_demos`),
then the experiences recalled from the system's memory (``System.memory``: solved training tasks,
their question and the answer that scored). The user message is the question, laid out by the
``template`` component when there is one (``{question}`` marks where). Demos and recollections go
in the system message so that the first user message is always the task's own question (what
``bootstrap_demos`` harvests as a demo's input).

Settings (``ctx.system.workflow``): ``max_tokens`` (256), ``stop`` (stop strings for the reply).
Returns ``{"reply", "answer", "extract_error"}``: the answer read in the task's ``answer_format``,
or None and why not.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evolve.types import Message
from evolve.worlds.reasoning_gym.answer import INSTRUCTIONS, AnswerFormatError, extract


def instruction_of(prompts: Any, fmt: str) -> str:
    """The system's ``instruction`` component, or the format's default when it has none."""
    from evolve.prompts.components import get_text

    return get_text(prompts or {}, "instruction") or INSTRUCTIONS[fmt]


def render_recalled(items: Sequence[dict]) -> str:
    """Recalled experiences as the system message shows them (``Question:`` / ``Answer:`` blocks)."""
    if not items:
        return ""
    from evolve.prompts.components import render_demos

    return "Solved before:\n\n" + render_demos([{"question": it["question"], "answer": it["answer"]} for it in items])


def messages_for(task: dict, prompts: Any = None, recalled: Sequence[dict] = ()) -> list[Message]:
    """The messages of the one model call (see the module docstring)."""
    from evolve.prompts.components import get_demos, get_template, render_demos

    prompts = prompts or {}
    system = [instruction_of(prompts, task.get("answer_format", "answer_line"))]
    demos = get_demos(prompts)
    if demos:
        system.append("Examples:\n\n" + render_demos(demos))
    if recalled:
        system.append(render_recalled(recalled))
    template = get_template(prompts) or "{question}"
    question = task["question"]
    user = template.replace("{question}", question) if "{question}" in template else f"{template}\n\n{question}"
    return [Message(role="system", content="\n\n".join(system)), Message(role="user", content=user)]


def recall(spec: dict | None, task: dict) -> list[dict]:
    """The experiences ``spec`` recalls for ``task``: ``[{"id", "question", "answer", "task_id",
    "similarity"}]``, never the task's own (a training task solved earlier)."""
    if not spec or not spec.get("store") or spec.get("version") is None:
        return []
    from evolve.memory.recall import recall as search

    k = int(spec.get("k", 1))
    hits = search({**spec, "k": k + 4}, task["question"]) if k > 0 else []
    out = [
        {
            "id": h["id"],
            "question": h["text"],
            "answer": h["metadata"]["answer"],
            "task_id": h["metadata"].get("task_id"),
            "similarity": h["similarity"],
        }
        for h in hits
        if h["metadata"].get("task_id") != task.get("id") and h["metadata"].get("answer")
    ]
    return out[:k]


def agent(task: dict, ctx: Any) -> dict:
    """Ask the policy model once; read the answer (see the module docstring)."""
    system = ctx.system
    wf = dict(getattr(system, "workflow", None) or {})
    spec = getattr(system, "memory", None) or {}
    recalled = (
        ctx.tool("recall_memory", lambda query: recall(spec, task), query=task["question"]) if spec.get("store") else []
    )
    messages = messages_for(task, getattr(system, "prompts", None), recalled)
    stop = [str(s) for s in wf.get("stop") or []] or None
    reply = ctx.llm("policy").complete(messages, max_tokens=int(wf.get("max_tokens", 256)), stop=stop).text
    try:
        answer = extract(reply, task.get("answer_format", "answer_line"))
        return {"reply": reply, "answer": answer, "extract_error": None}
    except AnswerFormatError as e:
        return {"reply": reply, "answer": None, "extract_error": str(e)}


def _reflexion_agent() -> Any:
    """The agent with Reflexion: the reward's feedback (which never holds the gold answer) is the
    lesson; attempts from ``workflow.reflexion_attempts`` (2)."""
    from evolve.reflexion import reflexion_agent as wrap

    fn = wrap(
        "evolve.worlds.reasoning_gym:agent",
        "evolve.worlds.reasoning_gym:reward",
        name="reflexion_agent",
        reflect="feedback",
        max_attempts=2,
    )
    fn.__module__ = "evolve.worlds.reasoning_gym"
    return fn


reflexion_agent = _reflexion_agent()  # ``agent: evolve.worlds.reasoning_gym:reflexion_agent`` in a task file


__all__ = ["agent", "instruction_of", "messages_for", "recall", "reflexion_agent", "render_recalled"]
