"""The reward: what the task's own tests said (the agent ran them in its environment after it
stopped, see :mod:`.agent`). The tests' output is the feedback the reflective operators read."""

from __future__ import annotations

from typing import Any

from evolve.types import Reward


def reward(task: dict, output: Any, trajectory: Any = None) -> Reward:
    """``tests/test.sh``'s verdict: the reward file's value (or 1.0 for exit 0), components
    from ``reward.json``, feedback the tests' output."""
    v = output.get("verifier") if isinstance(output, dict) else None
    if not isinstance(v, dict) or "score" not in v:
        raise ValueError(f"Harbor task {task.get('id')}: the output has no verifier result; the harbor world's "
                         "agent runs the tests (agent: evolve.worlds.harbor:agent or a wrapper that returns its output)")
    notes = []
    if output.get("agent_timed_out"):
        notes.append(f"the agent ran out of its {task.get('agent_timeout', 0):g} s")
    if not output.get("commands"):
        notes.append("the agent ran no command")
    feedback = (f"tests/test.sh exit code {v.get('exit_code')} ({v.get('source')}): " + (v.get("output") or "(no output)")
                + ("\n" + "; ".join(notes) if notes else ""))
    comps = {k: float(x) for k, x in (v.get("components") or {}).items() if k != "reward"}
    return Reward(score=float(v["score"]), components=comps, feedback=feedback)


__all__ = ["reward"]
