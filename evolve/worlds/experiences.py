"""The memory operator's entries from a world's solved trajectories (its ``memory.extract`` hook,
:mod:`evolve.world`), written once for every world.

A world's hook names what the agent's output holds that solved the task and how an entry shows it;
:func:`solved_entries` does the rest, the same for each world: a trajectory counts when its task is
among ``tasks`` (the training split the operator reads), it did not fail, it scored ``threshold``
or more and its output has that answer; each task and answer gives one entry (each task one, with
``per_task``)::

    def experiences(trajectories, tasks, *, threshold=1.0):
        return solved_entries(trajectories, tasks, threshold=threshold, answer="sql",
                              entry=lambda t, task, sql: (task["question"], {"sql": sql, "task_id": t.task_id}))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

# entry(trajectory, task, answer) -> (text, metadata): what the memory keeps of one solved trajectory
Entry = Callable[[Any, dict, Any], tuple[str, dict[str, Any]]]


def solved_entries(
    trajectories: Sequence[Any],
    tasks: dict[str, dict],
    *,
    threshold: float,
    answer: str,
    entry: Entry,
    per_task: bool = False,
) -> list[dict]:
    """Memory entries (``{"kind": "experience", "text", "metadata"}``) for the trajectories whose
    task is in ``tasks``, without an error, scored at least ``threshold``, with a non-empty
    ``output[answer]``; ``entry(trajectory, task, value)`` gives each one's text and metadata. One entry
    per task and answer (a list answer compared as a tuple), or per task with ``per_task``; the
    first trajectory wins."""
    out, seen = [], set()
    for t in trajectories:
        task = tasks.get(t.task_id)
        output = t.output if isinstance(t.output, dict) else {}
        value = output.get(answer)
        if task is None or t.error is not None or t.score < threshold or not value:
            continue
        key = t.task_id if per_task else (t.task_id, tuple(value) if isinstance(value, list) else value)
        if key in seen:
            continue
        seen.add(key)
        text, metadata = entry(t, task, value)
        out.append({"kind": "experience", "text": text, "metadata": metadata})
    return out


__all__ = ["Entry", "solved_entries"]
