"""Small agents and rewards for the runner tests, importable by path (``tests.helpers.agents:one_step``)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import Any

from evolve.types import Message


def one_step(task: dict, ctx: Any) -> Any:
    """One LLM call: the reply is the output."""
    return ctx.llm("policy").complete([Message(role="user", content=str(task["q"]))]).text


def logprobs_wanted(task: dict, ctx: Any) -> Any:
    """The output is whether the rollout's reader wants log-probs (``RolloutJob.logprobs``, carried to the context)."""
    return ctx.logprobs


def max_tokens_cap(task: dict, ctx: Any) -> Any:
    """The output is the rollout's token cap (``RolloutJob.max_tokens``, carried to the context)."""
    return ctx.max_tokens


def exact(task: dict, output: Any) -> float:
    return 1.0 if output == task.get("answer") else 0.0


def boom_agent(task: dict, ctx: Any) -> Any:
    if task.get("boom"):
        raise ValueError(f"agent exploded on {task['id']}")
    return one_step(task, ctx)


def boom_reward(task: dict, output: Any) -> float:
    if task.get("boom_reward"):
        raise RuntimeError("reward exploded")
    return exact(task, output)


def _write_pid(task: dict, pid: int) -> None:
    path = task.get("pid_file")
    if path:
        with open(path, "a") as f:
            f.write(f"{pid}\n")


def maybe_hang(task: dict, ctx: Any) -> Any:
    """Hangs (without checking the deadline) when the task says so; writes its pids first.
    With ``child: true`` it also starts a subprocess that sleeps, to check group kills."""
    if task.get("hang"):
        _write_pid(task, os.getpid())
        if task.get("child"):
            p = subprocess.Popen(["sleep", "100"])
            _write_pid(task, p.pid)
        time.sleep(100)
    return one_step(task, ctx)


def maybe_crash(task: dict, ctx: Any) -> Any:
    if task.get("crash"):
        os._exit(3)
    if task.get("segv"):
        os.kill(os.getpid(), signal.SIGSEGV)
    return one_step(task, ctx)


def seeded_reply(messages: tuple, seed: int | None = None, temperature: float | None = None) -> str:
    """A scripted reply that depends on the seed when sampling (temperature > 0)."""
    if temperature:
        return f"{messages[-1].content}#{seed}"
    return messages[-1].content.upper()


def exit_agent(task: dict, ctx: Any) -> Any:
    raise SystemExit(5)


# ----------------------------------------------------------------------------- a rewarded behaviour for RL tests


def vowel_dataset(seed: int = 0, n_train: int = 60, n_val: int = 8, n_test: int = 8) -> dict[str, list[dict]]:
    """Tasks whose reward is the share of vowels the model writes (a behaviour, not a fact)."""
    letters = "bcdfghjklmnpqrstvwxz"
    out: dict[str, list[dict]] = {}
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        out[split] = [{"id": f"{split}-{i}", "q": letters[(i * 7 + seed) % len(letters)] * 2} for i in range(n)]
    return out


def vowel_agent(task: dict, ctx: Any) -> Any:
    """Two turns with feedback in between (context, not a target), so trajectories are multi-turn."""
    msgs = [Message(role="user", content=str(task["q"]))]
    first = ctx.llm("policy").complete(msgs).text
    msgs += [Message(role="assistant", content=first), Message(role="user", content="more")]
    second = ctx.llm("policy").complete(msgs).text
    return first + second


def vowel_demos(tasks: list[dict], **_: Any) -> list[list[dict]]:
    """Demo chats for the vowel world: the agent's two turns, answered with vowels."""
    return [
        [
            {"role": "user", "content": str(t["q"])},
            {"role": "assistant", "content": "aeio"},
            {"role": "user", "content": "more"},
            {"role": "assistant", "content": "ua"},
        ]
        for t in tasks
    ]


def vowel_reward(task: dict, output: Any) -> float:
    text = str(output or "")[:8]
    return sum(ch in "aeiou" for ch in text) / 8


# ----------------------------------------------------------------------------- toolforge world
# Sum the squares of a list with at most 3 tool calls: the base agent squares one number per call
# (and fails on long lists); a synthesised ``sum_squares`` tool solves any list in one call.


def squares_dataset(seed: int = 0, n_train: int = 24, n_val: int = 8, n_test: int = 8) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for split, n in (("train", n_train), ("val", n_val), ("test", n_test)):
        out[split] = [
            {"id": f"{split}-{i}", "xs": [(i * 3 + j + seed) % 7 for j in range(1 + i % 5)]} for i in range(n)
        ]
    return out


def _square(x: int) -> int:
    return x * x


def squares_agent(task: dict, ctx: Any) -> Any:
    from evolve.worlds.sql.tools import toolbox

    box = toolbox(ctx.system)
    if box is not None and "sum_squares" in box.library:
        return box.call(ctx, "sum_squares", xs=task["xs"])
    if len(task["xs"]) > 3:
        return None  # out of tool calls
    return sum(ctx.tool("square", _square, x=x) for x in task["xs"])


def squares_reward(task: dict, output: Any) -> float:
    return float(output == sum(x * x for x in task["xs"]))


SUM_SQUARES_TOOL = '''```python
def sum_squares(xs):
    """The sum of the squares of a list of numbers."""
    return sum(x * x for x in xs)
```
```json
{"tests": [{"kwargs": {"xs": [1, 2, 3]}, "expect": 14}, {"kwargs": {"xs": []}, "expect": 0}],
 "reproduces": [{"example": 1, "kwargs": {"xs": [%s]}}]}
```'''


def toolsmith(messages: tuple) -> str:
    """A scripted toolsmith: reads example 1 (``square({"x": N})``) and claims to reproduce it."""
    import re

    m = re.search(r'\[1\] \(task solved\) square\(\{"x": (\d+)\}\)', messages[-1].content)
    return SUM_SQUARES_TOOL % (m.group(1) if m else "0")


# ----------------------------------------------------------------------------- exact accounting (budgets, dry run)
# Every rollout makes exactly one LLM call (the scripted model echoes); the reward is the system's
# prompts["level"] / 100, so every child of LevelUp passes both acceptance stages.


def level_dataset(seed: int = 0, n_train: int = 30, n_val: int = 6, n_test: int = 5) -> dict[str, list[dict]]:
    return {
        split: [{"id": f"{split}-{i}", "x": i} for i in range(n)]
        for split, n in (("train", n_train), ("val", n_val), ("test", n_test))
    }


def level_agent(task: dict, ctx: Any) -> Any:
    level = ctx.system.prompts.get("level", "0")
    return ctx.llm("policy").complete([Message(role="user", content=f"{level} {task['x']}")]).text


def level_agent_two_calls(task: dict, ctx: Any) -> Any:
    level_agent(task, ctx)
    return level_agent(task, ctx)


def level_reward(task: dict, output: Any) -> float:
    return int(str(output).split()[0]) / 100


class LevelUp:
    """``children`` children at levels parent+1.., each tagged with its parent (never rediscovered),
    after ``explore`` exploration rollouts of the parent; declares that cost to the dry run."""

    name = "level_up"

    def __init__(self, children: int = 2, explore: int = 3) -> None:
        self.children, self.explore = children, explore

    def estimate(self, plan: Any) -> dict[str, int]:
        return {"rollouts": self.explore, "llm_calls": 0, "children": self.children}

    def propose(self, parent: Any, ctx: Any) -> list:
        from evolve.types import Candidate

        if self.explore:
            ctx.rollouts(parent, list(ctx.train)[: self.explore], tag="explore")
        level = int(parent.prompts.get("level", "0"))
        return [
            Candidate(
                system=parent.replace(
                    prompts={**parent.prompts, "level": str(level + i + 1), "from": f"{parent.id[:8]}/{i}"}
                ),
                parents=(parent.id,),
                operator=self.name,
            )
            for i in range(self.children)
        ]


# ----------------------------------------------------------------------------- a noisy grader
# The system's prompts["kind"] is its output; the score depends on the sample index, like a grader
# whose verdicts vary from one sample to the next: "lucky" looks better than "steady" on sample 0
# only, "better" is better on every sample.

NOISY = {"steady": (0.50, 0.50), "lucky": (0.53, 0.40), "better": (0.53, 0.53), "solid": (0.54, 0.45)}


def kind_agent(task: dict, ctx: Any) -> Any:
    kind = ctx.system.prompts.get("kind", "steady")
    return ctx.llm("policy").complete([Message(role="user", content=kind)]).text


def noisy_reward(task: dict, output: Any, trajectory: Any) -> float:
    first, later = NOISY[str(output)]
    return first if trajectory.sample == 0 else later


def vote_search_task(n: int, search: dict, budget: dict) -> dict:
    """A task file (as a dict) for the topology search on the vowel world: one ``llm`` step to
    start from, a palette that may wrap it in an ``n``-vote, ``search`` as the operator's params."""
    graph = {
        "entry": "ask",
        "nodes": [
            {"id": "ask", "type": "llm", "params": {"prompt": "{q}"}},
            {"id": "answer", "type": "answer", "params": {"key": "text"}},
        ],
        "edges": [{"src": "ask", "dst": "answer"}],
    }
    palette = [{"name": "vote", "kind": "wrap", "chain_types": ["llm"], "params": {"key": "text"}, "grid": {"n": [n]}}]
    return {
        "name": "g",
        "seed": 0,
        "agent": "evolve.topology:agent",
        "reward": "tests.helpers.agents:vowel_reward",
        "models": {"policy": {"backend": "scripted", "name": "echo", "params": {"echo": True}}},
        "workflow": {"graph": graph},
        "dataset": {"source": "tests.helpers.agents:vowel_dataset"},
        "operators": [{"name": "topology", "params": {"palette": palette, **search}}],
        "runner": {"name": "thread", "workers": 2, "timeout": 10},
        "budget": budget,
        "engine": {"minibatch": 4},
    }


# ----------------------------------------------------------------------------- the Ray runner's tests


def where(task: dict, ctx: Any) -> Any:
    """Which node ran the rollout (its IP as Ray sees it) and which process."""
    import ray

    return {"ip": ray.util.get_node_ip_address(), "pid": os.getpid()}


def exit_or_hang(task: dict, ctx: Any) -> Any:
    """Kills its own worker process (``exit``), hangs without checking the deadline (``hang``
    seconds), or answers."""
    if task.get("exit"):
        os._exit(7)
    if task.get("hang"):
        time.sleep(task["hang"])
    return task.get("answer")


def slow_toy(task: dict, ctx: Any) -> Any:
    """The toy world's agent, 50 ms slower (so that a run lasts long enough to be interrupted)."""
    from evolve.worlds.toy import agent

    time.sleep(0.05)
    return agent(task, ctx)


def marked_toy(task: dict, ctx: Any) -> Any:
    """:func:`slower_toy` that marks where each job starts (a file ``<node ip>-<pid>-<task id>`` in
    ``$EVOLVE_TEST_MARKS``) and runs 1.3 s on the second node of the Ray tests' cluster (127.0.0.3),
    so that a test can kill that node while one of its jobs surely runs."""
    from pathlib import Path

    ip = "local"
    with contextlib.suppress(Exception):
        import ray

        if ray.is_initialized():
            ip = ray.util.get_node_ip_address()
    marks = os.environ.get("EVOLVE_TEST_MARKS")
    if marks:
        Path(marks, f"{ip}-{os.getpid()}-{task['id']}").touch()
    time.sleep(1.3 if ip == "127.0.0.3" else 0.3)
    from evolve.worlds.toy import agent

    return agent(task, ctx)


def slower_toy(task: dict, ctx: Any) -> Any:
    """The toy world's agent, 300 ms slower: a batch is surely in flight when a node is killed."""
    from evolve.worlds.toy import agent

    time.sleep(0.3)
    return agent(task, ctx)
