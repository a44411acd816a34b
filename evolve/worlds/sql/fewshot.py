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

:func:`evolve.worlds.sql.coldstart.fewshot_demos` is the cold start (``cold_start.demos``): the plain SFT
chats, each with ``k`` demos (0..``max_k``) of other training tasks before the prompt, of which
one has the task's own template with probability ``match`` — so the model learns that copying a
matching demo's structure pays and that a non-matching one is to be ignored.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from evolve.worlds.sql.db import clean_sql

Q_MARK = "\nq: "


def sql_of(demo: dict) -> str:
    for k in ("sql", "gold_sql", "output", "answer"):
        v = demo.get(k)
        if isinstance(v, str) and v.strip():
            return clean_sql(v)
    return ""


def _question_of(demo: dict) -> str:
    q = demo.get("question")
    if isinstance(q, str):
        return " ".join(q.split())
    text = str(demo.get("input", ""))
    # the question is what follows the last "q: " (a harvested input may hold demo lines before it)
    for mark in (Q_MARK, "\nQuestion: "):  # the default layout's, then task_smollm.yaml's
        if mark in text:
            return " ".join(text.rsplit(mark, 1)[1].split())
    return " ".join(text.rsplit("q: ", 1)[-1].split())


def mask(question: str, sql: str) -> tuple[str, str]:
    """``(question, sql)`` with every name and literal of the SQL replaced by its skeleton
    placeholder (``t0``, ``c0``, ``v0``...), in both. Unparseable SQL is returned as it is."""
    from evolve.worlds.sql.abstract import shape_of

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


def task_demo(task: dict) -> dict:
    """A training task as a demo object (its question and gold SQL)."""
    return {"question": task["question"], "sql": task["gold_sql"]}


__all__ = ["demos_of", "mask", "render", "render_line", "sql_of", "task_demo"]
