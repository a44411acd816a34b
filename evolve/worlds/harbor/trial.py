"""One episode of a Harbor task as Harbor's trial runs it (``trial/single_step.py``,
``trial/multi_step.py``), whatever acts in it: the LLM agent, the oracle or nop.

Every step in turn, in one environment: the step's start (:func:`.environment.phases.start_step`: its
workdir, setup.sh and healthcheck), the agent phase, then the step's verifier. A step whose rewards
fall short of its ``min_reward`` stops the remaining ones (Harbor's early stop); so does a step
whose setup.sh or healthcheck fails: neither its agent nor its verifier runs, and it has no
rewards. A multi-step episode's verdict is its steps' by the task's ``multi_step_reward_strategy``
(:func:`.environment.outcome.aggregate`: a step without rewards is left out of the mean, and is a final
step's nothing, which Harbor's metrics count 0). Two differences from Harbor, on purpose: a step
whose verifier fails (no reward file, a timeout) fails the whole episode (the world failing, never
a score), where Harbor would average the other steps; and so does a first step that cannot start
(nothing an agent did could cause it), which Harbor would count 0.

The world agents a task file selects (``agent: oracle`` | ``nop``, as Harbor names them):
:func:`oracle` runs the task's ``solution/solve.sh`` (each step's, in a multi-step task) and
:func:`nop` does nothing; both then run the tests, so they show what the tests say of the task's
own solution and of the untouched environment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from evolve.worlds.harbor.environment import phases
from evolve.worlds.harbor.environment.outcome import EnvironmentError_, aggregate


def run_episode(task: dict, env: Any, act: Callable[[dict], None], verify: Callable | None = None) -> dict:
    """``act(step)`` for each step, then its tests (``verify(step)``, by default ``env.verify``);
    returns ``{"verifier": the verdict, "stopped": why the remaining steps did not run, or None}``."""
    multi = bool(task.get("steps"))
    verify = verify or env.verify
    results, stopped = [], None
    for i, step in enumerate(phases.steps_of(task)):
        if multi:
            failed = env.start_step(step, i == 0)
            if failed and i == 0:
                raise EnvironmentError_(
                    task,
                    f"step {step['name']!r}: {failed['reason']}; the first step cannot start, whatever an agent does",
                    kind=failed["kind"],
                )
            if failed:
                results.append(failed)
                stopped = (
                    f"step {step['name']!r}: its {failed['failed']} failed before its agent ({failed['reason']}); "
                    "it and the remaining steps did not run"
                )
                break
        act(step)
        v = verify(step if multi else None)
        results.append(v)
        why = phases.below(v["components"], step.get("min_reward"))
        if why:
            stopped = f"step {step['name']!r}: {why}; the remaining steps did not run"
            break
    verdict = aggregate(task, results) if multi else results[0]
    if stopped:
        verdict["stopped"] = stopped
    return {"verifier": verdict, "stopped": stopped}


def _world_agent(task: dict, ctx: Any, name: str, solve: bool) -> dict:
    from evolve.worlds.harbor.environment import open_environment

    env = open_environment(task, task.get("backend", "auto"))
    ran: list[dict] = []

    def act(step: dict) -> None:
        if not solve:
            return
        r = ctx.tool(
            "harbor.solve",
            lambda task_id, step: _solved(env.solve(step_of(task, step))),
            task_id=task["id"],
            step=step["name"],
        )
        ran.append(r)

    def verify(step: dict | None) -> dict:
        return ctx.tool(
            "harbor.verify",
            lambda task_id, step: env.verify(step_of(task, step)),
            task_id=task["id"],
            step=None if step is None else step["name"],
        )

    try:
        out = run_episode(task, env, act, verify)
    finally:
        env.close()
    return {
        "agent": name,
        "commands": [],
        "turns": 0,
        "done": True,
        "agent_timed_out": any(r["timed_out"] for r in ran),
        "solve": ran,
        "verifier": out["verifier"],
        "backend": env.backend,
    }


def step_of(task: dict, name: str | dict | None) -> dict | None:
    """The step named ``name`` of ``task`` (None for a single-step task)."""
    if name is None or isinstance(name, dict):
        return name
    return next(s for s in phases.steps_of(task) if s["name"] == name)


def _solved(r: Any) -> dict:
    out = (r.stdout or "") + (r.stderr or "")
    return {
        "exit_code": r.exit_code,
        "timed_out": r.timed_out,
        "seconds": round(r.duration_s, 3),
        "output": out[-1500:],
    }


def oracle(task: dict, ctx: Any) -> dict:
    """Harbor's oracle agent: the task's own ``solution/solve.sh`` (each step's), then the tests."""
    return _world_agent(task, ctx, "oracle", solve=True)


def nop(task: dict, ctx: Any) -> dict:
    """Harbor's nop agent: nothing, then the tests (what they say of the untouched environment)."""
    return _world_agent(task, ctx, "nop", solve=False)


__all__ = ["nop", "oracle", "run_episode", "step_of"]
