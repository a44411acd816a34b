"""A scripted stand-in for a model in the SQL world, so that a whole SQL-world run (real
databases, real ``execute_sql`` tool calls, execution-match reward, rewrites after an error)
takes seconds: it knows the gold SQL of the small dataset below and answers a share of the
questions right that grows with how careful the system's instruction is. The rest it gets wrong
in two ways: a typo the database rejects (then, shown the error, it writes the gold SQL) or a
query that runs and returns the wrong rows. Which questions is fixed by a hash of the question
and the instruction, so a better instruction fixes some tasks and breaks a few others.

    models: {policy: {backend: scripted, name: sql-oracle, params: {reply: "tests.helpers.sql_scripted:reply"}}}
"""

from __future__ import annotations

import functools
import hashlib
from typing import Any

SIZES = {"n_train": 40, "n_val": 24, "n_test": 24}
SKILL = {"": 0.25, "write sql": 0.45, "write correct sql": 0.65, "write correct sql carefully": 0.85}
INSTRUCTIONS = list(SKILL)[1:]


@functools.lru_cache(maxsize=1)
def _gold() -> dict[str, str]:
    from evolve.worlds import sql

    data = sql.dataset(seed=0, **SIZES)
    return {t["question"]: t["gold_sql"] for tasks in data.values() for t in tasks}


def _content(m: Any, key: str) -> str:
    return getattr(m, key) if not isinstance(m, dict) else m[key]


def reply(messages: Any, seed: int | None = None, temperature: float | None = None) -> str:
    system = next((_content(m, "content") for m in messages if _content(m, "role") == "system"), "").strip()
    user = next(_content(m, "content") for m in messages if _content(m, "role") == "user")
    question = user.rsplit("q: ", 1)[-1].strip()
    gold = _gold().get(question)
    if gold is None:
        return "select 1"
    luck = int(hashlib.sha256(f"{question}|{system}".encode()).hexdigest(), 16) % 1000 / 1000
    skill = SKILL.get(system, SKILL[""])
    shown_error = any(_content(m, "role") == "tool" for m in messages)
    if luck < skill or (shown_error and luck < skill + 0.1):
        return gold
    if luck < skill + 0.1:
        return "selec" + gold[len("select") :]  # rejected by the database; the next turn sees the error
    return "select count(*) from sqlite_master"


def task(**extra: Any) -> dict[str, Any]:
    """A three-generation SQL-world run with this model and a prompt operator choosing the instruction."""
    return {
        "name": "sql-scripted",
        "world": "sql",
        "seed": 0,
        "models": {
            "policy": {
                "backend": "scripted",
                "name": "sql-oracle",
                "params": {"reply": "tests.helpers.sql_scripted:reply"},
            }
        },
        "prompts": {"instruction": ""},
        "dataset": {"params": dict(SIZES)},
        "operators": [{"name": "scripted", "params": {"component": "instruction", "choices": INSTRUCTIONS}}],
        "runner": {"name": "thread", "workers": 4, "timeout": 30},
        "budget": {"generations": 3},
        "engine": {"minibatch": 12},
        **extra,
    }
