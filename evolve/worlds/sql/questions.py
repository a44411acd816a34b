"""Question templates: natural-language questions with paraphrases and canonical gold SQL.

Canonical SQL style (one way to write each query): lowercase keywords, single spaces,
``count(*)``, text literals in single quotes, joins as
``select a.x from t a join u b on a.u_id = b.id where b.y = 'v'``, explicit ``asc``/``desc``.
Questions name tables and columns exactly as in the schema and give values as literals
(text values quoted), so the answer is fully determined by the question and the schema.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Callable

from evolve.worlds.sql.schema import Schema, Table

MAX_PROMPT = 220  # chars of "schema: ...\nq: ..."
MAX_SQL = 90

_WORDS = {
    ">": ("greater than", "more than", "above", "over"),
    "<": ("less than", "below", "under", "smaller than"),
    "=": ("", "equal to"),
}
_FN = {
    "max": ("maximum", "highest", "largest"),
    "min": ("minimum", "lowest", "smallest"),
    "avg": ("average", "mean"),
    "sum": ("total", "sum of"),
}
_DIR = {"desc": ("highest", "largest", "biggest"), "asc": ("lowest", "smallest", "least")}

Draft = tuple[str, str, Callable[[list], bool]]  # (question, sql, check on the rows)


def _j(s: str) -> str:
    return " ".join(s.split())


def _lit(v: object) -> str:
    return f"'{v}'" if isinstance(v, str) else str(v)


def _filter(rng: random.Random, t: Table, exclude: tuple[str, ...] = ()) -> tuple[str, str, str] | None:
    """(column, op, literal) selecting some but not all rows of ``t``."""
    cols = [c for c in t.data_columns() if c.name not in exclude]
    if not cols:
        return None
    c = rng.choice(cols)
    vals = t.values(c.name)
    distinct = sorted(set(vals))
    if len(distinct) < 2:
        return None
    op = "=" if c.is_text else rng.choice(("=", ">", "<"))
    if op == "=":
        v = rng.choice(vals)
    elif op == ">":
        v = rng.choice(distinct[:-1])
    else:
        v = rng.choice(distinct[1:])
    return c.name, op, _lit(v)


def _cond(rng: random.Random, col: str, op: str, lit: str) -> str:
    w = rng.choice(_WORDS[op])
    form = rng.randrange(4)
    if form == 0:
        return f"with {col} {op} {lit}"
    if form == 1:
        return _j(f"whose {col} is {w} {lit}")
    if form == 2:
        return f"where {col} {op} {lit}"
    return _j(f"having {col} {w if op != '=' else ''} {lit}")


def _jcond(rng: random.Random, col: str, op: str, lit: str) -> str:
    if rng.random() < 0.5:
        return f"has {col} {op} {lit}"
    return _j(f"has {col} {rng.choice(_WORDS[op])} {lit}")


def _some_not_all(n: int) -> Callable[[list], bool]:
    return lambda rows: 0 < len(rows) < n


def _count_pos(rows: list) -> bool:
    return bool(rows) and (rows[0][0] or 0) > 0


def _not_null(rows: list) -> bool:
    return bool(rows) and all(v is not None for v in rows[0])


def select_where(rng: random.Random, s: Schema) -> Draft | None:
    t = rng.choice(s.tables)
    f = _filter(rng, t)
    if f is None:
        return None
    cols = [c.name for c in t.data_columns() if c.name != f[0]]
    if not cols:
        return None
    c = rng.choice(cols)
    p = rng.choice(
        (
            "what are the {c} of {t} {cond}?",
            "list the {c} of {t} {cond}.",
            "show the {c} of all {t} {cond}.",
            "give me the {c} of each {t} {cond}.",
        )
    )
    q = p.format(c=c, t=t.name, cond=_cond(rng, *f))
    return q, f"select {c} from {t.name} where {f[0]} {f[1]} {f[2]}", _some_not_all(len(t.rows))


def count_where(rng: random.Random, s: Schema) -> Draft | None:
    t = rng.choice(s.tables)
    f = _filter(rng, t)
    if f is None:
        return None
    p = rng.choice(
        (
            "how many {t} are there {cond}?",
            "count the {t} {cond}.",
            "what is the number of {t} {cond}?",
            "find how many {t} exist {cond}.",
        )
    )
    q = p.format(t=t.name, cond=_cond(rng, *f))
    return q, f"select count(*) from {t.name} where {f[0]} {f[1]} {f[2]}", _count_pos


def _agg_parts(rng: random.Random, s: Schema) -> tuple[Table, str, str, str] | None:
    ts = [t for t in s.tables if t.data_columns("int")]
    if not ts:
        return None
    t = rng.choice(ts)
    c = rng.choice(t.data_columns("int")).name
    fn = rng.choice(tuple(_FN))
    return t, c, fn, rng.choice(_FN[fn])


def aggregate(rng: random.Random, s: Schema) -> Draft | None:
    parts = _agg_parts(rng, s)
    if parts is None:
        return None
    t, c, fn, fw = parts
    p = rng.choice(
        (
            "what is the {fw} {c} of {t}?",
            "find the {fw} {c} among all {t}.",
            "give the {fw} {c} over {t}.",
            "what is the {fw} {c} across {t}?",
        )
    )
    return p.format(fw=fw, c=c, t=t.name), f"select {fn}({c}) from {t.name}", _not_null


def aggregate_where(rng: random.Random, s: Schema) -> Draft | None:
    parts = _agg_parts(rng, s)
    if parts is None:
        return None
    t, c, fn, fw = parts
    f = _filter(rng, t, exclude=(c,))
    if f is None:
        return None
    p = rng.choice(
        (
            "what is the {fw} {c} of {t} {cond}?",
            "find the {fw} {c} among {t} {cond}.",
            "for {t} {cond}, what is the {fw} {c}?",
        )
    )
    q = p.format(fw=fw, c=c, t=t.name, cond=_cond(rng, *f))
    return q, f"select {fn}({c}) from {t.name} where {f[0]} {f[1]} {f[2]}", _not_null


def _ordered(t: Table, o: str, direction: str, k: int) -> bool:
    """True when the first k+1 values of ``o`` in this order are all distinct (no ties)."""
    vals = sorted(t.values(o), reverse=direction == "desc")[: k + 1]
    return len(t.rows) > k and len(set(vals)) == len(vals)


def _order_parts(rng: random.Random, s: Schema, k: int) -> tuple[Table, str, str, str] | None:
    ts = [t for t in s.tables if t.data_columns("int") and len(t.data_columns()) >= 2]
    if not ts:
        return None
    t = rng.choice(ts)
    o = rng.choice(t.data_columns("int")).name
    c = rng.choice([x.name for x in t.data_columns() if x.name != o])
    d = rng.choice(("asc", "desc"))
    return (t, c, o, d) if _ordered(t, o, d, k) else None


def order_limit(rng: random.Random, s: Schema) -> Draft | None:
    k = rng.randint(2, 5)
    parts = _order_parts(rng, s, k)
    if parts is None:
        return None
    t, c, o, d = parts
    p = rng.choice(
        (
            "list the {c} of the {k} {t} with the {dw} {o}.",
            "what are the {c} of the {k} {t} with the {dw} {o}?",
            "show the {c} of the {k} {t} having the {dw} {o}, in order.",
        )
    )
    q = p.format(c=c, k=k, t=t.name, dw=rng.choice(_DIR[d]), o=o)
    return q, f"select {c} from {t.name} order by {o} {d} limit {k}", bool


def argmax(rng: random.Random, s: Schema) -> Draft | None:
    parts = _order_parts(rng, s, 1)
    if parts is None:
        return None
    t, c, o, d = parts
    p = rng.choice(
        (
            "which {t} has the {dw} {o}? give its {c}.",
            "what is the {c} of the {t} with the {dw} {o}?",
            "find the {c} of the {t} whose {o} is the {dw}.",
        )
    )
    q = p.format(c=c, t=t.name, dw=rng.choice(_DIR[d]), o=o)
    return q, f"select {c} from {t.name} order by {o} {d} limit 1", bool


def _join_parts(rng: random.Random, s: Schema) -> tuple[Table, Table, tuple[str, str, str]] | None:
    pairs = [(t, s.table(fk.ref)) for t in s.tables for fk in t.fks() if fk.ref is not None]
    if not pairs:
        return None
    t1, t2 = rng.choice(pairs)
    f = _filter(rng, t2)
    return None if f is None else (t1, t2, f)


def _join_sql(head: str, t1: str, t2: str, f: tuple[str, str, str]) -> str:
    return f"select {head} from {t1} a join {t2} b on a.{t2}_id = b.id where b.{f[0]} {f[1]} {f[2]}"


def join(rng: random.Random, s: Schema) -> Draft | None:
    parts = _join_parts(rng, s)
    if parts is None:
        return None
    t1, t2, f = parts
    c = rng.choice(t1.data_columns()).name
    p = rng.choice(
        (
            "what are the {c} of {t1} whose {t2} {jc}?",
            "list the {c} of {t1} whose {t2} {jc}.",
            "show the {c} of every {t1} linked to a {t2} that {jc}.",
            "for {t1} whose {t2} {jc}, give the {c}.",
        )
    )
    q = p.format(c=c, t1=t1.name, t2=t2.name, jc=_jcond(rng, *f))
    return q, _join_sql(f"a.{c}", t1.name, t2.name, f), _some_not_all(len(t1.rows))


def join_count(rng: random.Random, s: Schema) -> Draft | None:
    parts = _join_parts(rng, s)
    if parts is None:
        return None
    t1, t2, f = parts
    p = rng.choice(
        (
            "how many {t1} have a {t2} that {jc}?",
            "count the {t1} whose {t2} {jc}.",
            "what is the number of {t1} whose {t2} {jc}?",
        )
    )
    q = p.format(t1=t1.name, t2=t2.name, jc=_jcond(rng, *f))
    return q, _join_sql("count(*)", t1.name, t2.name, f), _count_pos


def group_count(rng: random.Random, s: Schema) -> Draft | None:
    opts = [
        (t, c.name) for t in s.tables for c in t.columns if c.kind in ("cat", "fk") and len(set(t.values(c.name))) >= 2
    ]
    if not opts:
        return None
    t, g = rng.choice(opts)
    p = rng.choice(
        (
            "for each {g}, how many {t} are there?",
            "count the {t} for each {g}.",
            "how many {t} are there per {g}?",
            "show each {g} of {t} with its number of {t}.",
        )
    )
    n = len(t.rows)
    return p.format(g=g, t=t.name), f"select {g}, count(*) from {t.name} group by {g}", lambda rows: 2 <= len(rows) < n


TEMPLATES: dict[str, Callable[[random.Random, Schema], Draft | None]] = {
    "select_where": select_where,
    "count_where": count_where,
    "aggregate": aggregate,
    "aggregate_where": aggregate_where,
    "order_limit": order_limit,
    "argmax": argmax,
    "join": join,
    "join_count": join_count,
    "group_count": group_count,
}


def prompt_text(schema_text: str, question: str) -> str:
    """The user message the model sees: ``schema: ...\\nq: ...``."""
    return f"{schema_text}\nq: {question}"


def make_questions(
    rng: random.Random, s: Schema, conn: sqlite3.Connection, n: int, *, tries: int = 60
) -> list[tuple[str, str, str]]:
    """Up to ``n`` distinct (template, question, gold_sql) for ``s``, each verified on ``conn``:
    the gold SQL runs, its result is non-empty and passes the template's check, and the
    rendered prompt and SQL fit the length budget."""
    out: list[tuple[str, str, str]] = []
    seen: set[str] = set()
    schema_text = s.render()
    names = list(TEMPLATES)
    for _ in range(tries):
        if len(out) >= n:
            break
        name = rng.choice(names)
        draft = TEMPLATES[name](rng, s)
        if draft is None:
            continue
        q, sql, check = draft
        if sql in seen or len(sql) > MAX_SQL or len(prompt_text(schema_text, q)) > MAX_PROMPT:
            continue
        rows = conn.execute(sql).fetchall()
        if not rows or not check(rows):
            continue
        seen.add(sql)
        out.append((name, q, sql))
    return out
