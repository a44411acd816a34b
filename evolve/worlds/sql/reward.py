"""The execution-match reward: the final SQL's rows against the gold query's."""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from typing import Any

from evolve.types import Reward
from evolve.worlds.sql.db import clean_sql, compiles, error_text, execute


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
        return Reward(
            score=0.0, components=zero, feedback="cannot run the gold query", error=f"{type(e).__name__}: {e}"
        )
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
