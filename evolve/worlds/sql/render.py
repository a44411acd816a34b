"""How the SQL agent's user message is laid out: the prompt component ``template``.

The agent fills the system's ``template`` prompt component (see :mod:`evolve.prompts.components`)
with these fields, so the layout of the prompt is a searchable choice like any other component
(the ``prompt_choice`` operator, :mod:`evolve.prompts.choices`):

* ``{schema}`` — the tables as the task gives them: ``schema: pet(id,name,owner_id) owner(id,name)``;
* ``{schema_linked}`` — the same tables, those the question names first (schema linking by
  name; otherwise in the given order);
* ``{schema_pruned}`` — only the tables the question names (by table name, else by a column
  name), plus a table a kept one points to when the question names one of its columns; all of
  them when it names none;
* ``{question}`` — the question.

Without a template the message is :data:`DEFAULT_TEMPLATE`, ``{schema}\\nq: {question}``, the
layout every shipped cold start is trained on. The few-shot demos read the question back from
what follows the last ``q: ``, so a template should end with ``q: {question}``.
"""

from __future__ import annotations

import re
import string

from evolve.errors import UserError

DEFAULT_TEMPLATE = "{schema}\nq: {question}"
FIELDS = ("schema", "schema_linked", "schema_pruned", "question")
_TABLE = re.compile(r"(\w+)\(([^)]*)\)")


class TemplateError(UserError, ValueError):
    """A prompt template names a field the SQL agent does not fill, or is not a format string."""


def tables(schema_text: str) -> list[tuple[str, list[str]]]:
    """``"schema: a(id,x) b(id,a_id)"`` -> ``[("a", ["id", "x"]), ("b", ["id", "a_id"])]``."""
    return [(m.group(1), m.group(2).split(",")) for m in _TABLE.finditer(schema_text)]


def _fmt(ts: list[tuple[str, list[str]]]) -> str:
    return "schema: " + " ".join(f"{name}({','.join(cols)})" for name, cols in ts)


def _words(question: str) -> set[str]:
    return set(re.findall(r"\w+", question.lower()))


def linked(schema_text: str, question: str) -> str:
    """The tables the question names come first; the order is otherwise kept."""
    ts, w = tables(schema_text), _words(question)
    if not ts:
        return schema_text
    return _fmt(sorted(ts, key=lambda t: t[0] not in w))  # sorted() is stable


def pruned(schema_text: str, question: str) -> str:
    """Only the tables the question is about (see the module docstring)."""
    ts, w = tables(schema_text), _words(question)
    keep = {n for n, _ in ts if n in w} or {n for n, cols in ts if any(c in w for c in cols if c != "id")}
    if not keep:
        return schema_text
    for name, cols in ts:  # a parent table whose column the question names
        if name not in keep and any(f"{name}_id" in c for k, c in ts if k in keep) and \
                any(c in w for c in cols if c != "id"):
            keep.add(name)
    return _fmt([t for t in ts if t[0] in keep])


def check_template(template: str) -> str:
    """``template`` if every field it names is one of :data:`FIELDS`, else :class:`TemplateError`."""
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise TemplateError(f"prompt template {template!r} is not a format string ({e}); write fields as "
                            f"{{schema}} and {{question}}, and a literal brace as {{{{ or }}}}") from None
    bad = sorted({f for f in names if f not in FIELDS})
    if bad:
        raise TemplateError(f"prompt template {template!r} names {', '.join(bad)}; the SQL agent fills "
                            f"{', '.join('{' + f + '}' for f in FIELDS)}")
    return template


def fill(template: str | None, schema_text: str, question: str) -> str:
    """The user message for one task under ``template`` (:data:`DEFAULT_TEMPLATE` when empty)."""
    template = check_template(template or DEFAULT_TEMPLATE)
    names = {f for _, f, _, _ in string.Formatter().parse(template) if f}
    values = {"schema": schema_text, "question": question, "schema_linked": "", "schema_pruned": ""}
    if "schema_linked" in names:
        values["schema_linked"] = linked(schema_text, question)
    if "schema_pruned" in names:
        values["schema_pruned"] = pruned(schema_text, question)
    return template.format(**values)
