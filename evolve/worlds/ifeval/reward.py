"""The reward: IFEval's checkers on the reply.

The score is the share of the prompt's instructions the reply follows by the strict rule (partial
credit, the signal RLVR trains on). The components hold what the benchmark's four figures are
made of, so that any set of scored prompts can be summed into them
(:func:`evolve.worlds.ifeval.scoring.summary`): ``instructions`` (how many), ``strict`` and
``loose`` (how many followed), ``prompt_strict`` and ``prompt_loose`` (1 when all were), and
``strict:<id>`` / ``n:<id>`` per instruction type; ``echo`` is 1 when the reply contains the whole
prompt (repeating the prompt back scores 30.4 on IFEval's strict average, above SmolLM2-135M's
card: ``bench/worlds/ifeval_floors.py``; a system that learns to echo is reward hacking, and the summary
shows how often it happens).

Feedback, for training and validation prompts only, names the instructions not followed (the
reflective operators and Reflexion read it). A test prompt's feedback is empty: the grader's
verdict on a test prompt never reaches a system, not even inside a Reflexion attempt.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from evolve.types import Reward
from evolve.worlds.ifeval.checks import verdicts

HIDDEN = ("test", "unseen")  # splits whose verdicts are never fed back


def reply_of(output: Any) -> str:
    if isinstance(output, dict):
        output = output.get("reply")
    return output if isinstance(output, str) else ""


def reward(task: Mapping[str, Any], output: Any, trajectory: Any = None) -> Reward:
    """Score ``output`` on ``task``'s instructions (see the module docstring); never raises on a
    malformed output (no reply follows nothing)."""
    reply = reply_of(output)
    ids, kwargs = task["instruction_id_list"], task["kwargs"]
    strict = verdicts(reply, ids, kwargs)
    loose = verdicts(reply, ids, kwargs, loose=True)
    n = len(ids)
    comps: dict[str, float] = {
        "instructions": float(n),
        "strict": float(sum(strict)),
        "loose": float(sum(loose)),
        "prompt_strict": float(all(strict)),
        "prompt_loose": float(all(loose)),
        "echo": float(bool(reply) and task["prompt"].strip().lower() in reply.lower()),
    }
    for iid, ok in zip(ids, strict):
        comps[f"n:{iid}"] = comps.get(f"n:{iid}", 0.0) + 1
        comps[f"strict:{iid}"] = comps.get(f"strict:{iid}", 0.0) + float(ok)
    if task.get("split") in HIDDEN:
        feedback = ""
    elif all(strict):
        feedback = f"followed all {n} instruction(s)"
    else:
        missed = [iid for iid, ok in zip(ids, strict) if not ok]
        feedback = f"followed {sum(strict)} of {n} instruction(s); not followed: {', '.join(missed)}"
    return Reward(score=sum(strict) / n if n else 0.0, components=comps, feedback=feedback)


__all__ = ["HIDDEN", "reply_of", "reward"]
