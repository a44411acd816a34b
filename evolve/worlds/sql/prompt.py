"""The messages an episode opens with: an optional system instruction, then the few-shot demos,
the recalled experiences and the task's prompt, laid out by the system's template."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evolve.types import Message
from evolve.worlds.sql.abstract import readable
from evolve.worlds.sql.fewshot import render as render_demos
from evolve.worlds.sql.memory import render as render_memory
from evolve.worlds.sql.questions import prompt_text
from evolve.worlds.sql.render import fill


def messages_for(
    task: dict,
    instruction: str = "",
    examples: list[dict] | None = None,
    style: str = "full",
    demos: list[dict] | None = None,
    demo_style: str = "masked",
    template: str = "",
) -> list[Message]:
    """The opening messages of an episode: an optional system instruction, then the prompt laid
    out by ``template`` (see :mod:`evolve.worlds.sql.render`; empty: ``schema: ...\\nq: ...``),
    after the few-shot demos (see :mod:`evolve.worlds.sql.fewshot`) and the recalled experiences
    (see :mod:`evolve.worlds.sql.memory`) when there are any."""
    out = [Message(role="system", content=instruction)] if instruction else []
    head = render_memory(examples, style) if examples else ""
    if demos:
        head = render_demos(demos, demo_style) + head
    body = (
        fill(template, task["schema"], task["question"]) if template else prompt_text(task["schema"], task["question"])
    )
    out.append(Message(role="user", content=head + body))
    return out


def fewshot_messages(task: dict, demos: Sequence[dict], instruction: str = "", style: str = "masked") -> list[Message]:
    """The agent's opening messages with ``demos`` shown before the prompt."""
    msgs = messages_for(task, instruction)
    head = render_demos(demos, style)
    if head:
        last = msgs[-1]
        msgs[-1] = Message(role=last.role, content=head + last.content)
    return msgs


def tool_lines(library: Any) -> str:
    """The system's query tools as a model that reads is told of them: one line per tool,
    ``name(params) = the SQL it runs`` (``<t0>`` a table, ``<c0>`` a column, ``<v0>`` a value),
    after a sentence saying a call may stand for the query. The tiny model never sees this (it
    learns tools from demos); ``workflow.tool_docs: true`` shows it."""
    lines = []
    for t in library:
        template = t.meta.get("template")
        if not template:
            continue
        lines.append(f"{t.name}({', '.join(p for p in t.params if p != 'db')}) = {readable(template)}")
    if not lines:
        return ""
    return (
        "Instead of SQL you may answer with one call to one of these query tools, written as "
        "name(arguments); it runs the query shown:\n" + "\n".join(lines)
    )


def with_tool_docs(messages: list[Message], box: Any, workflow: dict) -> list[Message]:
    """``messages`` with :func:`tool_lines` added to the system message (one made when there is
    none) when ``workflow.tool_docs`` is true and ``box`` (the system's
    :func:`~evolve.worlds.sql.tools.toolbox`, or None) has query tools; else ``messages`` as they are."""
    docs = tool_lines(box.library) if box is not None and workflow.get("tool_docs") else ""
    if not docs:
        return messages
    if messages and messages[0].role == "system":
        return [Message(role="system", content=messages[0].content + "\n\n" + docs), *messages[1:]]
    return [Message(role="system", content=docs), *messages]


def stop_strings(workflow: dict) -> list[str] | None:
    """``workflow.stop`` as the stop strings of each reply (None when it names none)."""
    return [str(x) for x in workflow.get("stop") or []] or None
