"""What the layers take from this world: the memory operator's experiences (generated training
prompts a reply followed every instruction of, with that reply) and the run's IFEval figures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from evolve.worlds.experiences import solved_entries
from evolve.worlds.ifeval.scoring import summary


def experiences(trajectories: Sequence[Any], tasks: dict[str, dict], *, threshold: float = 1.0) -> list[dict]:
    """Memory entries (``kind, text, metadata``): the prompt as the text, the reply that followed
    every instruction in the metadata; one per task. Only training tasks are given here (the
    memory operator reads the training split), so no test prompt becomes a memory."""
    return solved_entries(
        trajectories,
        tasks,
        threshold=threshold,
        answer="reply",
        per_task=True,
        entry=lambda t, task, reply: (
            task["prompt"],
            {"reply": reply, "task_id": t.task_id, "instructions": ",".join(task["instruction_id_list"])},
        ),
    )


__all__ = ["experiences", "summary"]
