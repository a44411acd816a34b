"""The SQL world with experience memory: solved examples recalled into the prompt (in-context).

``System.memory`` says which store, which version of it, and how to recall (all part of Π, so
an operator can evolve them and archive rollback restores them)::

    {"store": "/path/to/store", "version": 812, "k": 1, "kinds": ["experience"], "min_similarity": 0.2}

(``"embedder": "hashing"`` for a store built with the cheap hashing embedder; default MiniLM;
``"render": "skeleton"`` shows each example as its masked SQL only, see :func:`render`;
``"recall": "random"`` recalls ``k`` experiences drawn at random (seeded by the task), under the
same exclusions: the control that tells what relevance adds over an example's mere presence.)

Before its first turn the agent searches the store (as it was at ``version``) with the question,
records the recall as a ``memory`` tool step, and puts the ``k`` best experiences before the
prompt as ``e: <question> = <sql>`` lines. An experience is a solved task: its question is the
item's text, its SQL and database in the metadata. A tiny model learns to use the examples from
demos that carry them (:func:`memory_demos`: the article's ICL stage); examples from the same
database as the task are never recalled, so training looks like test (unseen schemas).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

_VIEWS: dict[tuple[str, int], Any] = {}
_LOCK = threading.Lock()


def view(spec: dict) -> Any:
    """The read-only store view ``spec`` names (cached per store and version)."""
    key = (str(spec["store"]), int(spec["version"]))
    with _LOCK:
        v = _VIEWS.get(key)
        if v is None:
            from evolve.memory import HashingEmbedder, MemoryStore

            embedder = HashingEmbedder() if spec.get("embedder") == "hashing" else None
            v = _VIEWS[key] = MemoryStore.open_at(key[0], key[1], embedder=embedder)
        return v


def recall(spec: dict | None, task: dict) -> list[dict]:
    """The experiences recalled for ``task``: ``[{"id", "question", "sql", "similarity"}]``."""
    if not spec or not spec.get("store"):
        return []
    k = int(spec.get("k", 1))
    if k <= 0:
        return []
    mode = spec.get("recall", "similar")
    if mode == "random":
        return _random_recall(spec, task, k)
    if mode != "similar":
        raise ValueError(f"memory.recall is {mode!r}: use 'similar' (the default) or 'random'")
    hits = view(spec).search(
        task["question"], k + 8, kinds=spec.get("kinds", ["experience"]), min_similarity=spec.get("min_similarity")
    )
    out = []
    for h in hits:
        meta = h.item.metadata
        if meta.get("db") == task.get("db") or meta.get("task_id") == task.get("id") or not meta.get("sql"):
            continue
        out.append({"id": h.item.id, "question": h.item.text, "sql": meta["sql"], "similarity": round(h.similarity, 4)})
        if len(out) == k:
            break
    return out


def _random_recall(spec: dict, task: dict, k: int) -> list[dict]:
    import random

    kinds = set(spec.get("kinds", ["experience"]))
    items = sorted(view(spec).view().values(), key=lambda it: it.id)
    pool = [
        it
        for it in items
        if it.kind in kinds
        and it.metadata.get("sql")
        and it.metadata.get("db") != task.get("db")
        and it.metadata.get("task_id") != task.get("id")
    ]
    picked = random.Random(f"recall/{task.get('id')}").sample(pool, min(k, len(pool)))
    return [{"id": it.id, "question": it.text, "sql": it.metadata["sql"], "similarity": None} for it in picked]


def skeleton(sql: str) -> str:
    """``select count(*) from t0 where c0 > v0``: the SQL with names and values masked (as
    DAIL-SQL masks domain words), so an example shows structure without naming anything."""
    from evolve.worlds.sql.abstract import shape_of

    got = shape_of(sql)
    if got is None:
        return sql
    text = got[0].format(**{p: p for p in got[1] + got[2]})
    return text.replace(" ( ", "(").replace(" )", ")").replace(" , ", ", ").replace(" . ", ".")


def render(examples: Sequence[dict], style: str = "full") -> str:
    """The recalled examples as prompt lines: ``full`` (``e: <question> = <sql>``) or
    ``skeleton`` (``e: <masked sql>``: structure only, no names — nothing shifts the copy
    pointers of the task's own names, and nothing to copy by mistake)."""
    if style == "skeleton":
        return "".join(f"e: {skeleton(e['sql'])}\n" for e in examples)
    return "".join(f"e: {e['question']} = {e['sql']}\n" for e in examples)
