"""Few-shot demos for the tiny SQL model: how a ``demos`` prompt component is shown, and a cold
start that teaches the model to read them.

A demo is a solved task. Shown in full (schema, question, SQL) a demo costs ~300 tokens and its
rare words take the copy pointers the task's own names need (see :mod:`evolve.policy.pointer`;
the memory experiment measured recalled examples in full costing 12 points). So a demo is shown
*masked*, as one line before the prompt::

    e: how many t0 have c0 > v0 = select count(*) from t0 where c0 > v0

names and values replaced by the placeholders of the SQL's skeleton (``t0`` tables, ``c0``
columns, ``v0`` literals, as :func:`evolve.worlds.sql.memory.skeleton` masks them), the same in
the question as in the SQL: the line says how a question's wording maps onto SQL structure, in
words the tokenizer keeps, and moves no pointer. ``style="full"`` shows ``e: <question> = <sql>``.

A demo is a JSON object in the ``demos`` component (:mod:`evolve.prompts.components`): either
``{"input": <the user message it was asked with>, "output": <sql>}`` (what ``bootstrap_demos``
harvests from successful trajectories) or ``{"question": ..., "sql": ...}`` (a DSPy signature's
fields; ``gold_sql`` is read as ``sql`` too). Only the question and the SQL are shown.

:func:`fewshot_demos` is the cold start (``models.policy.cold_start.demos``): the plain SFT
chats, each with ``k`` demos (0..``max_k``) of other training tasks before the prompt, of which
one has the task's own template with probability ``match`` — so the model learns that copying a
matching demo's structure pays and that a non-matching one is to be ignored.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

from evolve.types import Message

Q_MARK = "\nq: "


def sql_of(demo: dict) -> str:
    for k in ("sql", "gold_sql", "output", "answer"):
        v = demo.get(k)
        if isinstance(v, str) and v.strip():
            from evolve.worlds.sql.agent import clean_sql

            return clean_sql(v)
    return ""


def _question_of(demo: dict) -> str:
    q = demo.get("question")
    if isinstance(q, str):
        return " ".join(q.split())
    text = str(demo.get("input", ""))
    # the question is what follows the last "q: " (a harvested input may hold demo lines before it)
    if Q_MARK in text:
        return " ".join(text.rsplit(Q_MARK, 1)[1].split())
    return " ".join(text.rsplit("q: ", 1)[-1].split())


def mask(question: str, sql: str) -> tuple[str, str]:
    """``(question, sql)`` with every name and literal of the SQL replaced by its skeleton
    placeholder (``t0``, ``c0``, ``v0``...), in both. Unparseable SQL is returned as it is."""
    from evolve.toolforge.abstract import shape_of

    got = shape_of(sql)
    if got is None:
        return question, sql
    template, idents, values, kwargs = got
    masked_sql = template.format(**{p: p for p in idents + values})
    masked_sql = masked_sql.replace(" ( ", "(").replace(" )", ")").replace(" , ", ", ").replace(" . ", ".")
    q = question
    for p in values:  # literals first: a text value may contain a name
        v = kwargs[p]
        if isinstance(v, str):
            q = q.replace(f"'{v}'", p) if f"'{v}'" in q else re.sub(rf"(?<![\w.]){re.escape(v)}(?!\w|\.\d)", p, q)
        else:
            lit = str(v)
            alts = {lit, str(int(v))} if isinstance(v, float) and float(v).is_integer() else {lit}
            for a in sorted(alts, key=len, reverse=True):
                q = re.sub(rf"(?<![\w.]){re.escape(a)}(?!\w|\.\d)", p, q)
    for p in sorted(idents, key=lambda s: -len(str(kwargs[s]))):  # longer names first
        q = re.sub(rf"(?<!\w){re.escape(str(kwargs[p]))}(?!\w)", p, q, flags=re.IGNORECASE)
    return q, masked_sql


def render_line(demo: dict, style: str = "masked") -> str:
    """One demo as a prompt line (``e: <question> = <sql>``), masked unless ``style="full"``."""
    q, sql = _question_of(demo), sql_of(demo)
    if style != "full":
        q, sql = mask(q, sql)
    return f"e: {q} = {sql}\n"


def render(demos: Sequence[dict] | None, style: str = "masked") -> str:
    """The demos as the lines put before the prompt ('' for none)."""
    return "".join(render_line(d, style) for d in demos or [])


def demos_of(system: Any) -> list[dict]:
    """The system's ``demos`` component (the default step's), parsed; [] when absent or empty."""
    prompts = getattr(system, "prompts", None) or {}
    if not prompts.get("demos") and not prompts.get("policy.demos"):
        return []
    from evolve.prompts.components import get_demos

    return get_demos(prompts)


def fewshot_messages(task: dict, demos: Sequence[dict], instruction: str = "", style: str = "masked") -> list[Message]:
    """The agent's opening messages with ``demos`` shown before the prompt."""
    from evolve.worlds.sql.agent import messages_for

    msgs = messages_for(task, instruction)
    head = render(demos, style)
    if head:
        last = msgs[-1]
        msgs[-1] = Message(role=last.role, content=head + last.content)
    return msgs


def task_demo(task: dict) -> dict:
    """A training task as a demo object (its question and gold SQL)."""
    return {"question": task["question"], "sql": task["gold_sql"]}


def fewshot_demos(tasks: list[dict], *, instruction: str = "", seed: int = 0, augment: int = 0, max_k: int = 4,
                  match: float = 0.5, retry_frac: float = 0.0, style: str = "masked",
                  pool: Sequence[dict] | None = None) -> list[list[dict[str, str]]]:
    """Cold-start chats (see the module docstring): the plain demos of ``tasks``
    (:func:`evolve.worlds.sql.dataset.demos`), each chat's prompt preceded by ``k`` demos,
    ``k`` uniform in 0..``max_k``, drawn from ``pool`` (default: ``tasks``) outside the task's
    database; with probability ``match`` one of them (at a random place) has the task's template.
    A task's repair chats (``retry_frac``) carry the same demos as its one-turn chat."""
    from evolve.worlds.sql.dataset import demos as plain_demos
    from evolve.worlds.sql.questions import prompt_text

    pool = list(pool if pool is not None else tasks)
    by_template: dict[str, list[dict]] = {}
    for t in pool:
        by_template.setdefault(t.get("template", ""), []).append(t)
    rng = random.Random(f"sql-fewshot:{seed}")
    heads: dict[str, str] = {}
    for task in tasks:
        k = rng.randint(0, max_k)
        others = [t for t in rng.sample(pool, min(len(pool), 4 * k + 4)) if t["db"] != task["db"]
                  and t.get("template") != task.get("template")][:k]
        if k and rng.random() < match:
            same = [t for t in by_template.get(task.get("template", ""), []) if t["db"] != task["db"]]
            if same:
                others = others[: k - 1]
                others.insert(rng.randint(0, len(others)), rng.choice(same))
        heads[prompt_text(task["schema"], task["question"])] = render([task_demo(t) for t in others], style)
    from evolve.worlds.sql.dataset import with_prefixes

    return with_prefixes(plain_demos(tasks, instruction=instruction, retry_frac=retry_frac, seed=seed, augment=augment), heads)


__all__ = ["demos_of", "fewshot_demos", "fewshot_messages", "mask", "render", "render_line", "task_demo"]
