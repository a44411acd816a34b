"""What workflow search buys the tiny SQL agent, on held-out test tasks, and what it costs in calls.

    .venv/bin/python examples/sql_agent/topology_layer.py --seed 0     # about 20 minutes on 2 cores

The model is task.yaml's cold start for the seed (SFT on 500 demos; shared with the other layer
experiments through ``_layers.plain``). Its weights are given to ``topology.yaml`` as ready-made
base weights, so every workflow below runs the very same model:

1. ``evolve run topology.yaml``: the starting system is a single write-and-answer step; the
   ``topology`` operator runs MCTS over graph edits (execute, repair loop, vote), scoring each
   workflow on the same training tasks with its model calls per task; the engine accepts a
   child only if it beats the single step on a fresh minibatch and is not worse on validation.
2. Every workflow the search scored, the single step, the promoted one and two hand-written
   references (the repair loop of the hand-written agent, and a 5-vote) are scored on the 300
   test tasks. Writes ``<out>/seed<N>/topology_summary.json`` and ``test_frontier.png``
   (test accuracy against model calls per task) and prints one table; ``+F/-B`` is paired
   against the single step: test tasks the workflow gets right and the single step wrong, and
   the reverse.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _calls(trajs: list) -> float:
    return round(statistics.mean(sum(1 for s in t.steps if s.kind == "llm") for t in trajs), 3)


def _acc(trajs: list) -> float:
    return round(statistics.mean(t.score for t in trajs), 4)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/tool_layer", help="shared with tool_layer.py / memory_layer.py")
    ap.add_argument("--set", action="append", default=[], help="extra overrides for topology.yaml")
    args = ap.parse_args(argv)

    from _layers import plain as plain_run

    from evolve.loop.engine import Engine
    from evolve.scoring.session import Session
    from evolve.task.taskfile import load_task
    from evolve.topology.graph import Workflow, graph_of
    from evolve.worlds.sql.workflow import repair_loop, vote

    p = plain_run(args.seed, args.out, mine=0, samples=0)
    weights = p.engine.archive.artifacts.path(p.system.models["policy"].base)
    run_dir = p.out / "topology"
    cfg, base = load_task(
        HERE / "topology.yaml",
        [f"seed={args.seed}", "models.policy.cold_start=null", f"models.policy.params.weights={weights}", *args.set],
    )
    report = Engine(cfg, base_dir=base, run_dir=run_dir, resume=True).run()
    # test scoring is outside the budget, as in the engine's own report
    eng = Session(cfg, base_dir=base, run_dir=run_dir, resume=True, budgeted=False)
    start = eng.baseline()
    best = eng.archive.get_system(eng.archive.current())

    arms: list[tuple[str, dict]] = [("single step (start)", graph_of(start).to_json())]
    for f in sorted(run_dir.glob("work/*/topology.json")):
        arms += [(f"searched: {row['signature']}", row["graph"]) for row in json.loads(f.read_text())["evaluated"]]
    arms += [
        ("promoted", graph_of(best).to_json()),
        ("hand-written: repair loop x3 (the default agent)", repair_loop(3)),
        ("hand-written: vote n=5 T=0.8", vote(5, 0.8)),
    ]
    test = eng.tasks("test")
    rows, seen = [], {}
    for name, graph in arms:
        wf = Workflow.from_json(graph)
        system = start.replace(workflow={**start.workflow, "graph": wf.to_json()})
        if system.id in seen:  # the same graph under another name (e.g. the promoted one): scored once
            seen[system.id]["names"].append(name)
            continue
        trajs = eng.rollouts(system, test, split="test", tag="eval:test", description=f"test {name[:40]}")
        per_task = {t.task_id: t.score for t in trajs}
        first = rows[0]["per_task"] if rows else per_task  # the single step's, task by task
        rows.append(
            {
                "arm": name,
                "names": [name],
                "workflow": wf.signature(),
                "test": _acc(trajs),
                "calls": _calls(trajs),
                "graph": wf.to_json(),
                "per_task": per_task,
                # paired against the single step on the same tasks: right where it was wrong, and the reverse
                "fixed": sum(1 for k, v in per_task.items() if v > first.get(k, 0.0)),
                "broken": sum(1 for k, v in per_task.items() if v < first.get(k, 0.0)),
            }
        )
        seen[system.id] = rows[-1]
    eng.close()
    for r in rows:
        r.pop("per_task")
    summary = {
        "seed": args.seed,
        "tasks": len(test),
        "report": {k: report.get(k) for k in ("baseline", "best", "stop_reason")},
        "arms": rows,
    }
    (p.out / "topology_summary.json").write_text(json.dumps(summary, indent=1, default=str))
    _plot(rows, p.out / "test_frontier.png", args.seed)
    for r in sorted(rows, key=lambda r: r["calls"]):
        print(
            f"seed {args.seed}  {r['test']:.3f}  {r['calls']:5.2f} calls  +{r['fixed']}/-{r['broken']}  "
            f"{' = '.join(r['names'])[:100]}"
        )
    return summary


def _plot(rows: list[dict], path: Path, seed: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for r in rows:
        promoted = "promoted" in r["names"]
        special = promoted or any(not n.startswith("searched") for n in r["names"])
        ax.scatter(
            r["calls"],
            100 * r["test"],
            s=70 if special else 25,
            marker="*" if promoted else "o",
            color="C3" if promoted else ("C1" if special else "C0"),
            zorder=3,
        )
        if special:
            named = [n for n in r["names"] if not n.startswith("searched")]
            label = "promoted: " + r["workflow"] if promoted else named[0]
            ax.annotate(
                label[:40], (r["calls"], 100 * r["test"]), fontsize=7, xytext=(4, 4), textcoords="offset points"
            )
    ax.set_xlabel("model calls per task (test)")
    ax.set_ylabel("execution accuracy on 300 test tasks (%)")
    ax.set_title(f"Workflows tried by the search (seed {seed}): test accuracy against cost", fontsize=10)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
