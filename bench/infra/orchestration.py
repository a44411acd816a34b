"""Orchestration overhead with the scripted LM: rollouts per second through the whole engine path
(runner -> agent -> scripted LM -> reward -> archive), and the archive at 10,000 systems.

    .venv/bin/python bench/infra/orchestration.py [--rollouts 20000] [--systems 10000]

Prints one JSON object; results go to bench/infra/RESULTS.md by hand with the machine and date.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from pathlib import Path

from evolve.archive import Archive
from evolve.scoring.session import Session
from evolve.task.taskfile import validate_task
from evolve.types import ModelSpec, System


def engine_rollouts(n: int, workers: int) -> dict:
    """Single-step rollouts through Session.rollouts: scheduling, agent, LM, reward, archive writes."""
    task = validate_task(
        {
            "name": "bench",
            "agent": "evolve.worlds.toy:agent",
            "reward": "evolve.worlds.toy:reward",
            "models": {"policy": {"backend": "scripted", "name": "s", "params": {"reply": "evolve.worlds.toy:reply"}}},
            "dataset": {"source": "evolve.worlds.toy:dataset", "params": {"n_train": n, "n_val": 1, "n_test": 1}},
            "runner": {"name": "thread", "workers": workers, "timeout": 60},
        }
    )
    with tempfile.TemporaryDirectory() as d:
        eng = Session(task, base_dir=Path.cwd(), run_dir=Path(d) / "run")
        system = System(
            models={"policy": ModelSpec(backend="scripted", name="s", params={"reply": "evolve.worlds.toy:reply"})},
            prompts={"instruction": "add"},
        )
        eng.rollouts(system, eng.tasks("train")[:200], split="train", tag="warmup")  # build the LM once
        tasks = eng.tasks("train")
        t0 = time.perf_counter()
        trajs = eng.rollouts(system, tasks, split="train", tag="eval:train")
        dt = time.perf_counter() - t0
        t1 = time.perf_counter()
        again = eng.rollouts(system, tasks, split="train", tag="eval:train")  # all memoised: resume path
        dt_memo = time.perf_counter() - t1
        assert len(trajs) == len(again) == n
        eng.close()
        size = sum(f.stat().st_size for f in (Path(d) / "run").rglob("*") if f.is_file())
    return {
        "rollouts": n,
        "workers": workers,
        "seconds": round(dt, 3),
        "rollouts_per_s": round(n / dt),
        "memoised_per_s": round(n / dt_memo),
        "run_dir_bytes": size,
    }


def archive_systems(n: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        a = Archive(Path(d))
        base = System(models={"policy": ModelSpec(backend="scripted", name="s")}, prompts={"instruction": "v0"})
        t0 = time.perf_counter()
        a.add_system(base)
        parent = base.id
        for i in range(1, n):
            s = base.replace(prompts={"instruction": f"variant {i} " + "x" * 200})
            a.add_system(s, parents=(parent,), operator="bench", generation=i // 100)
            if i % 7 == 0:
                parent = s.id
        add_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        recs = a.records()
        list_s = time.perf_counter() - t1
        t2 = time.perf_counter()
        for r in recs[:: max(1, n // 1000)]:
            a.get_system(r.id[:10])
        get_ms = (time.perf_counter() - t2) / len(recs[:: max(1, n // 1000)]) * 1e3
        t3 = time.perf_counter()
        lin = a.lineage(recs[-1].id)
        lineage_ms = (time.perf_counter() - t3) * 1e3
        a.close()
        size = (Path(d) / "archive.sqlite").stat().st_size
    return {
        "systems": n,
        "add_seconds": round(add_s, 2),
        "records_seconds": round(list_s, 3),
        "get_by_prefix_ms": round(get_ms, 3),
        "lineage_ms": round(lineage_ms, 3),
        "lineage_depth": len(lin),
        "archive_bytes": size,
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rollouts", type=int, default=20000)
    ap.add_argument("--systems", type=int, default=10000)
    ap.add_argument("--workers", type=int, default=8)
    args = ap.parse_args()
    out = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, Python {platform.python_version()}",
        "engine": engine_rollouts(args.rollouts, args.workers),
        "archive": archive_systems(args.systems),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
