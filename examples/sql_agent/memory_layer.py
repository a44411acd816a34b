"""What experience memory and Reflexion buy the tiny SQL agent, on held-out test tasks.

    .venv/bin/python examples/sql_agent/memory_layer.py --seed 0     # 25 min after tool_layer.py (one torch thread beside another run)

All arms share the cold-start model of ``task.yaml`` (SFT on 500 demos) unless said otherwise,
and are scored on the same 300 test tasks (schemas never seen in training):

* ``plain``: the cold-start system.
* ``retry``: two attempts, the second sampled at T=0.8 with nothing new in context (the control
  for Reflexion: what a second try alone buys).
* ``reflexion``: two attempts; a failed first attempt's execution-match feedback ("expected 3
  rows, got 5") is put into the second attempt's context as a lesson (``reflect="feedback"``:
  the tiny model cannot write reflections), second attempt at T=0.8 too.
* ``reflexion_turns``: the same, with the lesson shown the way the model's repair demos show an
  error: its earlier answer, then ``error: expected 3 rows, got 5`` as a tool turn.
* ``memory``: an experience memory built by the ``memory`` operator from the plain system's own
  solved training tasks (``--mine`` tasks × 2 samples at T=0.8); the agent recalls the most
  similar solved example (never from its own database) before the prompt. A tiny model has to
  learn to use the example, so this arm's cold start is SFT on the same 500 demos, each with
  the example the agent would recall (``memory_demos``: the article's ICL stage), same seed and
  epochs.

Writes ``<out>/seed<N>/memory_summary.json`` and prints one table row. Rerunning resumes
(rollouts are memoised); it shares the plain run and its mining rollouts with ``tool_layer.py``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def _acc(trajs: list) -> float:
    return round(statistics.mean(t.score for t in trajs), 4)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mine", type=int, default=1500)
    ap.add_argument("--samples", type=int, default=2)
    ap.add_argument("--out", default="runs/tool_layer")
    ap.add_argument(
        "--arms",
        default="retry,reflexion,reflexion_turns,memory",
        help="which arms to run, of retry, reflexion, reflexion_turns, memory",
    )
    ap.add_argument(
        "--render",
        default="full",
        choices=["full", "skeleton"],
        help="how recalled experiences are shown (the memory arm is named memory or memory_skeleton)",
    )
    ap.add_argument(
        "--recall",
        default="similar",
        choices=["similar", "random"],
        help="random: k experiences drawn at random per task, in training demos and at test alike "
        "(the control for relevance; the arm's name gets _random)",
    )
    args = ap.parse_args(argv)

    from _layers import plain as plain_run

    from evolve.loop.operators import OperatorContext
    from evolve.memory.operator import MemoryOperator
    from evolve.reflexion import reflexion_agent
    from evolve.scoring.session import Session
    from evolve.task.taskfile import load_task
    from evolve.types import content_hash

    wanted = set(args.arms.split(","))
    pl = plain_run(args.seed, args.out, mine=args.mine if "memory" in wanted else 0, samples=args.samples)
    out, common, cfg, base, sa, test, mined = pl.out, pl.common, pl.cfg, pl.base, pl.system, pl.test, pl.mined
    summary: dict = {"seed": args.seed, "plain": _acc(pl.test_trajs)}

    arms = {
        "retry": reflexion_agent(
            "evolve.worlds.sql:agent",
            "evolve.worlds.sql:reward",
            name="retry",
            reflect="feedback",
            max_attempts=2,
            max_reflections=0,
            temperature=0.8,
        ),
        "reflexion": reflexion_agent(
            "evolve.worlds.sql:agent",
            "evolve.worlds.sql:reward",
            name="reflexion",
            reflect="feedback",
            max_attempts=2,
            temperature=0.8,
        ),
        "reflexion_turns": reflexion_agent(
            "evolve.worlds.sql:agent",
            "evolve.worlds.sql:reward",
            name="reflexion_turns",
            reflect="feedback",
            max_attempts=2,
            temperature=0.8,
            inject="turns",
            lesson_template="error: {feedback}",
        ),
    }
    for name, agent in arms.items():
        if name not in wanted:
            continue
        eng = Session(cfg, base_dir=base, run_dir=out / name, resume=True, agent=agent)
        system = eng.baseline()
        trajs = eng.rollouts(system, test, split="test", tag="eval:test")
        eng.close()
        summary[name] = _acc(trajs)

    if "memory" in wanted:
        work = out / "memory_op"
        work.mkdir(parents=True, exist_ok=True)
        op = MemoryOperator(store=str((out / "memory").resolve()), k=1, extract="evolve.worlds.sql:experiences")
        ctx = OperatorContext(
            generation=1,
            seed=args.seed,
            rng=random.Random(0),
            train=pl.engine.tasks("train"),
            trajectories=mined,
            artifacts=None,
            workdir=work,
            rollouts=lambda *a, **k: [],
            log=print,
        )
        (cand,) = op.propose(sa, ctx)
        spec = {
            **cand.system.memory,
            **({"render": args.render} if args.render != "full" else {}),
            **({"recall": "random"} if args.recall == "random" else {}),
        }
        (out / "memory_spec.json").write_text(json.dumps(spec))
        cfg_m, _ = load_task(
            HERE / "task.yaml",
            common + [f"memory={json.dumps(spec)}", "models.policy.cold_start.demos=evolve.worlds.sql:memory_demos"],
        )
        eng = Session(cfg_m, base_dir=base, run_dir=out / f"memory-{content_hash(spec, 8)}", resume=True)
        sm = eng.baseline()
        trajs = eng.rollouts(sm, test, split="test", tag="eval:test")
        eng.close()
        arm = ("memory" if args.render == "full" else "memory_" + args.render) + (
            "_random" if args.recall == "random" else ""
        )
        summary[arm] = _acc(trajs)
        summary["memory_items"] = cand.info.get("items")
        if args.recall == "similar":  # random recall has no similarity
            sims = [
                s.result[0]["similarity"]
                for t in trajs
                for s in t.steps
                if getattr(s, "name", "") == "recall_memory" and s.result
            ]
            summary["memory_mean_similarity"] = round(statistics.mean(sims), 3) if sims else None
    path = out / "memory_summary.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    summary = {**old, **summary}
    path.write_text(json.dumps(summary, indent=1))
    print(" | ".join(f"{k}: {v}" for k, v in summary.items()))
    return summary


if __name__ == "__main__":
    main()
