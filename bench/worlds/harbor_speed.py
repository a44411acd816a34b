"""The harbor world's costs, in one run: per-episode overhead of the sandboxed shell against the
same commands in a bare subprocess, and Harbor episodes per second through the thread and Ray
runners.

1. **Sandbox overhead.** For every task in examples/harbor_tasks: an episode on the sandbox
   backend (build the environment from its Dockerfile, run the solution's commands one by one,
   run tests/test.sh, tear down) against the same work in bare ``bash -c`` subprocesses on a copy
   of the files with ``/app``, ``/logs`` and ``/tests`` rewritten to a temporary folder (no
   isolation at all). The median of ``--repeats`` per task; the ratio of the totals.
2. **Runners.** ``--episodes`` episodes (the tasks cycled) through the thread runner and the Ray
   runner (a local one-node cluster on loopback), ``--workers`` each, the policy an
   OpenAI-compatible server on loopback that answers each task with its solution's commands
   (so every episode runs commands and its tests), through litellm.

    python bench/worlds/harbor_speed.py [--repeats 5] [--episodes 48] [--workers 2] [--out bench/worlds/harbor_speed.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("EVOLVE_HARBOR_BACKEND", "sandbox")
for k, v in {
    "HF_HUB_OFFLINE": "1",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "ANONYMIZED_TELEMETRY": "False",
    "RAY_USAGE_STATS_ENABLED": "0",
    "OPENAI_API_KEY": "sk-unused",
    "NO_PROXY": "127.0.0.1,localhost",
}.items():
    os.environ.setdefault(k, v)

from evolve.worlds.harbor import find_tasks, load_task, solution_commands  # noqa: E402
from evolve.worlds.harbor.environment import SandboxEnvironment, parse_reward  # noqa: E402

TASKS = ROOT / "examples" / "harbor_tasks"


def sandbox_episode(task: dict) -> tuple[float, float]:
    t0 = time.perf_counter()
    env = SandboxEnvironment(task)
    try:
        for c in solution_commands(task):
            env.exec(c, timeout=60)
        score = env.verify()["score"]
    finally:
        env.close()
    return time.perf_counter() - t0, score


def _rewrite_tree(folder: Path, root: Path) -> None:
    for p in folder.rglob("*"):
        if p.is_file():
            try:
                text = p.read_text()
            except UnicodeDecodeError:
                continue
            p.write_text(_rewrite(text, root))


def _rewrite(text: str, root: Path) -> str:
    return re.sub(r"(?<![\w.])/(app|logs|tests)\b", lambda m: f"{root}/{m.group(1)}", text)


def bare_episode(task: dict) -> tuple[float, float]:
    """The same work with no isolation: the Dockerfile's COPY/RUN, the commands and the tests in
    bare subprocesses over a temporary folder standing in for /app, /logs and /tests."""
    from evolve.worlds.harbor.environment.dockerfile import parse

    t0 = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="harbor-bare-"))
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(root),
        "LANG": "C.UTF-8",
        "TERM": "dumb",
    }  # the sandbox's (a virtualenv's python on PATH starts slower)
    try:
        plan = parse((Path(task["path"]) / "environment" / "Dockerfile").read_text())
        (root / "app").mkdir()
        (root / "logs" / "verifier").mkdir(parents=True)
        ctx = Path(task["path"]) / "environment"
        for step in plan.steps:
            if step.kind == "copy":
                for src in step.sources:
                    s = ctx / src
                    dest = Path(_rewrite(step.dest, root))
                    if s.is_dir():
                        shutil.copytree(s, dest, dirs_exist_ok=True)
                    else:
                        dest = dest / s.name if step.dest.endswith("/") or dest.is_dir() else dest
                        dest.parent.mkdir(parents=True, exist_ok=True)
                        shutil.copy2(s, dest)
            else:
                subprocess.run(
                    ["bash", "-c", _rewrite(step.command, root)],
                    cwd=_rewrite(step.workdir, root),
                    capture_output=True,
                    timeout=60,
                    env=env,
                )
        _rewrite_tree(root / "app", root)
        for c in solution_commands(task):
            subprocess.run(
                ["bash", "-c", _rewrite(c, root)], cwd=root / "app", capture_output=True, timeout=60, env=env
            )
        shutil.copytree(Path(task["path"]) / "tests", root / "tests")
        _rewrite_tree(root / "tests", root)
        subprocess.run(
            ["bash", str(root / "tests" / "test.sh")], cwd=root / "app", capture_output=True, timeout=60, env=env
        )
        rj, rt = root / "logs/verifier/reward.json", root / "logs/verifier/reward.txt"
        score = parse_reward(task, rj.read_bytes() if rj.exists() else None, rt.read_bytes() if rt.exists() else None)[
            0
        ]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return time.perf_counter() - t0, score


def overhead(tasks: list[dict], repeats: int) -> dict:
    rows = []
    for t in tasks:
        sb = [sandbox_episode(t) for _ in range(repeats)]
        bare = [bare_episode(t) for _ in range(repeats)]
        rows.append(
            {
                "task": t["id"],
                "commands": len(solution_commands(t)),
                "sandbox_s": round(statistics.median(x[0] for x in sb), 4),
                "bare_s": round(statistics.median(x[0] for x in bare), 4),
                "sandbox_score": sb[0][1],
                "bare_score": bare[0][1],
            }
        )
        print(f"  {rows[-1]}", flush=True)
    tot_sb, tot_bare = sum(r["sandbox_s"] for r in rows), sum(r["bare_s"] for r in rows)
    return {
        "tasks": rows,
        "sandbox_total_s": round(tot_sb, 3),
        "bare_total_s": round(tot_bare, 3),
        "ratio": round(tot_sb / tot_bare, 2),
        "per_episode_overhead_ms": round(1000 * (tot_sb - tot_bare) / len(rows), 1),
        "same_scores": sum(r["sandbox_score"] == r["bare_score"] for r in rows),
    }


def solver(tasks: list[dict]):
    by_instruction = {t["instruction"]: solution_commands(t) for t in tasks}

    def respond(messages: list[dict]) -> str:
        user = [m["content"] for m in messages if m["role"] == "user"]
        cmds = by_instruction.get(user[0].split("Your task:\n")[-1].strip(), [])
        done = sum(1 for m in messages if m["role"] == "assistant")
        return f"```bash\n{cmds[done]}\n```" if done < len(cmds) else "DONE"

    return respond


def runners(tasks: list[dict], episodes: int, workers: int) -> dict:
    from evolve.runners import RolloutJob, ThreadRunner, WorkerSpec
    from evolve.runners.ray_runner import RayRunner
    from evolve.types import ModelSpec, System
    from tests.helpers.servers import FakeOpenAI

    srv = FakeOpenAI(respond=solver(tasks))
    system = System(
        models={
            "policy": ModelSpec(
                backend="litellm",
                name="openai/solver",
                params={"api_base": srv.base, "max_retries": 0, "timeout": 30, "temperature": 0.0, "max_tokens": 512},
            )
        },
        prompts={},
        workflow={"max_turns": 8},
    )
    for t in tasks:
        t["backend"] = "sandbox"
    spec = WorkerSpec(
        agent="evolve.worlds.harbor:agent",
        reward="evolve.worlds.harbor:reward",
        artifacts_root=tempfile.mkdtemp(),
        search_path=str(ROOT),
    )
    out = {}
    try:
        for name in ("thread", "ray"):
            runner = ThreadRunner(workers=workers) if name == "thread" else RayRunner(workers=workers, num_cpus=0.5)
            with runner as r:
                list(
                    r.run(
                        spec,
                        [
                            RolloutJob(key=f"w{i}", system=system, task=tasks[i % len(tasks)], timeout=300)
                            for i in range(workers)
                        ],
                    )
                )  # warm-up: every worker up
                jobs = [
                    RolloutJob(key=f"e{i}", system=system, task=tasks[i % len(tasks)], seed=i, timeout=300)
                    for i in range(episodes)
                ]
                t0 = time.perf_counter()
                got = [t for _, t in r.run(spec, jobs)]
                wall = time.perf_counter() - t0
            out[name] = {
                "workers": workers,
                "episodes": len(got),
                "wall_s": round(wall, 2),
                "episodes_per_s": round(len(got) / wall, 2),
                "solved": sum(t.score == 1.0 for t in got),
                "infra": sum(t.infra is not None for t in got),
                "errors": sum(t.error is not None for t in got),
            }
            print(f"  {name}: {out[name]}", flush=True)
    finally:
        srv.close()
        try:
            import ray

            ray.shutdown()
        except Exception:  # noqa: BLE001
            pass
    out["ray_over_thread"] = round(out["ray"]["episodes_per_s"] / out["thread"]["episodes_per_s"], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--episodes", type=int, default=48)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    tasks = [load_task(p) for p in find_tasks(TASKS)]
    res = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "date": time.strftime("%Y-%m-%d"),
    }
    print("sandbox overhead per episode:", flush=True)
    res["overhead"] = overhead(tasks, args.repeats)
    print(
        f"  ratio {res['overhead']['ratio']}x, +{res['overhead']['per_episode_overhead_ms']} ms per episode", flush=True
    )
    print("runners:", flush=True)
    res["runners"] = runners(tasks, args.episodes, args.workers)
    text = json.dumps(res, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
