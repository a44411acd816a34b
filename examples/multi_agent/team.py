"""The solver–verifier team's workflow and cold-start demos on reasoning-gym (task.yaml, tiny.yaml).

:func:`workflow` is the graph: the ``solver`` answers (the world's one call: the question under
the ``instruction`` component), the ``verifier`` reads the question and the reply and says
``yes`` or ``no`` (:data:`VERIFY`), a ``check`` (:func:`evolve.policy.roles.accepted`)
passes on an accepting verdict, and on a rejection the solver answers once more, shown its
rejected reply (:data:`RETRY`), and the verifier judges that one; then the answer is read as the
world's agent reads it, so the world's reward scores the team as it scores one agent.

:func:`solver_demos` are the solver's cold-start chats: the world's (question, gold answer) and,
for half the tasks, the retry step's message with a wrong reply and the gold answer.
:func:`verifier_pairs` are the verifier's (task.yaml): every training task twice, in the exact
message the verify step sends, with its gold answer (``yes``) and with a :func:`near_miss` of it,
the kind of mistake the solver makes (``no``). :func:`verifier_demos`, the first version, gives
half the tasks their gold answer and half another task's (tiny.yaml, through :func:`team_demos`,
both jobs' demos together for one tiny base); on SmolLM2 it taught the verifier to accept everything.
:func:`judge_rates` and :func:`retry_outcomes` say how a run's verifier judged and what its
retries did (bench/layers/rg_layers.py reports both for the team row).
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evolve.types import Trajectory

VERIFY = "Question: {question}\nReply: {reply}\nIs the reply right? Say yes or no."
RETRY = "{question}\n\nYour reply was judged wrong: {reply}\nAnswer again."
READ = "evolve.worlds.reasoning_gym:read_answer"


def workflow(
    max_tokens: int | None = None, verdict_tokens: int = 4, retries: int = 1, stop: list[str] | None = None
) -> dict[str, Any]:
    """The team's graph (JSON for ``System.workflow["graph"]``): the solver's replies cut at
    ``max_tokens`` and ``stop``, the verdict at ``verdict_tokens``, ``retries`` tries after a rejection."""
    cut: dict[str, Any] = {**({"max_tokens": max_tokens} if max_tokens else {}), **({"stop": stop} if stop else {})}
    return {
        "entry": "solve",
        "nodes": [
            {
                "id": "solve",
                "type": "llm",
                "params": {"role": "solver", "prompt": "{question}", "system": "instruction", "out": "reply", **cut},
            },
            {
                "id": "verify",
                "type": "llm",
                "params": {"role": "verifier", "prompt": VERIFY, "out": "verdict", "max_tokens": verdict_tokens},
            },
            {"id": "check", "type": "check", "params": {"fn": "evolve.policy.roles:accepted"}},
            {
                "id": "retry",
                "type": "llm",
                "max_visits": retries,
                "params": {"role": "solver", "prompt": RETRY, "system": "instruction", "out": "reply", **cut},
            },
            {
                "id": "read",
                "type": "tool",
                "params": {
                    "fn": READ,
                    "args": {"reply": "reply", "answer_format": "answer_format"},
                    "out": "answer",
                    "name": "read_answer",
                    "error_key": "extract_error",
                },
            },
            {"id": "answer", "type": "answer", "params": {"fields": ["reply", "answer", "extract_error"]}},
        ],
        "edges": [
            {"src": "solve", "dst": "verify"},
            {"src": "verify", "dst": "check"},
            {"src": "check", "dst": "retry", "when": "not ok"},  # once retry has no visits left: read
            {"src": "check", "dst": "read"},
            {"src": "retry", "dst": "verify"},
            {"src": "read", "dst": "answer"},
        ],
    }


def verifier_demos(tasks: list[dict], *, seed: int = 0) -> list[list[dict[str, str]]]:
    """The verifier's cold-start chats (see the module docstring); tasks without a gold answer give none."""
    from evolve.worlds.reasoning_gym.answer import written

    rng = random.Random(f"verifier-demos:{seed}")
    golds = [t for t in tasks if t.get("answer") is not None]
    out = []
    for i, task in enumerate(golds):
        fmt = task.get("answer_format", "answer_line")
        others = [t["answer"] for t in golds if t["answer"] != task["answer"]]
        right = i % 2 == 0 or not others
        reply = written(task["answer"] if right else rng.choice(others), fmt)
        out.append(
            [
                {"role": "user", "content": VERIFY.format(question=task["question"], reply=reply)},
                {"role": "assistant", "content": "yes" if right else "no"},
            ]
        )
    rng.shuffle(out)
    return out


def near_miss(answer: str, rng: random.Random) -> str | None:
    """A wrong answer close to ``answer``, as the SFT'd solver errs on these generators (read off its
    wrong replies at seed 0): a whole number off by 1 to 3 or by ten, its sign flipped, a digit dropped
    or added; a word written forward, two neighbouring letters swapped, one letter changed, dropped or
    doubled. ``None`` for an answer of another kind (a list, a fraction, several words)."""
    a = answer.strip()
    if re.fullmatch(r"-?\d+", a):
        n = int(a)
        options = {n + d for d in (-3, -2, -1, 1, 2, 3, -10, 10)} | {-n, n // 10, n * 10 + rng.randrange(10)}
        options.discard(n)
        return str(rng.choice(sorted(options)))
    if not re.fullmatch(r"[A-Za-z]+", a):
        return None
    i, letters = rng.randrange(len(a)), "abcdefghijklmnopqrstuvwxyz"
    edits = {
        a[::-1],
        a[:i] + a[i + 1 :],
        a[:i] + a[i] + a[i:],
        a[:i] + rng.choice(letters.replace(a[i].lower(), "")) + a[i + 1 :],
    }
    if len(a) > 1:
        j = rng.randrange(len(a) - 1)
        edits.add(a[:j] + a[j + 1] + a[j] + a[j + 2 :])
    edits = {e for e in edits if e and e != a}
    return rng.choice(sorted(edits))


def verifier_pairs(tasks: list[dict], *, seed: int = 0) -> list[list[dict[str, str]]]:
    """The verifier's cold-start chats as contrastive pairs: every training task twice, in the exact
    message the verify step sends, once with its gold answer (``yes``) and once with a
    :func:`near_miss` of it (``no``; another task's answer where none can be made). Both verdicts
    on every question, so the question alone cannot tell the verdict, and the wrong answers look
    like the solver's own, not like another task's, which :func:`verifier_demos` used and which
    taught the verifier to accept all the solver's answers (docs/results.md)."""
    from evolve.worlds.reasoning_gym.answer import written

    rng = random.Random(f"verifier-pairs:{seed}")
    golds = [t for t in tasks if t.get("answer") is not None]
    out = []
    for task in golds:
        fmt = task.get("answer_format", "answer_line")
        gold = str(task["answer"])
        wrong = near_miss(gold, rng)
        if wrong is None:
            others = [str(t["answer"]) for t in golds if str(t["answer"]) != gold]
            wrong = rng.choice(others) if others else None
        for reply, said in [(gold, "yes"), (wrong, "no")]:
            if reply is not None:
                content = VERIFY.format(question=task["question"], reply=written(reply, fmt))
                out.append([{"role": "user", "content": content}, {"role": "assistant", "content": said}])
    rng.shuffle(out)
    return out


def judge_rates(trajectories: Sequence[Trajectory], tasks: Mapping[str, dict]) -> dict[str, Any] | None:
    """How the verifier judged in ``trajectories`` (``tasks``: id -> task): every verifier call, and the
    reply before it graded by the generator's own scorer (right: full marks). Returns the replies judged,
    how many were right and wrong, the share accepted among the right ones (``accept_right``) and among
    the wrong ones (``accept_wrong``: 1.0 is a verifier that lets every mistake through), its
    ``accuracy`` as the workflow's check reads it (no verdict rejects) and the calls with no verdict;
    ``None`` when no call was the verifier's."""
    from evolve.policy.roles import verdict
    from evolve.types import LLMCall

    n, yes, unread = {True: 0, False: 0}, {True: 0, False: 0}, 0
    for t in trajectories:
        task, reply = tasks[t.task_id], None
        for step in t.steps:
            if not isinstance(step, LLMCall):
                continue
            if step.role != "verifier":
                reply = step.output
            elif reply is not None:
                right = _right(task, reply)
                said = verdict(step.output)
                n[right] += 1
                yes[right] += said is True
                unread += said is None
    total = n[True] + n[False]
    if not total:
        return None
    return {
        "judged": total,
        "right": n[True],
        "wrong": n[False],
        "accept_right": round(yes[True] / n[True], 3) if n[True] else None,
        "accept_wrong": round(yes[False] / n[False], 3) if n[False] else None,
        "accuracy": round((yes[True] + n[False] - yes[False]) / total, 3),
        "no_verdict": unread,
    }


def retry_outcomes(trajectories: Sequence[Trajectory], tasks: Mapping[str, dict]) -> dict[str, int]:
    """What the retries did in ``trajectories``: of the rollouts whose first reply was rejected, how many
    went from a wrong first reply to a right final answer (``fixed``), from right to wrong (``broken``),
    or stayed wrong or right; ``kept`` counts the rollouts with no retry. Right: full marks from the
    generator's scorer (the final answer's from the rollout's own score)."""
    from evolve.types import LLMCall

    out = dict.fromkeys(("kept", "fixed", "broken", "stayed_wrong", "stayed_right"), 0)
    for t in trajectories:
        task = tasks[t.task_id]
        replies = [s.output for s in t.steps if isinstance(s, LLMCall) and s.role != "verifier"]
        if len(replies) < 2:
            out["kept"] += 1
            continue
        first, final = _right(task, replies[0]), t.score >= 1.0
        if first == final:
            out["stayed_right" if final else "stayed_wrong"] += 1
        else:
            out["fixed" if final else "broken"] += 1
    return out


def _right(task: dict, reply: str) -> bool:
    """Whether ``reply`` earns full marks from the world's reward (the task's generator's scorer)."""
    from evolve.worlds.reasoning_gym.reward import reward

    return reward(task, reply).score >= 1.0


def solver_demos(tasks: list[dict], *, instruction: str = "", seed: int = 0) -> list[list[dict[str, str]]]:
    """The solver's cold-start chats: the world's (the question, the gold answer), and for every other
    task the retry step's message (the question and a wrong reply judged wrong) with the gold answer,
    so the solver has seen both of its steps."""
    from evolve.worlds.reasoning_gym import demos
    from evolve.worlds.reasoning_gym.agent import instruction_of
    from evolve.worlds.reasoning_gym.answer import written

    rng = random.Random(f"retry-demos:{seed}")
    out = demos(tasks, instruction=instruction, seed=seed)
    golds = [t for t in tasks if t.get("answer") is not None]
    for task in golds[::2]:
        fmt = task.get("answer_format", "answer_line")
        others = [t["answer"] for t in golds if t["answer"] != task["answer"]]
        if not others:
            continue
        system = instruction_of({"instruction": instruction}, fmt)
        user = RETRY.format(question=task["question"], reply=written(rng.choice(others), fmt))
        out.append(
            [
                {"role": "system", "content": system},
                {"role": "user", "content": user},
                {"role": "assistant", "content": written(task["answer"], fmt)},
            ]
        )
    rng.shuffle(out)
    return out


def team_demos(tasks: list[dict], *, instruction: str = "", seed: int = 0) -> list[list[dict[str, str]]]:
    """The solver's demos and the verifier's, shuffled together (one base that has seen both jobs)."""
    both = solver_demos(tasks, instruction=instruction, seed=seed) + verifier_demos(tasks, seed=seed)
    random.Random(f"team-demos:{seed}").shuffle(both)
    return both


__all__ = [
    "READ",
    "RETRY",
    "VERIFY",
    "judge_rates",
    "near_miss",
    "retry_outcomes",
    "solver_demos",
    "team_demos",
    "verifier_demos",
    "verifier_pairs",
    "workflow",
]
