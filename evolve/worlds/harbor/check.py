"""Is a Harbor task sound? Its tests must fail on the untouched environment and pass after its own
solution: a task whose solution does not pass (or whose tests pass with nothing done) is *broken*,
reported and left out, never scored. Each is a trial of one of Harbor's own agents (``nop``, then
``oracle``: :mod:`.trial`), reported as Harbor's trial result would say it: the reward, every
component, and the exception type and message when the trial failed (``RewardFileNotFoundError``
for a verifier that wrote no reward, ``VerifierTimeoutError``, ``AgentTimeoutError`` for a solution
past the agent's timeout, ...). When its verifier ran without the network Harbor's default
(``network_mode`` public) would give it, a failing task's reason says so: it may need the network.
The verdict is cached per task content and backend (``$EVOLVE_CACHE_DIR/harbor/checks``), so a
folder of tasks is checked once.

    evolve harbor check examples/harbor_tasks        # the CLI over this module
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from evolve.errors import InfraError


def cache_root() -> Path:
    """``$EVOLVE_CACHE_DIR/harbor`` when set, else ``~/.cache/evolvekit/harbor``."""
    from evolve.artifacts import cache_dir

    return cache_dir("harbor")


OFFLINE = (
    " (its verifier ran without a network: the task leaves network_mode at Harbor's default, public, "
    "and this machine has no network for it; a task that needs the network cannot pass here)"
)


def _primary(rewards: dict | None) -> float | None:
    """Harbor's primary reward: the ``reward`` key, else the only one; None otherwise."""
    if not rewards:
        return None
    return rewards.get("reward", next(iter(rewards.values())) if len(rewards) == 1 else None)


CHECK_AGENT_CAP = 1800.0  # seconds solve.sh may take in a check when the task sets no [agent] timeout_sec


def _capped(task: dict) -> dict:
    """``task`` with an agent timeout wherever it has none (Harbor's default): a check must end, so
    that one task whose solve.sh hangs is reported, not the whole run held."""

    def cap(d: dict) -> dict:
        return {**d, "agent_timeout": CHECK_AGENT_CAP} if d.get("agent_timeout") is None else d

    out = cap(task)
    if task.get("steps"):
        out["steps"] = [cap(s) for s in task["steps"]]
    return out


def trial(task: dict, backend: str, *, solve: bool) -> dict[str, Any]:
    """One trial of Harbor's ``oracle`` (``solve``) or ``nop`` agent: ``{"agent", "reward",
    "rewards", "score", "exception_type", "exception_message", "status", "verdict", "solve"}``.
    A task with no agent timeout gets :data:`CHECK_AGENT_CAP` here."""
    from evolve.worlds.harbor.environment import open_environment
    from evolve.worlds.harbor.trial import run_episode

    task = _capped(task)

    out: dict[str, Any] = {
        "agent": "oracle" if solve else "nop",
        "reward": None,
        "rewards": None,
        "score": None,
        "exception_type": None,
        "exception_message": None,
        "status": None,
        "verdict": None,
        "solve": [],
        "offline": False,
    }
    env = None
    try:
        env = open_environment(task, backend)
        out["offline"] = "verifier" in getattr(env, "denied", [])

        def act(step: dict) -> None:
            if not solve:
                return
            r = env.solve(step if task.get("steps") else None)
            out["solve"].append(
                {
                    "step": step["name"],
                    "exit_code": r.exit_code,
                    "timed_out": r.timed_out,
                    "output": ((r.stdout or "") + (r.stderr or ""))[-1500:],
                }
            )
            if r.timed_out and out["exception_type"] is None:  # Harbor grades it still
                out.update(
                    exception_type="AgentTimeoutError",
                    exception_message="solve.sh did not finish within the agent's timeout_sec (or "
                    f"{CHECK_AGENT_CAP:g} s, a check's limit where the task sets none)",
                )

        v = run_episode(task, env, act)["verifier"]
        out.update(verdict=v, rewards=v["components"], reward=_primary(v["components"]), score=v["score"])
    except InfraError as e:
        out.update(
            exception_type=getattr(e, "kind", type(e).__name__),
            exception_message=getattr(e, "reason", str(e)),
            status=getattr(e, "status", "broken"),
        )
    finally:
        if env is not None:
            env.close()
    return out


def host_env(task: dict) -> dict[str, str]:
    """The host variables the task's ``${VAR}`` values read, each ``allowed`` or ``not allowed``."""
    allowed = set(task.get("allow_env") or ())
    return {v: "allowed" if v in allowed else "not allowed" for v in task.get("host_env") or ()}


def check_task(task: dict, backend: str = "auto", *, cache: bool = True) -> dict[str, Any]:
    """``{"id", "status": "ok" | "broken" | "unsupported" | "unverified", "why", "trials": {"nop",
    "oracle"} (:func:`trial`), "untouched", "solved" (their verdicts), "notes", "seconds",
    "backend", "host_env" (:func:`host_env`)}``. ``unverified``: the task has no ``solution/solve.sh`` (kept, but nothing shows it
    can be solved). An environment that cannot even be built is ``broken`` too, with its error, or
    ``unsupported`` when this backend cannot carry it out (the reason names what can)."""
    from evolve.worlds.harbor.environment import resolve_backend

    resolved = resolve_backend(backend)
    # another image map, build network, capability set or allowed variable: checked again
    setting = {
        k: task.get(k)
        for k in ("build_network", "capabilities", "allow_env")
        if task.get(k) not in (None, "auto", "reduced", [])
    }
    mapped = json.dumps({**({"images": task["images"]} if task.get("images") else {}), **setting}, sort_keys=True)
    if set(json.loads(mapped)) == {"images"}:  # the image map alone: the key it always had
        mapped = json.dumps(task["images"], sort_keys=True)
    salt = "" if mapped == "{}" else "-" + hashlib.sha256(mapped.encode()).hexdigest()[:8]
    key = cache_root() / "checks" / f"{task['id']}-{task['digest']}-{resolved}{salt}.json"
    if cache and key.is_file():
        try:
            return json.loads(key.read_text())
        except (OSError, json.JSONDecodeError):
            pass
    t0 = time.monotonic()
    out: dict[str, Any] = {
        "id": task["id"],
        "backend": resolved,
        "untouched": None,
        "solved": None,
        "trials": {},
        "notes": list(task.get("notes") or []),
        "host_env": host_env(task),
    }
    nop = out["trials"]["nop"] = trial(task, resolved, solve=False)
    out["untouched"] = nop["verdict"]
    if nop["exception_type"]:
        out.update(status=nop["status"] or "broken", why=f"{nop['exception_type']}: {nop['exception_message']}")
        if nop["offline"]:
            out["why"] += OFFLINE
    elif nop["score"] >= 1.0:
        out.update(
            status="broken",
            why=f"tests/test.sh passes on the untouched environment (reward {nop['score']:g}): "
            "it does not test the instruction",
        )
    elif not task.get("has_solution"):
        out.update(status="unverified", why="no solution/solve.sh, so nothing shows the task can be solved")
    else:
        orc = out["trials"]["oracle"] = trial(task, resolved, solve=True)
        out["solved"] = orc["verdict"]
        if out["solved"] is not None:
            out["solved"]["solve"] = orc["solve"][-1] if orc["solve"] else None
        last = orc["solve"][-1] if orc["solve"] else {}
        if orc["exception_type"] and orc["status"] is not None:
            out.update(status=orc["status"], why=f"{orc['exception_type']}: {orc['exception_message']}")
        elif orc["score"] >= 1.0:
            out.update(status="ok", why="")
        else:
            out.update(
                status="broken",
                why=f"its own solution/solve.sh does not pass tests/test.sh (reward "
                f"{orc['score']:g}, solve.sh exit {last.get('exit_code')}): {(last.get('output') or '')[-300:]!r}",
            )
        if out["status"] != "ok" and orc["offline"]:
            out["why"] += OFFLINE
    if any(t["status"] is not None for t in out["trials"].values()):
        cache = False  # the world failing: the next check tries the environment again
    out["seconds"] = round(time.monotonic() - t0, 2)
    if cache:
        key.parent.mkdir(parents=True, exist_ok=True)
        tmp = key.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(out, indent=1))
        os.replace(tmp, key)
    return out


__all__ = ["cache_root", "check_task", "host_env", "trial"]
