"""Harbor episodes on a real Docker engine against the sandbox backend and a bare subprocess, in one
run (issue 50, item 7):

1. **Per episode**, for every task in examples/harbor_tasks: open the environment (docker: start a
   container from the task's image, built beforehand and timed apart; sandbox: build the workspace
   from the Dockerfile), run the solution's commands one by one in the episode's persistent shell,
   run tests/test.sh, tear down. The bare subprocess does the same work with no isolation
   (``bench/worlds/harbor_speed.py``'s ``bare_episode``). Medians of ``--repeats``; the docker column
   splits off the container start.
2. **In parallel**: ``--episodes`` episodes (the tasks cycled) with N at once (threads), for each N
   in ``--parallel``, on docker and on the sandbox: episodes per second.

The engine and its stand-in bases come from tests/helpers/docker_engine.py (an engine that answers,
or Debian's started here as root; ``python:3.11-slim`` is a local stand-in: see docs/worlds.md).
Harbor itself needs Python >= 3.12 and does not install here, so it is not in the table.

    python bench/worlds/harbor_engines.py [--repeats 3] [--episodes 24] [--parallel 1,2,4] [--out bench/worlds/harbor_engines.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench" / "worlds"))
for k, v in {"HF_HUB_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True", "ANONYMIZED_TELEMETRY": "False"}.items():
    os.environ.setdefault(k, v)

from harbor_speed import bare_episode  # noqa: E402

from evolve.worlds.harbor import find_tasks, load_task, solution_commands  # noqa: E402
from evolve.worlds.harbor.environment.docker import DockerEnvironment  # noqa: E402
from evolve.worlds.harbor.environment.sandbox import SandboxEnvironment  # noqa: E402

TASKS = ROOT / "examples" / "harbor_tasks"


def episode(task: dict, backend: str, client=None) -> dict:
    t0 = time.perf_counter()
    env = DockerEnvironment(task, client) if backend == "docker" else SandboxEnvironment(task)
    opened = time.perf_counter()
    try:
        for c in solution_commands(task):
            env.run(c, timeout=60)
        score = env.verify()["score"]
    finally:
        env.close()
    return {"open_s": opened - t0, "total_s": time.perf_counter() - t0, "score": score}


def per_episode(tasks: list[dict], repeats: int, client) -> dict:
    rows = []
    for t in tasks:
        t0 = time.perf_counter()
        DockerEnvironment(t, client).close()  # the image: built once per task content, timed apart
        build = time.perf_counter() - t0
        d = [episode(t, "docker", client) for _ in range(repeats)]
        s = [episode(t, "sandbox") for _ in range(repeats)]
        b = [bare_episode(t) for _ in range(repeats)]
        rows.append(
            {
                "task": t["id"],
                "commands": len(solution_commands(t)),
                "first_build_s": round(build, 3),
                "docker_start_s": round(statistics.median(x["open_s"] for x in d), 4),
                "docker_s": round(statistics.median(x["total_s"] for x in d), 4),
                "sandbox_s": round(statistics.median(x["total_s"] for x in s), 4),
                "bare_s": round(statistics.median(x[0] for x in b), 4),
                "scores": [d[0]["score"], s[0]["score"], b[0][1]],
            }
        )
        print(f"  {rows[-1]}", flush=True)
    tot = {k: round(sum(r[k] for r in rows), 3) for k in ("docker_start_s", "docker_s", "sandbox_s", "bare_s")}
    n = len(rows)
    return {
        "tasks": rows,
        "totals": tot,
        "per_episode_ms": {k: round(1000 * v / n, 1) for k, v in tot.items()},
        "overhead_over_bare_ms": {
            b: round(1000 * (tot[f"{b}_s"] - tot["bare_s"]) / n, 1) for b in ("docker", "sandbox")
        },
        "all_solved": all(r["scores"] == [1.0, 1.0, 1.0] for r in rows),
    }


def parallel(tasks: list[dict], episodes: int, ns: list[int], client) -> list[dict]:
    rows = []
    for backend in ("docker", "sandbox"):
        for n in ns:
            jobs = [tasks[i % len(tasks)] for i in range(episodes)]
            t0 = time.perf_counter()
            with ThreadPoolExecutor(max_workers=n) as ex:
                got = list(ex.map(lambda t, backend=backend: episode(t, backend, client), jobs))
            dt = time.perf_counter() - t0
            rows.append(
                {
                    "backend": backend,
                    "parallel": n,
                    "episodes": episodes,
                    "seconds": round(dt, 2),
                    "episodes_per_s": round(episodes / dt, 2),
                    "solved": sum(g["score"] == 1.0 for g in got),
                }
            )
            print(f"  {rows[-1]}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--episodes", type=int, default=24)
    ap.add_argument("--parallel", default="1,2,4")
    ap.add_argument("--out", default=str(ROOT / "bench" / "worlds" / "harbor_engines.json"))
    a = ap.parse_args()
    from tests.helpers import docker_engine as de

    engine, why = de.bring_up()
    if engine is None:
        sys.exit(f"harbor_engines: no Docker engine: {why}")
    try:
        tasks = [{**load_task(f), "images": engine.images} for f in find_tasks([str(TASKS)])]
        print(f"per episode, {len(tasks)} tasks x {a.repeats}", flush=True)
        out = {
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
            "date": date.today().isoformat(),
            "engine": engine.client.version().get("Version"),
            "load_before": os.getloadavg()[0],
            "per_episode": per_episode(tasks, a.repeats, engine.client),
        }
        print("in parallel", flush=True)
        out["parallel"] = parallel(tasks, a.episodes, [int(x) for x in a.parallel.split(",")], engine.client)
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")
        print(json.dumps({k: out["per_episode"][k] for k in ("per_episode_ms", "overhead_over_bare_ms", "all_solved")}))
    finally:
        de.tear_down(engine)


if __name__ == "__main__":
    main()
