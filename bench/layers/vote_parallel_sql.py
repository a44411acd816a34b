"""The tiny local model on the SQL world: a 16-vote over write→execute with its samples one after
another (``parallel: 1``) and all at once (``parallel: 16``), for one rollout at a time
(latency) and for many rollouts at once (throughput).

    EVOLVE_CACHE_DIR=... .venv/bin/python bench/layers/vote_parallel_sql.py --workers 1 --tasks 10
    EVOLVE_CACHE_DIR=... .venv/bin/python bench/layers/vote_parallel_sql.py --workers 128 --tasks 150

Uses ``examples/sql_agent/task.yaml``'s cold start for ``--seed`` (trained on first use, then
cached) through ``evolve.topology:agent``, on the first ``--tasks`` test tasks, in a fresh run
folder under ``--out``. The local backend batches concurrent requests, so a parallel vote's
samples share one batch.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workers", type=int, default=1, help="rollouts at once (runner.workers)")
    ap.add_argument("--tasks", type=int, default=10)
    ap.add_argument("--out", default="/tmp/vote_parallel_sql")
    args = ap.parse_args()

    from evolve._env import quiet_defaults

    quiet_defaults()
    from evolve.scoring.session import Session
    from evolve.task.taskfile import load_task
    from evolve.worlds.sql.workflow import vote

    out = Path(args.out) / f"w{args.workers}"
    shutil.rmtree(out, ignore_errors=True)
    cfg, base = load_task(
        ROOT / "examples/sql_agent/task.yaml",
        [f"seed={args.seed}", "operators=[]", f"runner.workers={args.workers}", "runner.timeout=900"],
    )
    eng = Session(cfg, base_dir=base, run_dir=out, agent="evolve.topology:agent")
    start = eng.baseline()
    tasks = eng.tasks("test")[: args.tasks]
    with eng.outside_budget():  # scoring outside any budget
        for parallel in (1, 16):
            system = start.replace(workflow={**start.workflow, "graph": vote(16, 0.8, parallel)})
            t0 = time.perf_counter()
            trajs = eng.rollouts(system, tasks, split="test", tag="eval:test")
            dt = time.perf_counter() - t0
            print(
                f"workers {args.workers:3d}, {len(tasks)} tasks, parallel {parallel:2d}: {dt:.1f} s "
                f"({dt / len(tasks):.2f} s per task), accuracy {statistics.mean(t.score for t in trajs):.3f}, "
                f"errors {sum(1 for t in trajs if t.error)}",
                flush=True,
            )
    eng.close()


if __name__ == "__main__":
    main()
