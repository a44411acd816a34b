"""What the layers take from the SQL world's trajectories: the memory operator's experiences (the
solved ones)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evolve.worlds.experiences import solved_entries


def experiences(trajectories: Sequence[Any], tasks: dict[str, dict], *, threshold: float = 1.0) -> list[dict]:
    """Memory entries (``kind, text, metadata``) for the solved trajectories: the question as text,
    the SQL that scored and its database in the metadata; one per task and SQL."""
    return solved_entries(
        trajectories,
        tasks,
        threshold=threshold,
        answer="sql",
        entry=lambda t, task, sql: (
            task["question"],
            {"sql": sql, "db": task["db"], "task_id": t.task_id, "template": task.get("template")},
        ),
    )


__all__ = ["experiences"]
