"""Abstraction without an LLM: repeated action patterns become parametrised tools.

In successful trajectories the same action often recurs with different constants — the same SQL
shape over different tables, columns and values. :func:`mine_sql` lexes every successful SQL
call, replaces names with identifier parameters and literals with value parameters, groups the
calls by the shape that remains, and turns each shape seen in at least ``min_support`` distinct
tasks into a tool: ``count_where_eq(db, t0, c0, v0)`` runs ``select count(*) from "t0" where
"c0" = ?`` with the identifiers checked against a strict pattern and the values bound as SQL
parameters (so a tool call cannot inject SQL). The supporting calls become the tool's recorded
cases: in the sandbox it must return exactly the rows each of them returned.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from evolve.toolforge.tool import Tool, ToolCase
from evolve.types import ToolCall, Trajectory, content_hash

_TOKEN = re.compile(
    r"""\s*(?:('(?:[^']|'')*')|(\d+(?:\.\d+)?)|([A-Za-z_][A-Za-z0-9_]*)|("(?:[^"]|"")*")|(<=|>=|<>|!=|==|\|\||[=<>(),*.+\-/%]))"""
)
KEYWORDS = frozenset(
    """
select from where and or not group by order having limit offset asc desc distinct as join inner left right outer
cross on using is null like glob in between case when then else end union all intersect except exists collate
count sum avg min max total lower upper length round abs cast coalesce ifnull nullif substr substring trim
replace instr date time datetime julianday strftime typeof random integer real text numeric
""".split()
)
_IDENT = r"[A-Za-z_][A-Za-z0-9_]*"

TOOL_CODE = '''import re
import sqlite3
import urllib.parse

TEMPLATE = {template!r}
IDENTS = {idents!r}
VALUES = {values!r}


def {name}({signature}):
    """{doc}"""
    names = {{}}
    for key, val in zip(IDENTS, [{ident_args}]):
        if not isinstance(val, str) or not re.fullmatch(r"{ident_re}", val):
            raise ValueError(key + " must be a plain SQL name (letters, digits, _), got " + repr(val))
        names[key] = '"' + val + '"'
    sql = TEMPLATE.format(**names, **{{v: "?" for v in VALUES}})
    conn = sqlite3.connect("file:" + urllib.parse.quote(str(db)) + "?mode=ro", uri=True)
    try:
        conn.execute("pragma query_only = 1")
        rows = conn.execute(sql, [{value_args}]).fetchmany({max_rows})
    finally:
        conn.close()
    return [[v.hex() if isinstance(v, bytes) else v for v in r] for r in rows]
'''


@dataclass
class Shape:
    template: str  # e.g. 'select count ( * ) from {t0} where {c0} = {v0}'
    idents: tuple[str, ...]
    values: tuple[str, ...]
    support: list[tuple[str, dict, Any]] = field(default_factory=list)  # (task_id, kwargs with db, recorded rows)

    @property
    def tasks(self) -> int:
        return len({t for t, _, _ in self.support})


def lex(sql: str) -> list[tuple[str, str]] | None:
    """(kind, text) tokens: kinds ``str``, ``num``, ``word``, ``qident``, ``op``; None if it does not lex."""
    out: list[tuple[str, str]] = []
    pos, sql = 0, sql.strip()
    while pos < len(sql):
        m = _TOKEN.match(sql, pos)
        if not m or m.end() == pos:
            return None
        group = m.lastindex or 0  # one of the five alternatives matched
        kind = ("str", "num", "word", "qident", "op")[group - 1]
        out.append((kind, m.group(group)))
        pos = m.end()
    return out


def _literal(kind: str, text: str) -> Any:
    if kind == "str":
        return text[1:-1].replace("''", "'")
    return float(text) if "." in text else int(text)


def shape_of(sql: str) -> tuple[str, tuple[str, ...], tuple[str, ...], dict] | None:
    """``(template, ident params, value params, kwargs)`` for one SQL string, or None.
    Names become ``t0``... (after FROM/JOIN) or ``c0``... (elsewhere), the same name the same
    parameter; each literal becomes its own ``v0``..."""
    toks = lex(sql)
    if not toks:
        return None
    parts: list[str] = []
    idents: list[str] = []
    values: list[Any] = []
    kwargs: dict[str, Any] = {}
    seen: dict[Any, str] = {}
    last_kw, n_t, n_c = "", 0, 0
    aliases = {
        toks[i + 2][1].lower()
        for i in range(len(toks) - 2)  # ``from pet a``: structure, not a parameter
        if toks[i][1].lower() in ("from", "join")
        and toks[i + 1][0] == "word"
        and toks[i + 2][0] == "word"
        and toks[i + 2][1].lower() not in KEYWORDS
    }
    for kind, text in toks:
        if kind == "word" and text.lower() in aliases:
            parts.append(text.lower())
            last_kw = ""
            continue
        if kind == "word" and text.lower() in KEYWORDS:
            parts.append(text.lower())
            last_kw = text.lower()
            continue
        if kind in ("word", "qident"):
            name = text.strip('"')
            key = name.lower()
            if key not in seen:
                if last_kw in ("from", "join"):
                    seen[key], n_t = f"t{n_t}", n_t + 1
                else:
                    seen[key], n_c = f"c{n_c}", n_c + 1
                idents.append(seen[key])
                kwargs[seen[key]] = name
            parts.append("{" + seen[key] + "}")
        elif kind in ("str", "num"):
            v = f"v{len(values)}"
            values.append(v)
            kwargs[v] = _literal(kind, text)
            parts.append("{" + v + "}")
        else:
            parts.append(text)
        last_kw = ""
    return " ".join(parts), tuple(idents), tuple(values), kwargs


def _name(template: str, taken: set[str]) -> str:
    words = [
        w
        for w in re.findall(r"[a-z]+", re.sub(r"\{\w+\}", " ", template))
        if w not in ("select", "from", "on", "as", "by") and len(w) > 1
    ]  # not aliases
    ops = {"=": "eq", ">": "gt", "<": "lt", ">=": "ge", "<=": "le", "!=": "ne", "<>": "ne"}
    for op, word in ops.items():
        if f" {op} " in template:
            words.append(word)
    base = "_".join(dict.fromkeys(words))[:40] or "query"
    base = "q_" + base if not base[0].isalpha() else base
    name = base if base not in taken else f"{base}_{content_hash(template, 4)}"
    return name


def readable(template: str) -> str:
    """A shape's template as a person (or a model that reads) writes it: ``select count(*) from <t0>``."""
    return re.sub(r"\{(\w+)\}", r"<\1>", template).replace(" ( ", "(").replace(" )", ")").replace(" ,", ",")


def build_tool(shape: Shape, name: str, *, max_rows: int = 50, provenance: dict | None = None) -> Tool:
    params = ("db",) + shape.idents + shape.values
    doc = f"Run on database db: {readable(shape.template)}"
    code = TOOL_CODE.format(
        template=shape.template,
        idents=list(shape.idents),
        values=list(shape.values),
        name=name,
        signature=", ".join(params),
        doc=doc.replace('"""', "'''").replace("\\", "\\\\"),
        ident_args=", ".join(shape.idents),
        value_args=", ".join(shape.values),
        ident_re=_IDENT,
        max_rows=max_rows,
    )
    cases = tuple(ToolCase(kwargs=kw, expect=rows, source=f"recorded:{tid}") for tid, kw, rows in shape.support)
    return Tool(
        name=name,
        params=params,
        doc=doc,
        code=code,
        function=name,
        tests=cases,
        reads=("db",),
        origin="abstraction",
        provenance=dict(provenance or {}),
        meta={
            "template": shape.template,
            "idents": list(shape.idents),
            "values": list(shape.values),
            "support": shape.tasks,
        },
    )


def successful_calls(trajectories: Sequence[Trajectory], *, tool: str = "execute_sql", threshold: float = 1.0):
    """(task_id, call) for the last successful ``tool`` call of each successful trajectory."""
    for t in trajectories:
        if t.error is not None or t.score < threshold:
            continue
        calls = [s for s in t.steps if isinstance(s, ToolCall) and s.name == tool and s.error is None]
        if calls:
            yield t.task_id, calls[-1]


def mine_sql(
    trajectories: Sequence[Trajectory],
    *,
    tool: str = "execute_sql",
    sql_arg: str = "sql",
    db_arg: str = "db",
    min_support: int = 3,
    max_cases: int = 6,
    max_tools: int = 20,
    taken: Sequence[str] = (),
    provenance: dict | None = None,
) -> list[Tool]:
    """Tools for the SQL shapes that recur in at least ``min_support`` successful tasks, most
    supported first; each carries up to ``max_cases`` recorded cases to be checked in the sandbox."""
    shapes: dict[str, Shape] = {}
    for task_id, call in successful_calls(trajectories, tool=tool):
        sql, db = call.args.get(sql_arg), call.args.get(db_arg)
        if not isinstance(sql, str) or not isinstance(db, str):
            continue
        got = shape_of(sql)
        if got is None:
            continue
        template, idents, values, kwargs = got
        sh = shapes.setdefault(template, Shape(template, idents, values))
        sh.support.append((task_id, {"db": db, **kwargs}, call.result))
    by_support = sorted((s for s in shapes.values() if s.tasks >= min_support), key=lambda s: (-s.tasks, s.template))
    out, names = [], set(taken)
    for sh in by_support[:max_tools]:
        seen_tasks: dict[str, Any] = defaultdict(int)
        kept: list[Any] = []
        for tid, kw, rows in sh.support:  # one case per task, the first max_cases tasks
            if seen_tasks[tid] == 0 and len(kept) < max_cases:
                kept.append((tid, kw, rows))
            seen_tasks[tid] += 1
        name = _name(sh.template, names)
        names.add(name)
        prov = {**(provenance or {}), "trajectories": sorted({t for t, _, _ in sh.support})[:50], "support": sh.tasks}
        out.append(build_tool(Shape(sh.template, sh.idents, sh.values, kept), name, provenance=prov))
    return out


def call_text(tool: Tool, kwargs: dict) -> str:
    """How a model writes a call to an abstraction tool: ``name(pet, age, 3, 'Rex')`` — names
    bare, numbers as numbers, text in single quotes (the inverse of :func:`parse_call`)."""
    args = []
    for p in tool.params:
        if p == "db":
            continue
        a = kwargs[p]
        args.append("'" + a.replace("'", "''") + "'" if isinstance(a, str) and p.startswith("v") else str(a))
    return f"{tool.name}(" + ", ".join(args) + ")"


def parse_call(text: str) -> tuple[str, list[Any]] | None:
    """``name(a, 3, 'x')`` -> ``("name", ["a", 3, "x"])``; None if ``text`` is not one call."""
    m = re.fullmatch(r"\s*(" + _IDENT + r")\s*\((.*)\)\s*;?\s*", text, flags=re.S)
    if not m:
        return None
    toks = lex(m.group(2)) if m.group(2).strip() else []
    if toks is None:
        return None
    args, want_arg = [], True
    for kind, tok in toks:
        if want_arg and kind in ("str", "num"):
            args.append(_literal(kind, tok))
        elif want_arg and kind in ("word", "qident"):
            args.append(tok.strip('"'))
        elif not want_arg and tok == ",":
            pass
        else:
            return None
        want_arg = not want_arg
    if toks and want_arg:  # a trailing comma
        return None
    return m.group(1), args
