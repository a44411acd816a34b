"""Safe SQL execution, the multi-turn SQL agent, and the execution-match reward."""

from __future__ import annotations

import re
import sqlite3
import time
import urllib.parse
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

from evolve.types import Message, Reward
from evolve.worlds.sql.memory import recall, render
from evolve.worlds.sql.questions import prompt_text
from evolve.worlds.sql.render import fill
from evolve.worlds.sql.tools import NotACall, run_call, toolbox

MAX_ROWS = 50
TIMEOUT_S = 1.0
_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}


class SQLError(Exception):
    """A query was refused or failed; ``str(e)`` is the short message the model sees."""


def _authorizer(action: int, *_: Any) -> int:
    return sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY


def _strip_literals(sql: str) -> str:
    return re.sub(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"", "''", sql)


def clean_sql(text: Any) -> str:
    """Model output -> one SQL string: code fences removed, whitespace collapsed, trailing ``;`` dropped."""
    if not isinstance(text, str):
        return ""
    m = re.search(r"```(?:sql)?\s*(.*?)```", text, flags=re.S | re.I)
    if m:
        text = m.group(1)
    return " ".join(text.split()).rstrip("; ").strip()


def _check(sql: Any) -> str:
    if not isinstance(sql, str):
        raise SQLError(f"query must be a string, got {type(sql).__name__}")
    sql = sql.strip().rstrip(";").strip()
    if not sql:
        raise SQLError("empty query")
    bare = _strip_literals(sql)
    if ";" in bare:
        raise SQLError("only one statement is allowed")
    if not re.match(r"select\b", bare.lstrip("( \n\t"), flags=re.I):
        raise SQLError("only select queries are allowed")
    return sql


def _connect(db: str | Path, timeout: float) -> sqlite3.Connection:
    path = Path(db)
    if not path.is_file():
        raise SQLError(f"no such database: {db}")
    uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=timeout, check_same_thread=False)
    conn.execute("pragma query_only = 1")
    conn.set_authorizer(_authorizer)
    deadline = time.monotonic() + timeout
    conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 1000)
    return conn


def _json(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.hex()
    return v


def execute(db: str, sql: str, *, max_rows: int = MAX_ROWS, timeout: float = TIMEOUT_S) -> list[list[Any]]:
    """Run one SELECT on the database file ``db``, read-only, and return at most ``max_rows``
    rows as lists of JSON values. Anything else (writes, several statements, a query running
    past ``timeout`` seconds, an sqlite error) raises :class:`SQLError` with a short message."""
    sql = _check(sql)
    conn = _connect(db, timeout)
    try:
        rows = conn.execute(sql).fetchmany(max_rows)
    except sqlite3.Error as e:
        msg = str(e)
        raise SQLError("query timed out" if "interrupt" in msg else msg) from None
    finally:
        conn.close()
    return [[_json(v) for v in r] for r in rows]


def compiles(db: str, sql: str) -> bool:
    """Whether sqlite accepts ``sql`` (a single allowed SELECT whose names all resolve)."""
    try:
        sql = _check(sql)
        conn = _connect(db, TIMEOUT_S)
    except SQLError:
        return False
    try:
        conn.execute("explain " + sql).fetchall()
        return True
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def error_text(e: BaseException) -> str:
    """The tool message the model sees after a failed query, e.g. ``error: no such column: agee``."""
    msg = " ".join(str(e).split()) or type(e).__name__
    return "error: " + msg[:120]


# ----------------------------------------------------------------------------- agent


def messages_for(task: dict, instruction: str = "", examples: list[dict] | None = None,
                 style: str = "full", demos: list[dict] | None = None, demo_style: str = "masked",
                 template: str = "") -> list[Message]:
    """The opening messages of an episode: an optional system instruction, then the prompt laid
    out by ``template`` (see :mod:`evolve.worlds.sql.render`; empty: ``schema: ...\\nq: ...``),
    after the few-shot demos (see :mod:`evolve.worlds.sql.fewshot`) and the recalled experiences
    (see :mod:`evolve.worlds.sql.memory`) when there are any."""
    out = [Message(role="system", content=instruction)] if instruction else []
    head = render(examples, style) if examples else ""
    if demos:
        from evolve.worlds.sql.fewshot import render as render_demos

        head = render_demos(demos, demo_style) + head
    body = fill(template, task["schema"], task["question"]) if template else prompt_text(task["schema"], task["question"])
    out.append(Message(role="user", content=head + body))
    return out


def act(ctx: Any, box: Any, said: str, db: str) -> tuple[str, Any]:
    """Run what the model said: a call when it names one of the system's query tools (in the
    sandbox), else SQL. Returns ``(the sql it stands for, rows)``."""
    if box is not None:
        try:
            return run_call(ctx, box, said, db)
        except NotACall:
            pass
    return said, ctx.tool("execute_sql", execute, db=db, sql=said)


def agent(task: dict, ctx: Any) -> dict:
    """Write SQL for ``task``; on an error, show it to the model and let it rewrite.

    Settings (``ctx.system.workflow``): ``max_turns`` (3), ``max_tokens`` (160),
    ``retry_on_empty`` (False: an empty result also counts as an error to rewrite).
    Prompt component ``instruction`` becomes the system message when non-empty; ``template`` lays
    out the user message (:mod:`evolve.worlds.sql.render`: which schema rendering, where). When the
    system has query tools (``System.tools``, see :mod:`evolve.worlds.sql.tools`), an answer
    that calls one runs that tool in the sandbox instead. When it has an experience memory
    (``System.memory``, see :mod:`evolve.worlds.sql.memory`), the recalled examples come first;
    the prompt component ``demos`` (see :mod:`evolve.worlds.sql.fewshot`) comes before them,
    shown as ``workflow.demo_style`` says (``masked``, default, or ``full``).
    Returns ``{"sql": final_sql, "rows": rows or None, "turns": n}``.
    """
    system = ctx.system
    wf = dict(getattr(system, "workflow", None) or {})
    instruction = (getattr(system, "prompts", None) or {}).get("instruction", "") or ""
    max_turns = max(1, int(wf.get("max_turns", 3)))
    max_tokens = int(wf.get("max_tokens", 160))
    retry_on_empty = bool(wf.get("retry_on_empty", False))
    db = task["db"]
    spec = getattr(system, "memory", None) or {}
    examples = ctx.tool("recall_memory", lambda query: recall(spec, task), query=task["question"]) if spec.get("store") else []
    from evolve.prompts.components import get_template
    from evolve.worlds.sql.fewshot import demos_of

    messages = messages_for(task, instruction, examples, spec.get("render", "full"), demos_of(system),
                            str(wf.get("demo_style", "masked")), get_template(getattr(system, "prompts", None) or {}))
    llm = ctx.llm("policy")
    sql, turn = "", 0
    box = toolbox(system)
    for turn in range(1, max_turns + 1):
        completion = llm.complete(messages, max_tokens=max_tokens, stop=None)
        said = sql = clean_sql(getattr(completion, "text", ""))
        try:
            sql, rows = act(ctx, box, said, db)
            if retry_on_empty and not rows and turn < max_turns:
                raise SQLError("no rows returned")
        except Exception as e:  # noqa: BLE001 - every failure is shown to the model
            messages += [Message(role="assistant", content=said), Message(role="tool", content=error_text(e))]
            continue
        return {"sql": sql, "rows": rows, "turns": turn}
    return {"sql": sql, "rows": None, "turns": turn}


# ----------------------------------------------------------------------------- reward


def _norm(v: Any) -> Any:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return round(float(v), 6)
    return v


def _rows(db: str, sql: str) -> list[tuple]:
    return [tuple(_norm(v) for v in r) for r in execute(db, sql, max_rows=1000)]


@lru_cache(maxsize=8192)
def _gold_rows(db: str, sql: str) -> tuple[tuple, ...]:
    return tuple(_rows(db, sql))


def _fmt(row: tuple) -> str:
    return "(" + ", ".join(repr(v) for v in row) + ")"


def _diff(gold: list[tuple], got: list[tuple]) -> str:
    if len(gold) != len(got):
        s = f"expected {len(gold)} rows, got {len(got)}"
    elif Counter(gold) == Counter(got):
        return f"right rows in the wrong order; expected first row {_fmt(gold[0])}, got {_fmt(got[0])}"
    else:
        s = f"expected {len(gold)} rows and got {len(got)}, with different values"
    missing = list((Counter(gold) - Counter(got)).elements())
    extra = list((Counter(got) - Counter(gold)).elements())
    if missing:
        s += f"; missing row {_fmt(missing[0])}"
    if extra:
        s += f"; unexpected row {_fmt(extra[0])}"
    return s


def _output_sql(output: Any) -> Any:
    if isinstance(output, str):
        return output
    if isinstance(output, dict):
        return output.get("sql")
    return None


def reward(task: dict, output: Any, trajectory: Any = None) -> Reward:
    """Execution match: 1.0 when the final SQL returns the gold rows (a multiset; a list
    when the gold SQL has ``order by``), else 0.0. Components ``parses``, ``executes``,
    ``matches``. Never raises on a malformed output."""
    zero = {"parses": 0.0, "executes": 0.0, "matches": 0.0}
    try:
        db, gold_sql = task["db"], task["gold_sql"]
        gold = list(_gold_rows(str(db), gold_sql))
    except Exception as e:  # noqa: BLE001 - a broken task is the reward's own failure
        return Reward(score=0.0, components=zero, feedback="cannot run the gold query", error=f"{type(e).__name__}: {e}")
    sql = _output_sql(output)
    if not isinstance(sql, str) or not sql.strip():
        return Reward(score=0.0, components=zero, feedback="no sql was given")
    sql = clean_sql(sql)
    parses = compiles(db, sql)
    try:
        got = _rows(db, sql)
    except Exception as e:  # noqa: BLE001
        comps = dict(zero, parses=float(parses))
        return Reward(score=0.0, components=comps, feedback=error_text(e))
    ordered = " order by " in f" {gold_sql.lower()} "
    match = got == gold if ordered else Counter(got) == Counter(gold)
    comps = {"parses": 1.0, "executes": 1.0, "matches": float(match)}
    feedback = "correct" if match else _diff(gold, got)
    return Reward(score=float(match), components=comps, feedback=feedback)
