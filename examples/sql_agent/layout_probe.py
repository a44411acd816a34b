"""Which schema layout does a task file's starting model read best? An analysis, not a method
(it looks at test scores): the starting system of ``--task`` (its cold start, cached by
content) scored on validation and test under each layout of :mod:`evolve.worlds.sql.render`.

    EVOLVE_CACHE_DIR=... .venv/bin/python examples/sql_agent/layout_probe.py --task task.yaml --seed 0

Writes nothing but its own run directory (``--out``/<task>-seed<N>, rollouts memoised there) and
prints one line per layout. ``prompt_layer.py --layouts`` does the same for prompts.yaml inside
the prompt comparison.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
LAYOUTS = {"as given": "", "linked": "{schema_linked}\nq: {question}", "pruned": "{schema_pruned}\nq: {question}"}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--task", default="task.yaml", help="a task file beside this script, or a path")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/layout_probe")
    args = ap.parse_args(argv)

    from evolve._env import quiet_defaults

    quiet_defaults()
    from evolve.prompts.components import set_template
    from evolve.scoring.session import Session
    from evolve.task.taskfile import load_task

    path = HERE / args.task if (HERE / args.task).exists() else Path(args.task)
    cfg, base = load_task(path, [f"seed={args.seed}"])
    eng = Session(
        cfg, base_dir=base, run_dir=Path(args.out) / f"{path.stem}-seed{args.seed}", resume=True, budgeted=False
    )  # analysis scoring, outside every budget
    start = eng.baseline()
    out = {}
    try:
        for name, template in LAYOUTS.items():
            system = set_template(start, template) if template else start
            out[name] = {
                split: round(
                    statistics.mean(
                        t.score
                        for t in eng.rollouts(
                            system, eng.tasks(split), split=split, tag=f"eval:{split}", description=f"{name} on {split}"
                        )
                    ),
                    4,
                )
                for split in ("val", "test")
            }
            print(
                f"{path.name} seed {args.seed}: {name:9s} val {out[name]['val']:.3f}  test {out[name]['test']:.3f}",
                flush=True,
            )
    finally:
        eng.close()
    return out


if __name__ == "__main__":
    main()
