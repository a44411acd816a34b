"""What the layers mine from the SQL world's trajectories: memory entries from the solved ones."""

from __future__ import annotations

from typing import Any, Sequence


def experiences(trajectories: Sequence[Any], tasks: dict[str, dict], *, threshold: float = 1.0) -> list[dict]:
    """Memory entries (``kind, text, metadata``) for the solved trajectories: the question as text,
    the SQL that scored and its database in the metadata; one per task and SQL."""
    out, seen = [], set()
    for t in trajectories:
        task = tasks.get(t.task_id)
        sql = t.output.get("sql") if isinstance(t.output, dict) else None
        if task is None or t.error is not None or t.score < threshold or not sql or (t.task_id, sql) in seen:
            continue
        seen.add((t.task_id, sql))
        out.append({"kind": "experience", "text": task["question"],
                    "metadata": {"sql": sql, "db": task["db"], "task_id": t.task_id, "template": task.get("template")}})
    return out


__all__ = ["experiences"]
