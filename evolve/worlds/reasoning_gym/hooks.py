"""What the layers take from this world: the cold start's demos (the generators' own gold
answers, in the agent's message format) and the memory operator's experiences."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from evolve.worlds.experiences import solved_entries
from evolve.worlds.reasoning_gym.agent import messages_for, recall
from evolve.worlds.reasoning_gym.answer import written
from evolve.worlds.reasoning_gym.generators import score


def demos(
    tasks: list[dict], *, instruction: str = "", template: str = "", seed: int = 0, memory: dict | None = None
) -> list[list[dict[str, str]]]:
    """SFT chats ``[system, user, assistant]`` in the agent's exact messages (the same instruction
    and template; with ``memory``, the experiences the agent would recall), the assistant turn the
    gold answer written in the task's format (``Answer: 42``). Tasks whose gold answer the
    package's own scorer does not give 1 (generators whose answer is checked by simulation rather
    than compared) give no demo; none at all is an error naming them."""
    prompts = {k: v for k, v in {"instruction": instruction, "template": template}.items() if v}
    out, skipped = [], set()
    for task in tasks:
        if task.get("answer") is None or score(task, task["answer"]) < 1.0:
            skipped.add(task["generator"])
            continue
        head = [m.model_dump() for m in messages_for(task, prompts, recall(memory, task))]
        turn = written(task["answer"], task.get("answer_format", "answer_line"))
        out.append(head + [{"role": "assistant", "content": turn}])
    if not out:
        raise ValueError(f"no cold-start demos: the scorer of {sorted(skipped)} does not accept its own gold answers")
    random.Random(f"rg-demos:{seed}").shuffle(out)
    return out


def experiences(trajectories: Sequence[Any], tasks: dict[str, dict], *, threshold: float = 1.0) -> list[dict]:
    """Memory entries (``kind, text, metadata``) for the solved trajectories: the question as the
    text, the answer that scored in the metadata; one per task and answer."""
    return solved_entries(
        trajectories,
        tasks,
        threshold=threshold,
        answer="answer",
        entry=lambda t, task, answer: (
            task["question"],
            {"answer": answer, "task_id": t.task_id, "generator": task.get("generator"), "level": task.get("level")},
        ),
    )


__all__ = ["demos", "experiences"]
