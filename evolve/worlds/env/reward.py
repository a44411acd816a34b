"""The env world's reward.

The score is what the environment paid (``score``: the episode's return, its last reward, or its
largest); the feedback the reflective operators and Reflexion read is how the episode went: its
steps, return, whether it ended, refused actions, and the last observation."""

from __future__ import annotations

from typing import Any

from evolve.types import Reward


def reward(task: dict, output: Any, trajectory: Any = None) -> Reward:
    """The environment's own rewards, summed (or as ``task["env"]["score"]`` says)."""
    if not isinstance(output, dict) or not isinstance(output.get("rewards"), list):
        raise ValueError(
            f"env episode {task.get('id')}: the output has no 'rewards'; the env world's agent plays "
            "the episode (agent: evolve.worlds.env:agent or a wrapper that returns its output)"
        )
    rewards = [float(r) for r in output["rewards"]]
    mode = (task.get("env") or {}).get("score", "return")
    score = (sum(rewards) if mode == "return" else rewards[-1] if mode == "last" else max(rewards)) if rewards else 0.0
    steps, turns = len(rewards), int(output.get("turns") or 0)
    ending = (
        "the environment ended the episode"
        if output.get("done")
        else f"the episode was cut off after {turns} replies (workflow.max_turns)"
    )
    notes = [f"{steps} step(s), return {sum(rewards):g}; {ending}"]
    if output.get("invalid"):
        notes.append(f"{output['invalid']} repl(ies) were not actions the environment took")
    last = str(output.get("final_observation") or "")
    feedback = "; ".join(notes) + (f"\nLast observation:\n{last[-1200:]}" if last else "")
    return Reward(
        score=score,
        components={"return": sum(rewards), "steps": float(steps), "invalid": float(output.get("invalid") or 0)},
        feedback=feedback,
    )


__all__ = ["reward"]
