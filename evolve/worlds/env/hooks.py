"""What the layers take from the env world's episodes: the memory operator's experiences (the
rewarded ones)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evolve.worlds.experiences import solved_entries


def experiences(trajectories: Sequence[Any], tasks: dict[str, dict], *, threshold: float = 1.0) -> list[dict]:
    """Memory entries (``kind, text, metadata``) for episodes that scored ``threshold`` or more: the
    first observation as text, the actions and the return in the metadata; one per episode and
    action list."""
    return solved_entries(
        trajectories,
        tasks,
        threshold=threshold,
        answer="actions",
        entry=lambda t, task, actions: (
            str(t.output.get("first_observation") or ""),
            {"actions": list(actions)[:12], "return": float(t.output.get("return") or 0.0), "task_id": t.task_id},
        ),
    )


__all__ = ["experiences"]
