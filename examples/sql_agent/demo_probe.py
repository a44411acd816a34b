"""Can any selection on validation tasks pick good few-shot demos for the tiny SQL model?
An analysis of a finished ``prompt_layer.py`` run (not a method; it looks at test scores).

    EVOLVE_CACHE_DIR=... .venv/bin/python examples/sql_agent/demo_probe.py --seed 0 [--out runs/prompt_layer]

For the run's starting system (no demos) and the same 12 random demo sets ``prompt_layer.py
--spread 12`` scores (drawn from the model's own solved training tasks), prints accuracy on

* the validation split (200 tasks; databases named from train-side words, like training),
* 300 extra tasks from held-out domains (test-side words; their own databases, not test's),
* the 300 test tasks,

and the correlation of each validation kind with test across the 13 prompts. Then an oracle
upper bound for per-task demo choice: each test task shown one pool demo of its own SQL template
when the pool has one.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/prompt_layer")
    args = ap.parse_args()
    sys.path.insert(0, str(HERE))

    from evolve._env import quiet_defaults

    quiet_defaults()
    import numpy as np

    from evolve.prompts.bootstrap import DemoBootstrap
    from evolve.prompts.components import set_demos
    from evolve.scoring.session import Session
    from evolve.task.taskfile import load_task
    from evolve.worlds.sql.dataset import generate_split, with_db_paths
    from evolve.worlds.sql.fewshot import mask, sql_of

    root = Path(args.out) / f"seed{args.seed}"
    cfg, base = load_task(HERE / "prompts.yaml", [f"seed={args.seed}"])
    eng = Session(cfg, base_dir=base, run_dir=root / "ours", resume=True, budgeted=False)  # analysis scoring
    start = eng.baseline()
    probe = root / "demo_probe"
    (probe / "k" / "db").mkdir(parents=True, exist_ok=True)
    ood = with_db_paths({"v": generate_split("val", "test", 300, args.seed, probe / "k" / "db", "k")}, probe)["v"]
    for t in ood:
        t["id"] += "-heldout"
    val, test = eng.tasks("val"), eng.tasks("test")

    op, pool, seen = DemoBootstrap(), [], set()  # the pool prompt_layer.py's spread draws from
    for t in eng.archive.trajectories(start.id, "train"):
        d, _ = op.demo_of(t)
        if d is not None and d["input"] not in seen:
            seen.add(d["input"])
            pool.append(d)
    rng = random.Random(f"spread/{args.seed}")
    sets = [[]] + [rng.sample(pool, min(len(pool), rng.randint(1, 4))) for _ in range(12 if pool else 0)]
    rows = []
    for i, demos in enumerate(sets):
        system = set_demos(start, demos) if demos else start

        def acc(tasks, split, system=system):
            return statistics.mean(t.score for t in eng.rollouts(system, tasks, split=split, tag="eval:test"))

        rows.append((acc(val, "val"), acc(ood, "test"), acc(test, "test")))
        print(
            f"{'no demos' if not demos else f'set {i:2d} ({len(demos)})':12s}  val {rows[-1][0]:.3f}  "
            f"held-out-domain val {rows[-1][1]:.3f}  test {rows[-1][2]:.3f}",
            flush=True,
        )
    r = np.array(rows)
    print(
        f"correlation with test over {len(rows)} prompts: validation {np.corrcoef(r[:, 0], r[:, 2])[0, 1]:+.2f}, "
        f"held-out-domain validation {np.corrcoef(r[:, 1], r[:, 2])[0, 1]:+.2f}"
    )

    skel = [mask("", sql_of(d))[1] for d in pool]
    groups: dict[tuple, list] = defaultdict(list)
    for t in test:
        same = [i for i, s in enumerate(skel) if s == mask("", t["gold_sql"])[1]][:1]
        groups[tuple(same)].append(t)
    scores = []
    for idx, tasks in groups.items():
        system = set_demos(start, [pool[i] for i in idx]) if idx else start
        scores += [t.score for t in eng.rollouts(system, tasks, split="test", tag="eval:test")]
    covered = sum(len(v) for k, v in groups.items() if k)
    print(
        f"oracle per-task demo (own template, when the pool of {len(pool)} has it: {covered}/{len(test)} tasks): "
        f"test {statistics.mean(scores):.3f} (no demos {rows[0][2]:.3f})"
    )
    eng.close()


if __name__ == "__main__":
    main()
