"""Our prompt search against DSPy's BootstrapFewShot and MIPROv2 on the tiny SQL model, at the
same LLM-call budget, on held-out test tasks.

    OMP_NUM_THREADS=1 .venv/bin/python examples/sql_agent/prompt_layer.py --seed 0 [--spread 12]

(one torch thread: on a shared 2-core machine two threads made the cold start 3-4x slower;
about 10 minutes a seed then: the cold start ~6, the rest ~4.)

1. ``prompts.yaml``: the few-shot cold start (SFT on 500 training tasks, each prompt preceded by
   0-4 masked demos of other tasks; :mod:`evolve.worlds.sql.fewshot`), a starting system with no
   demos and the schema as the task gives it, and ``evolve run`` with ``prompt_choice`` (the
   layout of the schema: as given, the tables the question names first, or only those;
   :mod:`evolve.worlds.sql.render`) and ``bootstrap_demos`` (which of the model's own solved
   training tasks to show, and how many) under the ``pareto`` selector, until ``budget.calls``
   is spent.
2. The same weights (given as ready-made base weights, so the model is byte for byte the same)
   under ``sql_program.py``: a DSPy program with one Predict whose adapter sends exactly the
   agent's messages; compiled by ``dspy.BootstrapFewShot`` and ``dspy.MIPROv2`` through
   :func:`evolve.prompts.baselines.run_dspy_baseline` with the LLM calls our search spent as
   their budget (train split as trainset, val as valset, the same reward as metric). DSPy's
   optimisers search what a DSPy program exposes, instructions and demos; the layout of the
   schema is not among them.
3. Scored on the 300 test tasks (schemas never seen in training) through the engine's rollouts:
   our promoted system, the starting system (no demos), the two compiled programs, the DSPy demo
   sets run through our native agent (a check that the rendering is the same: the scores must
   agree), and, to show where the gain comes from, our promoted template alone (no demos) and
   each DSPy demo set under it; task.yaml's plain system (3 turns, its own cold start) for
   reference.

Token lengths (pointer tokenizer fitted on the few-shot demos, seed 0): a masked demo line is
85 tokens on average (126 at most); a prompt without demos 84 (107); a cold-start sequence 305
on average (p95 506, max 558 with 4 demos) — so ``max_len`` is 640 in prompts.yaml (task.yaml: 512).

Writes ``<out>/seed<N>/prompt_summary.json`` and prints a table. Rerunning resumes: the engine's
rollouts are memoised in each run's archive, and a finished DSPy baseline is read back.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


OURS = "ours: prompt_choice + bootstrap_demos + pareto"


def _acc(trajs: list) -> float:
    return round(statistics.mean(t.score for t in trajs), 4)


def paired(ours: list, other: list) -> list:
    """``[won, lost, p]``: test tasks ours gets right and ``other`` wrong, the reverse, and the
    two-sided sign-test p-value of that split (the same tasks, in the same order)."""
    from math import comb

    won = sum(a.score > b.score for a, b in zip(ours, other, strict=True))
    lost = sum(a.score < b.score for a, b in zip(ours, other, strict=True))
    n, k = won + lost, min(won, lost)
    p = min(1.0, 2 * sum(comb(n, i) for i in range(k + 1)) / 2**n) if n else 1.0
    return [won, lost, float(f"{p:.3g}")]


def search_calls(run_dir: Path) -> dict:
    """LLM calls and rollouts a run spent outside its test scoring."""
    con = sqlite3.connect(f"file:{run_dir / 'archive.sqlite'}?mode=ro", uri=True)
    try:
        n, calls = con.execute(
            "SELECT COUNT(*), COALESCE(SUM(calls), 0) FROM trajectories WHERE split != 'test'"
        ).fetchone()
    finally:
        con.close()
    return {"rollouts": int(n), "llm_calls": int(calls)}


def _demos(system) -> list[dict]:
    from evolve.worlds.sql.fewshot import demos_of

    return demos_of(system)


def _skeleton(sql: str) -> str:
    from evolve.worlds.sql.fewshot import mask

    return mask("", sql)[1]


def shown_template(test: list, trajs: list, nodemo: list, demos: list[dict]) -> dict:
    """Accuracy with ``demos`` on the test tasks whose SQL skeleton one of them shows, and on the
    rest, each against the same tasks without demos: what a demo does when it fits and when not."""
    from evolve.worlds.sql.fewshot import sql_of

    shown = {_skeleton(sql_of(d)) for d in demos}
    fit = [_skeleton(t["gold_sql"]) in shown for t in test]
    out = {}
    for name, want in (("fits", True), ("other", False)):
        idx = [i for i, f in enumerate(fit) if f == want]
        out[name] = {
            "n": len(idx),
            "with": round(statistics.mean(trajs[i].score for i in idx), 4) if idx else None,
            "without": round(statistics.mean(nodemo[i].score for i in idx), 4) if idx else None,
        }
    return out


def spread(eng, start, test: list, nodemo: list, n: int, seed: int) -> dict:
    """``n`` random demo sets (k = 1..4) from the starting system's solved training tasks (the
    pool our search draws from), each scored on the test tasks: how much choosing demos can move
    this model at all (an analysis on the test split, not a method)."""
    import random

    from evolve.prompts.bootstrap import DemoBootstrap
    from evolve.prompts.components import set_demos

    op, pool, seen = DemoBootstrap(), [], set()
    for t in eng.archive.trajectories(start.id, "train"):
        d, _ = op.demo_of(t)
        if d is not None and d["input"] not in seen:
            seen.add(d["input"])
            pool.append(d)
    rng, rows = random.Random(f"spread/{seed}"), []
    for i in range(n if pool else 0):
        demos = rng.sample(pool, min(len(pool), rng.randint(1, 4)))
        trajs = eng.rollouts(set_demos(start, demos), test, split="test", tag="eval:test", description=f"spread {i}")
        rows.append({"k": len(demos), "test": _acc(trajs), **shown_template(test, trajs, nodemo, demos)})
    accs = sorted(r["test"] for r in rows)
    base = _acc(nodemo)
    return {
        "pool": len(pool),
        "sets": rows,
        "min": accs[0] if accs else None,
        "median": statistics.median(accs) if accs else None,
        "max": accs[-1] if accs else None,
        "above_no_demos": sum(a > base for a in accs),
        "below_no_demos": sum(a < base for a in accs),
    }


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="runs/prompt_layer")
    ap.add_argument("--arms", default="ours,bootstrap,mipro,plain", help="of ours, bootstrap, mipro, plain")
    ap.add_argument(
        "--budget", type=int, default=None, help="the DSPy optimisers' LLM calls (default: what ours spent)"
    )
    ap.add_argument("--set", action="append", default=[], help="extra overrides for prompts.yaml")
    ap.add_argument("--spread", type=int, default=0, help="also score this many random demo sets on test (analysis)")
    ap.add_argument("--layouts", action="store_true", help="also score every schema layout alone (analysis)")
    args = ap.parse_args(argv)

    from evolve._env import quiet_defaults

    quiet_defaults()
    from evolve.loop.engine import Engine
    from evolve.prompts.components import get_template, set_demos, set_template
    from evolve.scoring.session import Session
    from evolve.task.taskfile import load_task

    wanted = set(args.arms.split(","))
    root = Path(args.out) / f"seed{args.seed}"
    root.mkdir(parents=True, exist_ok=True)
    path = root / "prompt_summary.json"
    summary: dict = json.loads(path.read_text()) if path.exists() else {}
    summary.update(seed=args.seed, arms=summary.get("arms", {}))
    arms = summary["arms"]

    # 1. our search (it also builds the few-shot cold start, cached by content)
    cfg, base = load_task(HERE / "prompts.yaml", [f"seed={args.seed}", *args.set])
    report = Engine(cfg, base_dir=base, run_dir=root / "ours", resume=True).run() if "ours" in wanted else None
    eng = Session(cfg, base_dir=base, run_dir=root / "ours", resume=True, budgeted=False)  # test scoring: no budget
    start = eng.baseline()
    best = eng.archive.get_system(eng.archive.current() or start.id)
    weights = eng.archive.artifacts.path(start.models["policy"].base)
    spent = search_calls(root / "ours")
    test = eng.tasks("test")

    def score(system, name: str, **info) -> list:
        trajs = eng.rollouts(system, test, split="test", tag="eval:test", description=f"test {name}")
        arms[name] = {**arms.get(name, {}), "test": _acc(trajs), **info}
        if _demos(system):
            arms[name]["by_shown_template"] = shown_template(test, trajs, nodemo, _demos(system))
        return trajs

    nodemo: list = []
    nodemo = score(start, "no demos (start)", llm_calls=0, demos=0)
    ours_trajs: list = []
    if report is not None:
        summary["ours_report"] = {k: report.get(k) for k in ("baseline", "best", "stop_reason")}
        ours_trajs = score(
            best,
            OURS,
            llm_calls=spent["llm_calls"],
            rollouts=spent["rollouts"],
            demos=len(_demos(best)),
            system_id=best.id,
            template=get_template(best),
            generations=len(eng.state.generations()),
            shown=[d.get("input", "")[-120:] for d in _demos(best)],
        )
    found = get_template(best) if OURS in arms else ""
    if found:  # where the gain comes from: the layout alone, without the demos
        trajs = eng.rollouts(
            set_template(start, found), test, split="test", tag="eval:test", description="test ours' template alone"
        )
        arms[OURS]["template_alone_test"] = _acc(trajs)
    budget = args.budget or spent["llm_calls"]
    summary["budget_llm_calls"] = budget

    # 2. DSPy's optimisers on the same weights, data, reward and budget
    common = [
        f"seed={args.seed}",
        "agent=sql_program:agent",
        "prompts={}",
        "models.policy.cold_start=null",
        f"models.policy.params.weights={weights}",
        *args.set,
    ]
    for opt, label in (("bootstrap", "dspy.BootstrapFewShot"), ("mipro", "dspy.MIPROv2")):
        if opt not in wanted:
            continue
        rd = root / f"dspy_{opt}"
        if (rd / "dspy_baseline.json").exists():
            res = json.loads((rd / "dspy_baseline.json").read_text())
        else:
            from evolve.prompts.baselines import run_dspy_baseline

            res = run_dspy_baseline(HERE / "prompts.yaml", opt, budget=budget, overrides=common, out=rd)
        demos = json.loads(res["compiled"]["prompts"].get("write.demos", "[]"))
        arms[label] = {
            "test": round(res["compiled"]["score"], 4),
            "llm_calls": res["spent"]["llm_calls"],
            "demos": len(demos),
            "knobs": res["knobs"],
            "compile_seconds": res["compile_seconds"],
            "dspy_start_test": round(res["baseline"]["score"], 4),
            "instruction": res["compiled"]["prompts"].get("write.instruction", "")[:200],
        }
        # the same demos through our native agent: equal scores say the two render them identically
        native = set_demos(start, [{k: d[k] for k in ("question", "gold_sql") if k in d} for d in demos])
        trajs = eng.rollouts(native, test, split="test", tag="eval:test", description=f"test {opt} demos, native")
        arms[label]["native_agent_test"] = _acc(trajs)
        if ours_trajs:  # paired on the same test tasks: ours right and this wrong, and the reverse
            arms[label]["ours_won_lost"] = paired(ours_trajs, trajs)
        if found:  # DSPy's demos under the layout our search found (DSPy's optimisers cannot search it)
            with_t = eng.rollouts(
                set_template(native, found),
                test,
                split="test",
                tag="eval:test",
                description=f"test {opt} demos, our template",
            )
            arms[label]["with_our_template_test"] = _acc(with_t)
        if demos:
            arms[label]["by_shown_template"] = shown_template(test, trajs, nodemo, demos)
    if args.layouts:  # every layout prompt_choice may pick, on the starting system (analysis)
        from evolve.prompts.choices import PromptChoice

        op = next((o for o in cfg.operators if o.name == "prompt_choice"), None)
        alts = PromptChoice(**op.params).p.choices.get("template", []) if op is not None else []
        summary["layouts"] = {}
        for alt in alts:
            system = set_template(start, alt) if alt else start
            # val only as the search scored it (new val rollouts here would count as search calls)
            val = eng.archive.task_scores(system.id, "val") if eng.archive.has_system(system.id) else {}
            row = {
                "val": round(statistics.mean(val.values()), 4) if val else None,
                "test": _acc(
                    eng.rollouts(system, test, split="test", tag="eval:test", description=f"layout {alt!r} on test")
                ),
            }
            summary["layouts"][alt or "(as given)"] = row
    if args.spread:
        summary["spread"] = spread(eng, start, test, nodemo, args.spread, args.seed)
    eng.close()

    # 3. task.yaml's plain system, for reference (3 turns, its own cold start)
    if "plain" in wanted:
        from _layers import plain as plain_run

        pl = plain_run(args.seed, args.out, mine=0, samples=0)
        arms["task.yaml plain (3 turns, plain SFT)"] = {"test": _acc(pl.test_trajs), "llm_calls": 0, "demos": 0}

    path.write_text(json.dumps(summary, indent=1, default=str))
    print(f"seed {args.seed}: test accuracy on {len(test)} held-out tasks; LLM calls spent choosing the prompt")
    for name, row in arms.items():
        extra = f"  (same demos, native agent: {row['native_agent_test']:.3f})" if "native_agent_test" in row else ""
        if "ours_won_lost" in row:
            w, lo, p = row["ours_won_lost"]
            extra += f"  (ours won {w}, lost {lo} of the test tasks; sign test p = {p:.2g})"
        if "with_our_template_test" in row:
            extra += f"  (with our template: {row['with_our_template_test']:.3f})"
        if "template_alone_test" in row:
            extra += f"  (its template alone, no demos: {row['template_alone_test']:.3f}; {row['template']!r})"
        print(f"  {name:40s} {row['test']:.3f}  {row.get('llm_calls', 0):6d} calls  {row.get('demos', 0)} demos{extra}")
        if "by_shown_template" in row:
            print(
                "    "
                + "; ".join(
                    f"{k} ({v['n']} tasks): {v['with']} with demos vs {v['without']} without"
                    for k, v in row["by_shown_template"].items()
                    if v["n"]
                )
            )
    for alt, row in (summary.get("layouts") or {}).items():
        val = "not scored by the search" if row["val"] is None else f"{row['val']:.3f}"
        print(f"  layout {alt!r} alone, no demos: val {val}  test {row['test']:.3f}")
    if summary.get("spread"):
        sp = summary["spread"]
        print(
            f"  {len(sp['sets'])} random demo sets from a pool of {sp['pool']}: test min {sp['min']}, median "
            f"{sp['median']}, max {sp['max']}; above no demos {sp['above_no_demos']}, below {sp['below_no_demos']}"
        )
    return summary


if __name__ == "__main__":
    main()
