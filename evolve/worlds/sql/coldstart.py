"""Cold-start demos for a local model in the SQL world (``models.policy.cold_start.demos``): chats in
the agent's exact message format, with gold SQL, repair turns, and what the system shows before
the prompt (few-shot demos, recalled experiences, tool calls), so that SFT teaches the model the
format it will be run with; and the words a pointer tokenizer always copies (``pointer_words``)."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

from evolve.toolforge.tool import Tool, ToolLibrary
from evolve.worlds.sql.abstract import call_text, shape_of
from evolve.worlds.sql.augment import rename_chat, schema_names
from evolve.worlds.sql.db import SQLError, error_text, execute
from evolve.worlds.sql.fewshot import render as render_fewshot
from evolve.worlds.sql.fewshot import task_demo
from evolve.worlds.sql.memory import recall
from evolve.worlds.sql.memory import render as render_memory
from evolve.worlds.sql.prompt import messages_for
from evolve.worlds.sql.render import fill

_SQL_WORDS = {
    "select",
    "from",
    "where",
    "join",
    "on",
    "order",
    "by",
    "group",
    "limit",
    "asc",
    "desc",
    "count",
    "max",
    "min",
    "avg",
    "sum",
    "a",
    "b",
    "id",
}


def demos(
    tasks: list[dict],
    *,
    instruction: str = "",
    retry_frac: float = 0.25,
    seed: int = 0,
    augment: int = 0,
    template: str = "",
) -> list[list[dict[str, str]]]:
    """SFT demos in the agent's exact message format, as ``{"role", "content"}`` dicts
    (``evolve.llm.base.as_messages`` turns them into Messages). Every task gives a one-turn
    demo ``[system?], user, assistant(gold)``; a ``retry_frac`` share of tasks also gives a
    repair demo ``[system?], user, assistant(wrong sql), tool(error: ...), assistant(gold)``
    whose error text is what sqlite really says about the wrong query. ``augment`` adds that many
    copies of each demo with every table and column renamed (see :mod:`evolve.worlds.sql.augment`).
    ``template`` is the system's prompt layout (the ``template`` component, :mod:`evolve.worlds.sql.render`),
    so the demos are laid out the way the agent will ask."""
    rng = random.Random(f"sql-demos:{seed}")
    out: list[list[dict[str, str]]] = []
    for task in tasks:
        head = [m.model_dump() for m in messages_for(task, instruction, template=template)]
        out.append(head + [{"role": "assistant", "content": task["gold_sql"]}])
        if rng.random() >= retry_frac:
            continue
        for _ in range(5):
            bad = corrupt(rng, task)
            try:
                execute(task["db"], bad)
            except SQLError as e:
                out.append(
                    head
                    + [
                        {"role": "assistant", "content": bad},
                        {"role": "tool", "content": error_text(e)},
                        {"role": "assistant", "content": task["gold_sql"]},
                    ]
                )
                break
    if augment:
        arng = random.Random(f"sql-augment:{seed}")
        out = out + [rename_chat(chat, arng) for _ in range(augment) for chat in out]
    return out


def with_prefixes(chats: list[list[dict[str, str]]], heads: dict[str, str]) -> list[list[dict[str, str]]]:
    """Copies of ``chats`` where the first user message that is a key of ``heads`` starts with
    that key's text (recalled examples, few-shot demos), so a cold start sees what the agent shows."""
    out = []
    for chat in chats:
        chat = [dict(m) for m in chat]
        for m in chat:
            if m["role"] == "user" and m["content"] in heads:
                m["content"] = heads[m["content"]] + m["content"]
                break
        out.append(chat)
    return out


def _misspell(rng: random.Random, word: str) -> str:
    i = rng.randrange(len(word))
    op = rng.randrange(4)
    if op == 0 and len(word) > 3:
        return word[:i] + word[i + 1 :]
    if op == 1:
        return word[:i] + word[i] + word[i:]
    if op == 2 and i < len(word) - 1 and word[i] != word[i + 1]:
        return word[:i] + word[i + 1] + word[i] + word[i + 2 :]
    return word[:i] + rng.choice([c for c in "aeiouy" if c != word[i]]) + word[i + 1 :]


def corrupt(rng: random.Random, task: dict) -> str:
    """A plausible wrong first attempt at the task's gold SQL: a misspelt name, a column
    taken from the wrong table, or a dropped keyword."""
    tables, cols = schema_names(task["schema"])
    sql, names = task["gold_sql"], tables + cols
    bare = re.sub(r"'[^']*'", lambda m: " " * len(m.group()), sql)
    spots = [
        m for m in re.finditer(r"\b[a-z_][a-z0-9_]*\b", bare) if m.group() in names and m.group() not in _SQL_WORDS
    ]
    x = rng.random()
    if x < 0.2:
        kw = rng.choice([k for k in (" from ", " where ", " by ", " on ") if k in sql])
        return sql.replace(kw, " ", 1)
    if x < 0.4 and " join " not in sql:
        tables = re.findall(r"(\w+)\(", task["schema"])
        m = re.search(r" from (\w+)", sql)
        others = [t for t in tables if m and t != m.group(1)]
        if m and others:
            return sql[: m.start(1)] + rng.choice(others) + sql[m.end(1) :]
    if not spots:
        return sql.replace(" from ", " form ", 1)
    m = rng.choice(spots)
    return sql[: m.start()] + _misspell(rng, m.group()) + sql[m.end() :]


def name_words(tasks: list[dict]) -> set[str]:
    """Every table and column name in the tasks' schemas, except ``id`` (the one name both sides
    share). Give it to a pointer tokenizer (``cold_start.pointer_words``) so that training names
    are copy pointers, as every held-out name is, however often they occur in the demos."""
    names: set[str] = set()
    for task in tasks:
        tables, cols = schema_names(task["schema"])
        names.update(tables, cols)
    return names


def fewshot_demos(
    tasks: list[dict],
    *,
    instruction: str = "",
    seed: int = 0,
    augment: int = 0,
    max_k: int = 4,
    match: float = 0.5,
    retry_frac: float = 0.0,
    style: str = "masked",
    pool: Sequence[dict] | None = None,
    template: str = "",
) -> list[list[dict[str, str]]]:
    """Cold-start chats (see the module docstring): the plain demos of ``tasks``
    (:func:`demos`), each chat's prompt preceded by ``k`` demos,
    ``k`` uniform in 0..``max_k``, drawn from ``pool`` (default: ``tasks``) outside the task's
    database; with probability ``match`` one of them (at a random place) has the task's template.
    A task's repair chats (``retry_frac``) carry the same demos as its one-turn chat."""
    pool = list(pool if pool is not None else tasks)
    by_template: dict[str, list[dict]] = {}
    for t in pool:
        by_template.setdefault(t.get("template", ""), []).append(t)
    rng = random.Random(f"sql-fewshot:{seed}")
    heads: dict[str, str] = {}
    for task in tasks:
        k = rng.randint(0, max_k)
        others = [
            t
            for t in rng.sample(pool, min(len(pool), 4 * k + 4))
            if t["db"] != task["db"] and t.get("template") != task.get("template")
        ][:k]
        if k and rng.random() < match:
            same = [t for t in by_template.get(task.get("template", ""), []) if t["db"] != task["db"]]
            if same:
                others = others[: k - 1]
                others.insert(rng.randint(0, len(others)), rng.choice(same))
        heads[fill(template, task["schema"], task["question"])] = render_fewshot([task_demo(t) for t in others], style)
    return with_prefixes(
        demos(tasks, instruction=instruction, retry_frac=retry_frac, seed=seed, augment=augment, template=template),
        heads,
    )


def memory_demos(
    tasks: list[dict],
    *,
    memory: dict,
    instruction: str = "",
    retry_frac: float = 0.25,
    seed: int = 0,
    augment: int = 0,
    template: str = "",
) -> list[list[dict[str, str]]]:
    """The cold-start demos of :func:`evolve.worlds.sql.demos` with the experiences the agent would
    recall (same store, same settings) before each prompt, so the model learns to use them."""
    style = memory.get("render", "full")
    by_prompt = {fill(template, t["schema"], t["question"]): render_memory(recall(memory, t), style) for t in tasks}
    return with_prefixes(
        demos(tasks, instruction=instruction, retry_frac=retry_frac, seed=seed, augment=augment, template=template),
        by_prompt,
    )


def tool_demos(
    tasks: list[dict],
    *,
    tools: dict,
    instruction: str = "",
    retry_frac: float = 0.25,
    seed: int = 0,
    augment: int = 0,
    template: str = "",
) -> list[list[dict[str, str]]]:
    """The cold-start demos of :func:`evolve.worlds.sql.demos`, with every gold SQL that a tool's
    template covers written as the tool call (a repair demo's final turn too)."""
    lib = ToolLibrary({n: Tool.model_validate(t) for n, t in tools.items()})
    by_template = {t.meta["template"]: t for t in lib if "template" in t.meta}
    out = []
    for chat in demos(
        tasks, instruction=instruction, retry_frac=retry_frac, seed=seed, augment=augment, template=template
    ):
        last = chat[-1]
        got = shape_of(last["content"])
        if got is not None and got[0] in by_template:
            tool = by_template[got[0]]
            chat = chat[:-1] + [{"role": "assistant", "content": call_text(tool, got[3])}]
        out.append(chat)
    return out


__all__ = ["corrupt", "demos", "fewshot_demos", "memory_demos", "name_words", "tool_demos", "with_prefixes"]
