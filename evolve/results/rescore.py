"""Score systems from finished runs on a larger test split, paired against the first one.

    .venv/bin/python -m evolve.results.rescore --task examples/sql_agent/task.yaml --seed 0 --n-test 2000 \\
        --out runs/rescore/seed0 sft=runs/s0:baseline star=runs/s0:best grpo=runs/g0:best

A run's report scores its systems on the task file's test split. On 300 tasks (the SQL task
files until 2026-12-01; the layer scripts still) a paired 95% interval is about ±3.5–4 points, so
two operators that differ by 2–3 points cannot be told apart there. This command builds the same
task's dataset with ``--n-test`` test tasks (the SQL world draws each split from its own random
stream, so train and val stay the same and every extra test task is new), evaluates each
``LABEL=RUN_DIR[:SYSTEM]`` on it greedily, and prints each system's accuracy with its paired
difference to the first one. ``SYSTEM`` is an id
prefix, ``best``, ``baseline`` (the default) or ``op:NAME`` (the newest child an operator
proposed, accepted or not). Rollouts are memoised in ``--out``, so a rerun or an added system only
scores what is new. ``--set`` applies to the task file as in ``evolve run``; pass the runs' own.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _system(run: Path, which: str):
    """``(system, archive)``: the system ``which`` names in the run directory ``run``."""
    from evolve.archive import Archive

    archive = Archive(run, create=False)
    if which.startswith("op:"):
        kids = [r for r in archive.records() if r.operator == which[3:]]
        if not kids:
            sys.exit(f"{run}: no system was proposed by operator {which[3:]!r}")
        return archive.get_system(kids[-1].id), archive
    return archive.get_system(archive.resolve(which)), archive


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--n-test", type=int, default=2000)
    ap.add_argument("--out", required=True, help="a run directory for this scoring (memoised)")
    ap.add_argument("--set", action="append", default=[], dest="overrides")
    ap.add_argument("systems", nargs="+", help="LABEL=RUN_DIR[:SYSTEM]; the first is the reference")
    args = ap.parse_args(argv)

    from evolve._env import quiet_defaults

    quiet_defaults()
    from evolve.archive.export import find_artifact_refs
    from evolve.results.stats import paired
    from evolve.scoring.session import Session
    from evolve.task.taskfile import load_task

    cfg, base = load_task(
        args.task,
        [
            *args.overrides,
            f"seed={args.seed}",
            "operators=[]",
            f"dataset.params.n_test={args.n_test}",
            "budget.seconds=1000000",
        ],
    )
    out = Path(args.out)
    session = Session(cfg, base_dir=base, run_dir=out, resume=True)
    tasks = session.tasks("test")
    rows, ref = [], None
    with session.outside_budget():  # scoring, not evolving
        for spec in args.systems:
            label, _, where = spec.partition("=")
            run, _, which = where.partition(":")
            system, archive = _system(Path(run), which or "baseline")
            for art in find_artifact_refs(system):  # its base weights and adapter, into this scoring's store
                archive.artifacts.copy_to(art, session.archive.artifacts)
            trajs = session.rollouts(
                system, tasks, split="test", tag="eval:test", description=f"{label} {system.id[:8]}"
            )
            scores = {str(t.task_id): t.score for t in trajs}
            row = {
                "label": label,
                "run": run,
                "system": system.id,
                "n": len(scores),
                "accuracy": sum(scores.values()) / len(scores),
            }
            if ref is None:
                ref = scores
            else:
                row["vs_first"] = paired(ref, scores)
            rows.append(row)
            d = row.get("vs_first")
            print(
                f"{label:>12} {system.id[:12]} {row['accuracy']:.1%} (n={row['n']})"
                + (f"  {100 * d['diff']:+.1f} ±{100 * d['ci95']:.1f} (p={d['p']:.2g})" if d else ""),
                flush=True,
            )
    session.close()
    (out / "rescore.json").write_text(json.dumps({"seed": args.seed, "n_test": len(tasks), "rows": rows}, indent=1))
    return {"rows": rows}


if __name__ == "__main__":
    main()
