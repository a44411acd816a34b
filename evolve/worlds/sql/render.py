"""How the SQL agent's user message is laid out: the prompt component ``template``.

The agent fills the system's ``template`` prompt component (see :mod:`evolve.prompts.components`)
with these fields, so the layout of the prompt is a searchable choice like any other component
(the ``prompt_choice`` operator, :mod:`evolve.prompts.choices`):

* ``{schema}`` — the tables as the task gives them: ``schema: pet(id,name,owner_id) owner(id,name)``;
* ``{schema_linked}`` — the same tables, those the question names first (schema linking by
  name; otherwise in the given order);
* ``{schema_pruned}`` — only the tables the question names (by table name, else by a column
  name), plus a table a kept one points to when the question names one of its columns, plus a
  table that joins two kept ones not linked directly; all of them when it names none;
* ``{schema_sql}`` — the same tables as SQL DDL, one ``CREATE TABLE pet (id, name, age, owner_id);``
  a line: the layout a pretrained model has read most (SmolLM2-135M-Instruct answered 5 of 100
  validation tasks with it, 1 with ``{schema}``: ``bench/worlds/smollm_layouts.py``);
* ``{schema_sql_pruned}`` — ``{schema_pruned}``'s tables as that DDL (8 of 100 in the same probe);
* ``{question}`` — the question.

Names match the question's words exactly, case aside; what surrounds the tables (a prefix such
as ``schema: ``, a trailing line) is kept. Without a template the message is
:data:`DEFAULT_TEMPLATE`, ``{schema}\\nq: {question}``, the layout every shipped cold start is
trained on. The few-shot demos read the question back from
what follows the last ``q: `` (or ``Question: ``), so a template should end with ``q: {question}``
(or ``Question: {question}``).
"""

from __future__ import annotations

import re
import string

from evolve.errors import UserError

DEFAULT_TEMPLATE = "{schema}\nq: {question}"
FIELDS = ("schema", "schema_linked", "schema_pruned", "schema_sql", "schema_sql_pruned", "question")
_TABLE = re.compile(r"(\w+)\(([^)]*)\)")


class TemplateError(UserError, ValueError):
    """A prompt template names a field the SQL agent does not fill, or is not a format string."""


def tables(schema_text: str) -> list[tuple[str, list[str]]]:
    """``"schema: a(id,x) b(id,a_id)"`` -> ``[("a", ["id", "x"]), ("b", ["id", "a_id"])]``."""
    return [(m.group(1), m.group(2).split(",")) for m in _TABLE.finditer(schema_text)]


def _relayout(schema_text: str, keep: list[str]) -> str:
    """``schema_text`` with its tables replaced by the table texts ``keep`` (a subset, in the
    new order); whatever comes before the first table and after the last is kept as it is."""
    found = list(_TABLE.finditer(schema_text))
    if not found:
        return schema_text
    head, tail = schema_text[: found[0].start()], schema_text[found[-1].end() :]
    return head + " ".join(keep) + tail


def _words(question: str) -> set[str]:
    return set(re.findall(r"\w+", question.lower()))  # exact names: a plural rule matched "pages" to page


def _column(col: str) -> str:
    """``" name text"`` -> ``"name"``: the column's name in a typed or spaced list."""
    parts = col.split()
    return parts[0].lower() if parts else ""


def _named(name: str, words: set[str]) -> bool:
    return name.lower() in words


def linked(schema_text: str, question: str) -> str:
    """The tables the question names come first; the order is otherwise kept."""
    w = _words(question)
    found = list(_TABLE.finditer(schema_text))
    order = sorted(found, key=lambda m: not _named(m.group(1), w))  # sorted() is stable
    return _relayout(schema_text, [m.group(0) for m in order])


def _linked_by_key(a: tuple[str, list[str]], b: tuple[str, list[str]]) -> bool:
    """One of the two tables has a ``<other>_id`` column."""
    return f"{b[0].lower()}_id" in {_column(c) for c in a[1]} or f"{a[0].lower()}_id" in {_column(c) for c in b[1]}


def pruned(schema_text: str, question: str) -> str:
    """Only the tables the question is about (see the module docstring)."""
    w = _words(question)
    found, ts = list(_TABLE.finditer(schema_text)), tables(schema_text)
    cols = [{_column(c) for c in t[1]} - {"id"} for t in ts]
    keep = {i for i, t in enumerate(ts) if _named(t[0], w)} or {i for i in range(len(ts)) if cols[i] & w}
    if not keep:
        return schema_text
    for i, t in enumerate(ts):  # a parent table whose column the question names
        if i not in keep and cols[i] & w and any(f"{t[0].lower()}_id" in cols[k] for k in keep):
            keep.add(i)
    for i, t in enumerate(ts):  # a table that joins two kept tables that are not linked directly
        if i not in keep and any(
            _linked_by_key(t, ts[a]) and _linked_by_key(t, ts[b]) and not _linked_by_key(ts[a], ts[b])
            for a in keep
            for b in keep
            if a < b
        ):
            keep.add(i)
    return _relayout(schema_text, [m.group(0) for i, m in enumerate(found) if i in keep])


def as_ddl(schema_text: str) -> str:
    """``"schema: pet(id,name) owner(id,city)"`` -> ``"CREATE TABLE pet (id, name);\\nCREATE TABLE owner (id, city);"``
    (the column lists as given; text around the tables is dropped)."""
    return "\n".join(
        f"CREATE TABLE {name} ({', '.join(c.strip() for c in cols)});" for name, cols in tables(schema_text)
    )


def _fields(template: str) -> set[str]:
    """The fields ``template`` names, every one of them in :data:`FIELDS`; else :class:`TemplateError`."""
    try:
        parsed = [(f, spec, conv) for _, f, spec, conv in string.Formatter().parse(template) if f is not None]
    except ValueError as e:
        raise TemplateError(
            f"prompt template {template!r} is not a format string ({e}); write fields as "
            f"{{schema}} and {{question}}, and a literal brace as {{{{ or }}}}"
        ) from None
    fancy = [f for f, spec, conv in parsed if spec or conv]
    if fancy:
        raise TemplateError(
            f"prompt template {template!r}: write the field {fancy[0]!r} plainly, as "
            f"{{{fancy[0].split('!')[0]}}}, without a format spec or conversion"
        )
    names = {f for f, _, _ in parsed}
    bad = sorted(names - set(FIELDS))
    if bad:
        raise TemplateError(
            f"prompt template {template!r} names {', '.join(bad)}; the SQL agent fills "
            f"{', '.join('{' + f + '}' for f in FIELDS)}"
        )
    return names


def check_template(template: str) -> str:
    """``template`` if every field it names is one of :data:`FIELDS`, else :class:`TemplateError`."""
    _fields(template)
    return template


def fill(template: str | None, schema_text: str, question: str) -> str:
    """The user message for one task under ``template`` (:data:`DEFAULT_TEMPLATE` when empty)."""
    template = template or DEFAULT_TEMPLATE
    names = _fields(template)  # parsed once: this runs in every rollout
    values = dict.fromkeys(FIELDS, "") | {"schema": schema_text, "question": question}
    if "schema_linked" in names:
        values["schema_linked"] = linked(schema_text, question)
    if names & {"schema_pruned", "schema_sql_pruned"}:
        values["schema_pruned"] = pruned(schema_text, question)
        values["schema_sql_pruned"] = as_ddl(values["schema_pruned"])
    if "schema_sql" in names:
        values["schema_sql"] = as_ddl(schema_text)
    return template.format(**values)
