"""Is a Harbor task sound? Its tests must fail on the untouched environment and pass after its own
solution: a task whose solution does not pass (or whose tests pass with nothing done) is *broken*,
reported and left out, never scored. The verdict is cached per task content and backend
(``$EVOLVE_CACHE_DIR/harbor/checks``), so a folder of tasks is checked once.

    evolve harbor check examples/harbor_tasks        # the CLI over this module
"""

from __future__ import annotations

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


def _episode(task: dict, backend: str, *, solve: bool) -> dict:
    from evolve.worlds.harbor.environment import open_environment

    env = open_environment(task, backend)
    try:
        solved = None
        if solve:
            r = env.solve()
            solved = {"exit_code": r.exit_code, "timed_out": r.timed_out,
                      "output": ((r.stdout or "") + (r.stderr or ""))[-1500:]}
        verdict = env.verify()
        verdict["solve"] = solved
        return verdict
    finally:
        env.close()


def check_task(task: dict, backend: str = "auto", *, cache: bool = True) -> dict[str, Any]:
    """``{"id", "status": "ok" | "broken" | "unsupported" | "unverified", "why", "untouched",
    "solved", "seconds", "backend"}``. ``unverified``: the task has no ``solution/solve.sh`` (kept,
    but nothing shows it can be solved). An environment that cannot even be built is ``broken``
    too, with its error, or ``unsupported`` when this backend cannot carry it out (the reason
    names the backend that can)."""
    from evolve.worlds.harbor.environment import docker_client

    resolved = backend if backend != "auto" else ("docker" if os.environ.get("EVOLVE_HARBOR_BACKEND") != "sandbox"
                                                  and docker_client(timeout=2) else "sandbox")
    key = cache_root() / "checks" / f"{task['id']}-{task['digest']}-{resolved}.json"
    if cache and key.is_file():
        try:
            return json.loads(key.read_text())
        except (OSError, json.JSONDecodeError):
            pass
    t0 = time.monotonic()
    out: dict[str, Any] = {"id": task["id"], "backend": resolved, "untouched": None, "solved": None}
    try:
        out["untouched"] = _episode(task, resolved, solve=False)
        if out["untouched"]["score"] >= 1.0:
            out.update(status="broken", why="tests/test.sh passes on the untouched environment (reward "
                       f"{out['untouched']['score']:g}): it does not test the instruction")
        elif not task.get("has_solution"):
            out.update(status="unverified", why="no solution/solve.sh, so nothing shows the task can be solved")
        else:
            out["solved"] = _episode(task, resolved, solve=True)
            s = out["solved"]
            if s["score"] >= 1.0:
                out.update(status="ok", why="")
            else:
                out.update(status="broken", why=f"its own solution/solve.sh does not pass tests/test.sh (reward "
                           f"{s['score']:g}, solve.sh exit {s['solve']['exit_code']}): "
                           f"{(s['output'] or '')[-300:]!r}")
    except InfraError as e:  # not cached: the next check tries the environment again
        out.update(status=getattr(e, "status", "broken"), why=getattr(e, "reason", str(e)))
        cache = False
    out["seconds"] = round(time.monotonic() - t0, 2)
    if cache:
        key.parent.mkdir(parents=True, exist_ok=True)
        tmp = key.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(out, indent=1))
        os.replace(tmp, key)
    return out


__all__ = ["cache_root", "check_task"]
