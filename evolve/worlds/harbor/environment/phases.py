"""What runs in a task's environment besides the agent's commands, as Harbor runs it, on either
backend (each gives ``sh``, ``reset``, ``upload``, ``executable`` and ``fetch``; see
:mod:`.base`):

* **the verifier** (Harbor's ``verifier/verifier.py``): the stale reward files go, the tests are
  copied to ``/tests`` (a step's ``steps/<name>/tests/`` over ``tests/``), ``test.sh`` is made
  executable as root and run by its own shebang as the verifier's user, from the working
  directory, with ``[verifier] env`` (``${VAR}`` from the host), its output kept in
  ``/logs/verifier/test-stdout.txt``; then the reward file is read back (:mod:`.outcome`);
* **the oracle** (``agents/oracle.py``): ``solution/`` (or the step's) copied to ``/solution``,
  ``solve.sh`` run the same way as the agent's user, with ``[solution] env`` and
  ``DEBIAN_FRONTEND=noninteractive``, under the agent's timeout, its output in
  ``/logs/agent/oracle.txt``;
* **a step's start** (``trial/multi_step.py``): after a step's verifier ran, ``/logs/verifier``
  and ``/tests`` are emptied; ``steps/<name>/workdir/`` is copied into the working directory and
  its ``setup.sh`` run there as the agent's user; then the step's healthcheck
  (``environments/base.py``'s ``run_healthcheck``, Docker's HEALTHCHECK rules): its command is run
  as the agent's user until it exits 0; a failure within ``start_period_sec`` does not count (the
  next try after ``start_interval_sec``), after it ``retries`` consecutive failures fail the step
  (the next try after ``interval_sec``). A setup.sh or healthcheck that fails is the step failing
  before its agent (Harbor's step ``exception_info``): :func:`start_step` returns why. One try past
  its ``timeout_sec`` is the world failing, as in Harbor, whose ``exec`` raises then.
"""

from __future__ import annotations

import time
from typing import Any

from evolve.worlds.harbor.environment.hostenv import resolve
from evolve.worlds.harbor.environment.outcome import TEXT_LIMIT, EnvironmentError_, tail, verdict

OUTPUT_TAIL = 64 * 1024  # bytes of a script's output read back


def single(task: dict) -> dict:
    """A single-step task as its one step (the shape of :func:`evolve.worlds.harbor.task.load_task`'s ``steps``)."""
    return {
        "name": None,
        "instruction": task["instruction"],
        "agent_timeout": task.get("agent_timeout"),
        "verifier_timeout": task["verifier_timeout"],
        "agent_user": task.get("agent_user"),
        "verifier_user": task.get("verifier_user"),
        "verifier_env": {},
        "min_reward": None,
        "test_dirs": ["tests"],
        "test": "tests/test.sh",
        "solution": "solution" if task.get("has_solution") else None,
        "workdir": None,
        "healthcheck": None,
    }


def steps_of(task: dict) -> list[dict]:
    """The task's steps, a single-step task's one included; each step's users and agent timeout
    fall back to the task's, as Harbor's do."""
    if not task.get("steps"):
        return [single(task)]
    return [
        {
            **s,
            "agent_timeout": s["agent_timeout"] if s["agent_timeout"] is not None else task.get("agent_timeout"),
            "agent_user": s["agent_user"] or task.get("agent_user"),
            "verifier_user": s["verifier_user"] or task.get("verifier_user"),
        }
        for s in task["steps"]
    ]


def _script_output(env: Any, inside: str) -> str:
    try:
        data = env.fetch(inside, tail_bytes=OUTPUT_TAIL)
    except EnvironmentError_:
        return ""
    return (data or b"").decode("utf-8", "replace")


def verify(env: Any, step: dict | None = None) -> dict:
    """The verdict of the tests of ``step`` (None: the single-step task's) in ``env``."""
    task = env.task
    step = step or single(task)
    t0 = time.monotonic()
    merged = {**task.get("verifier_env", {}), **(step.get("verifier_env") or {})}
    variables = resolve(task, merged)
    env.reset(
        ["/tests", "/logs/verifier/reward.txt", "/logs/verifier/reward.json"]
        + (["/logs/verifier"] if step["name"] is not None else [])
    )
    for i, folder in enumerate(step["test_dirs"]):
        env.upload(folder, "/tests", replace=i == 0, kind="AddTestsDirError")
    env.executable("/tests/test.sh")
    r = env.sh(
        "(/tests/test.sh) > /logs/verifier/test-stdout.txt 2>&1",
        timeout=step["verifier_timeout"],
        env=variables,
        user=step.get("verifier_user"),
    )
    output = _script_output(env, "/logs/verifier/test-stdout.txt") if not r.timed_out else ""
    reward_json = env.fetch("/logs/verifier/reward.json", limit=TEXT_LIMIT)
    reward_txt = env.fetch("/logs/verifier/reward.txt", limit=TEXT_LIMIT)
    out = verdict(
        task,
        r,
        reward_json,
        reward_txt,
        time.monotonic() - t0,
        output=output + r.stdout + r.stderr,
        timeout=step["verifier_timeout"],
    )
    if step["name"] is not None:
        out["step"] = step["name"]
    return out


def solve(env: Any, step: dict | None = None) -> Any:
    """Run the task's (or the step's) ``solve.sh`` as Harbor's oracle does; its result, with the
    script's output as ``stdout``."""
    task = env.task
    step = step or single(task)
    if not step.get("solution"):
        raise EnvironmentError_(
            task,
            f"no solution/solve.sh{' for step ' + repr(step['name']) if step['name'] else ''}: "
            "the oracle has nothing to run",
            kind="FileNotFoundError",
        )
    variables = {**resolve(task, task.get("solution_env")), "DEBIAN_FRONTEND": "noninteractive"}
    env.reset(["/solution"])
    env.upload(step["solution"], "/solution")
    env.executable("/solution/solve.sh")
    r = env.sh(
        "(/solution/solve.sh) > /logs/agent/oracle.txt 2>&1",
        timeout=step.get("agent_timeout"),
        env=variables,
        user=step.get("agent_user"),
    )
    return _Solved(r, _script_output(env, "/logs/agent/oracle.txt") + r.stdout + r.stderr)


class _Solved:
    """solve.sh's result, its output as stdout."""

    def __init__(self, r: Any, output: str) -> None:
        self.exit_code, self.timed_out, self.duration_s = r.exit_code, r.timed_out, r.duration_s
        self.stdout, self.stderr = output, ""


def start_step(env: Any, step: dict, first: bool) -> dict | None:
    """Before a step's agent: clear what the previous step's verifier left, copy the step's
    ``workdir/`` in, run its ``setup.sh``, then its healthcheck. None when the step may start;
    else ``{"step", "failed": "setup" | "healthcheck", "kind", "reason"}``: the step failed before
    its agent (Harbor records it on the step and runs neither its agent nor its verifier)."""
    if not first:
        env.reset(["/tests", "/logs/verifier", "/solution"])
    if step.get("workdir"):
        env.upload(step["workdir"], env.workdir, replace=False)
        from evolve.sandbox.beneath import kind

        if kind(env.task["path"], f"{step['workdir']}/setup.sh") == "file":
            script = env.workdir.rstrip("/") + "/setup.sh"
            r = env.sh(f"bash {script}", timeout=600.0, user=step.get("agent_user"))
            if r.timed_out or r.exit_code != 0:
                return {
                    "step": step["name"],
                    "failed": "setup",
                    "kind": "RuntimeError",
                    "reason": f"{step['workdir']}/setup.sh {'timed out' if r.timed_out else f'exited {r.exit_code}'}"
                    f": {tail((r.stderr or r.stdout).strip(), 600)!r}",
                }
    if step.get("healthcheck"):
        why = healthcheck(env, step)
        if why:
            return {"step": step["name"], "failed": "healthcheck", "kind": "HealthcheckError", "reason": why}
    return None


def healthcheck(env: Any, step: dict, *, sleep: Any = time.sleep, clock: Any = time.monotonic) -> str | None:
    """Run ``step``'s healthcheck as Harbor's ``run_healthcheck`` does: None once its command
    exits 0, else why it failed (``retries`` consecutive failures after the start period). One try
    past its ``timeout_sec`` raises :class:`EnvironmentError_` (Harbor's ``exec`` raises there)."""
    hc = step["healthcheck"]
    start_period_end = clock() + hc["start_period_sec"]
    failures = 0
    while True:
        in_start_period = clock() < start_period_end
        r = env.sh(hc["command"], timeout=hc["timeout_sec"], user=step.get("agent_user"))
        if r.timed_out:
            raise EnvironmentError_(
                env.task,
                f"step {step['name']!r}: its healthcheck {hc['command']!r} did not finish "
                f"within its timeout_sec ({hc['timeout_sec']:g} s)",
                kind="RuntimeError",
            )
        if r.exit_code == 0:
            return None
        if in_start_period:
            sleep(hc["start_interval_sec"])
            continue
        failures += 1
        if failures >= hc["retries"]:
            out = tail(((r.stdout or "") + (r.stderr or "")).strip(), 600)
            return (
                f"its healthcheck failed after {hc['retries']} consecutive retries: {hc['command']}"
                f" (exit {r.exit_code}{', output: ' + repr(out) if out else ''})"
            )
        sleep(hc["interval_sec"])


def below(rewards: dict[str, float], minimum: dict[str, float] | None) -> str | None:
    """Why a step's rewards fall short of its ``min_reward`` (Harbor stops the remaining steps), or
    None; a key the rewards lack counts as below."""
    for key, threshold in (minimum or {}).items():
        got = rewards.get(key, float("-inf"))
        if got < threshold:
            return f"{key} = {got:g} is below its min_reward {threshold:g}"
    return None


__all__ = ["below", "healthcheck", "single", "solve", "start_step", "steps_of", "verify"]
