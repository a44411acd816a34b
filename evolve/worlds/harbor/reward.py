"""The reward: what the task's own tests said (the agent ran them in its environment after it
stopped, see :mod:`.agent`). The tests' output is the feedback the reflective operators read."""

from __future__ import annotations

from typing import Any

from evolve.types import Reward


def reward(task: dict, output: Any, trajectory: Any = None) -> Reward:
    """``tests/test.sh``'s verdict: the reward file's score (``reward.json``'s ``reward`` key, else
    its only value; ``reward.txt``'s number), every key of the rewards a component (``reward.txt``
    gives ``reward``), feedback the tests' output."""
    v = output.get("verifier") if isinstance(output, dict) else None
    if not isinstance(v, dict) or "score" not in v:
        raise ValueError(
            f"Harbor task {task.get('id')}: the output has no verifier result; the harbor world's "
            "agent runs the tests (agent: evolve.worlds.harbor:agent or a wrapper that returns its output)"
        )
    notes = []
    if output.get("agent_timed_out"):
        limit = task.get("agent_timeout")
        notes.append(f"the agent ran out of its {limit:g} s" if limit else "the agent ran out of its time")
    if not output.get("commands") and not output.get("agent"):
        notes.append("the agent ran no command")
    if v.get("stopped"):
        notes.append(v["stopped"])
    if v.get("network"):
        notes.append(f"the tests ran without a network ({v['network']})")
    feedback = (
        f"tests/test.sh exit code {v.get('exit_code')} ({v.get('source')}): "
        + (v.get("output") or "(no output)")
        + ("\n" + "; ".join(notes) if notes else "")
    )
    comps = {k: float(x) for k, x in (v.get("components") or {}).items()}
    return Reward(score=float(v["score"]), components=comps, feedback=feedback)


__all__ = ["reward"]
