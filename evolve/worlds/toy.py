"""A toy arithmetic world for plumbing tests, the golden run and the orchestration benchmark.

It is driven by the scripted LM (:mod:`evolve.llm.fake`): the "model" answers correctly only
for some instructions, so evolving the ``instruction`` prompt component has a known best
answer. It is never presented as a learning result.
"""

from __future__ import annotations

import random
from typing import Any

from evolve.types import Message
from evolve.world import World


def dataset(seed: int = 0, n_train: int = 40, n_val: int = 20, n_test: int = 20) -> dict[str, list[dict]]:
    rng = random.Random(seed)
    out: dict[str, list[dict]] = {}
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        out[split] = []
        for i in range(n):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            out[split].append({"id": f"{split}-{i}", "a": a, "b": b, "answer": a + b})
    return out


def agent(task: dict, ctx: Any) -> Any:
    """One LLM step: ask for a + b under the system's instruction."""
    instruction = ctx.system.prompts.get("instruction", "")
    msgs = [Message(role="system", content=instruction), Message(role="user", content=f"{task['a']} {task['b']}")]
    return ctx.llm("policy").complete(msgs).text.strip()


def reward(task: dict, output: Any) -> float:
    return 1.0 if str(output) == str(task["answer"]) else 0.0


def reply(messages: tuple[Message, ...], seed: int | None = None, temperature: float | None = None) -> str:
    """The scripted model: good at "add" instructions, sloppy otherwise; deterministic given the seed."""
    instruction = messages[0].content if messages and messages[0].role == "system" else ""
    a, b = (int(x) for x in messages[-1].content.split())
    if "add carefully" in instruction:
        return str(a + b)
    if "add" in instruction:
        return str(a + b) if (a + b) % 3 else str(a + b + 1)  # right two times in three
    return str(a * b % 100)


WORLD = World(
    name="toy",
    agent="evolve.worlds.toy:agent",
    reward="evolve.worlds.toy:reward",
    dataset="evolve.worlds.toy:dataset",
    description="a + b with a scripted model: plumbing, not learning",
)
