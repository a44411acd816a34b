"""What each layer buys SmolLM2-135M-Instruct on the SQL world, alone and together (issue 40).

    .venv/bin/python bench/layers/smollm_layers.py --out runs/smollm_layers              # every row, seed 0
    .venv/bin/python bench/layers/smollm_layers.py --out runs/smollm_layers --only star,grpo --seed 1   # item 3, one seed

Each row is one ``evolve run examples/sql_agent/task_smollm.yaml`` with the overrides in
:data:`ROWS` (its run folder is ``<out>/seed<N>/<row>``; a row already finished is read back, not
rerun). The untouched model is every run's own baseline: the same system, greedy, on the same 300
test tasks. A row whose change is the agent rather than the system (Reflexion at test time) is a run
with no generation, compared task by task with another row's baseline (:data:`AGAINST`). The gain is the paired
difference on the test tasks with its 95% interval (:func:`evolve.results.stats.paired`).

The weights rows (:data:`WEIGHTS`, STaR and GRPO) and ``sft_topology`` also score the child their operator
proposed on test whether or not the engine kept it (``evolve eval``; at about 5% the 100 validation
tasks decide acceptance almost by chance), and the weights rows compare the two children task by task: the last table,
one line per seed that has both, is issue 40's item 3 (GRPO against STaR at the same sampling
budget), from the untouched model and from a LoRA SFT cold start. ``sft`` is also compared with the
untouched model, ``together`` with the ``star`` row's system and ``sft_together`` with the
``sft_star`` row's (:data:`ALSO`): what Reflexion adds to the same weights layers.

Writes ``<out>/seed<N>/layers.json`` and prints the markdown table rows: test before and after,
the paired gain (95%), tasks won/lost, first replies starting with SELECT and queries that ran
(before → after, of 300), rollouts the run used, wall seconds. Every figure comes from
the runs' archives; a run that fails stops the script with its exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from evolve.worlds.sql.workflow import PALETTE as SQL_PALETTE

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "examples" / "sql_agent" / "task_smollm.yaml"

STAR = "{name: star, params: {tasks: 200, samples: 4, temperature: 0.4, lr: 0.001, epochs: 3, batch_size: 8, r: 16, replay: 0, min_examples: 4}}"
GRPO = (
    "{name: grpo, params: {steps: 1, tasks_per_step: 200, group_size: 4, temperature: 0.4, lr: 0.001, "
    "minibatches: 4, num_iterations: 2, beta: 0.0, ptx_coef: 0.0}}"
)
MEMORY = (
    "{name: memory, params: {extract: 'evolve.worlds.sql:experiences', tasks: 200, samples: 2, temperature: 0.4, k: 2}}"
)
REFLECTIVE = "{name: reflective, params: {minibatch: 6}}"
TOOLS = "{name: toolforge, params: {tasks: 200, samples: 2, temperature: 0.4, min_support: 2}}"


def topology(palette: str) -> str:
    """The topology operator of the topology rows, searching over ``palette`` (YAML: an import path or a list)."""
    return (
        "{name: topology, params: {max_evals: 6, search_tasks: 60, exploration: 0.5, cost_weight: 0.002, "
        f"children: 2, palette: {palette}}}}}"
    )


TOPOLOGY = topology("'evolve.worlds.sql.workflow:PALETTE'")
# the SQL world's palette (evolve/worlds/sql/workflow.py) with the vote's samples run at once, so that the
# batched model server takes them together (one after another, a vote made each evaluation ~6x as long)
PALETTE_AT_ONCE = json.dumps(
    [{**it, "params": {**it["params"], "parallel": 8}} if it["name"] == "vote" else it for it in SQL_PALETTE]
)
SFT_TOPOLOGY = topology(PALETTE_AT_ONCE)
# a LoRA SFT cold start on 300 of the world's demos, in the task's own layout (cached: the three sft rows share it)
COLD = "models.policy.cold_start={n_demos: 300, epochs: 1, lr: 0.001, batch_size: 8, eval_every: 25, n_eval: 50}"
SINGLE_STEP = (
    "{entry: write, nodes: [{id: write, type: sql.write}, {id: answer, type: answer, params: {fields: [sql, rows, turns]}}], "
    "edges: [{src: write, dst: answer}]}"
)

# row -> (what it changes, --set overrides); every row starts from the untouched model
ROWS: dict[str, tuple[str, list[str]]] = {
    "reflective": (
        "reflective prompt search, SmolLM2 writing the instruction, 3 generations",
        [f"operators=[{REFLECTIVE}]", "budget.generations=3"],
    ),
    "memory": (
        "experience memory (ADD/MERGE/DELETE) from its own solved training tasks, 2 recalled",
        [f"operators=[{MEMORY}]", "budget.generations=1"],
    ),
    "reflexion": (
        "Reflexion at test time: a failed first attempt's execution feedback, then a second attempt",
        ["operators=[]", "budget.generations=0", "agent=evolve.worlds.sql:reflexion_agent"],
    ),
    "star": (
        "STaR: LoRA on its own successes, 200 tasks x 4 samples at T=0.4",
        [f"operators=[{STAR}]", "budget.generations=1"],
    ),
    "grpo": (
        "GRPO (loss_type dapo, TRL's default, tested against TRL): LoRA, 200 tasks x groups of 4 at T=0.4, one on-policy batch",
        [f"operators=[{GRPO}]", "budget.generations=1"],
    ),
    "tools": (
        (
            "tool synthesis: query tools mined from its solved training tasks (200 x 2 at T=0.4), listed in "
            "the system message (workflow.tool_docs)"
        ),
        [f"operators=[{TOOLS}]", "budget.generations=1", "workflow.tool_docs=true"],
    ),
    "topology": (
        "topology search (MCTS over workflow graphs: execute, repair loop, vote), from the single step",
        [
            f"operators=[{TOPOLOGY}]",
            "budget.generations=1",
            "agent=evolve.topology:agent",
            f"workflow.graph={SINGLE_STEP}",
        ],
    ),
    "together": (
        (
            "STaR with Reflexion: the Reflexion agent samples STaR's training tasks, and the STaR "
            "system answers the test tasks with a second attempt after a failed one"
        ),
        [f"operators=[{STAR}]", "budget.generations=1", "agent=evolve.worlds.sql:reflexion_agent"],
    ),
    "sft": (
        "a LoRA SFT cold start alone (300 demos of the world, 1 epoch, the best of its validation checks kept)",
        [COLD, "operators=[]", "budget.generations=0"],
    ),
    "sft_reflexion": (
        "Reflexion at test time on the SFT cold start (together: a weights layer and a test-time one)",
        [COLD, "operators=[]", "budget.generations=0", "agent=evolve.worlds.sql:reflexion_agent"],
    ),
    "sft_star": (
        "STaR as in the star row, from the SFT cold start",
        [COLD, f"operators=[{STAR}]", "budget.generations=1"],
    ),
    "sft_grpo": (
        "GRPO as in the grpo row, from the SFT cold start",
        [COLD, f"operators=[{GRPO}]", "budget.generations=1"],
    ),
    "sft_topology": (
        "topology search as in the topology row (the vote's samples at once), from the SFT cold start",
        [
            COLD,
            f"operators=[{SFT_TOPOLOGY}]",
            "budget.generations=1",
            "agent=evolve.topology:agent",
            f"workflow.graph={SINGLE_STEP}",
        ],
    ),
    "sft_together": (
        (
            "all three that moved it: the SFT cold start, then STaR, with Reflexion both sampling STaR's "
            "training tasks and answering the test tasks"
        ),
        [COLD, f"operators=[{STAR}]", "budget.generations=1", "agent=evolve.worlds.sql:reflexion_agent"],
    ),
    # issue 51: the same SFT'd system sampled by CTranslate2 (greedy), paired with the sft row's (torch)
    "sft_ct2_int8": (
        "the sft row's system sampled by CTranslate2 in int8",
        [
            COLD,
            "operators=[]",
            "budget.generations=0",
            "models.policy.params.engine=ctranslate2",
            "models.policy.params.compute_type=int8",
        ],
    ),
    "sft_ct2_float32": (
        "the sft row's system sampled by CTranslate2 in float32",
        [
            COLD,
            "operators=[]",
            "budget.generations=0",
            "models.policy.params.engine=ctranslate2",
            "models.policy.params.compute_type=float32",
        ],
    ),
}
AGAINST = {
    "reflexion": "reflective",
    "sft_reflexion": "sft",
}  # a row that changes the agent: paired with that row's baseline
# weights rows: the child each operator proposed is scored on test whether or not the engine kept it
# (at ~5% the 100 validation tasks decide acceptance almost by chance), and the two are compared
PAIRS = (("star", "grpo"), ("sft_star", "sft_grpo"))  # (STaR's row, GRPO's row) at the same sampling budget
WEIGHTS = tuple(r for pair in PAIRS for r in pair)
# rows whose first proposed child is scored on test even when validation rejected it (topology: its best workflow)
SCORE_CHILD = (*WEIGHTS, "sft_topology")
# a row also compared, task by task, with another row's best or baseline system (the same test tasks at one seed)
ALSO = {
    "together": ("star", "best"),
    "sft": ("star", "baseline"),
    "sft_together": ("sft_star", "best"),
    "sft_ct2_int8": ("sft", "baseline"),
    "sft_ct2_float32": ("sft", "baseline"),
}


def pair_key(pair: tuple[str, str]) -> str:
    """Where layers.json keeps a pair's GRPO-against-STaR comparison."""
    return "grpo_vs_star" + ("" if pair == PAIRS[0] else f":{pair[0]}")


def row_command(row: str, seed: int) -> list[str]:
    """The ``--set`` arguments of a row (a run's and its ``evolve eval``'s must match)."""
    args = ["--set", f"seed={seed}"]
    for s in ROWS[row][1]:
        args += ["--set", s]
    return args


def run_row(row: str, seed: int, out: Path) -> Path:
    run_dir = out / f"seed{seed}" / row
    if (run_dir / "report.json").is_file():
        return run_dir
    cmd = [sys.executable, "-m", "evolve", "run", str(TASK), "--out", str(run_dir), *row_command(row, seed)]
    if run_dir.exists():
        cmd.append("--resume")
    t0 = time.time()
    print(f"[{row}] {' '.join(cmd)}", flush=True)
    rc = subprocess.call(cmd, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if rc != 0:
        sys.exit(f"[{row}] evolve run exited {rc}; see {run_dir}")
    (run_dir / "wall_seconds").write_text(f"{time.time() - t0:.0f}\n")
    return run_dir


def child_on_test(row: str, seed: int, run_dir: Path) -> str | None:
    """The id of the child the row's operator proposed from the baseline, scored on test (``evolve
    eval``, memoised in the run's archive) if the engine did not keep it; None if it proposed none."""
    from evolve.archive import Archive

    report = json.loads((run_dir / "report.json").read_text())
    with Archive(run_dir, create=False) as arch:
        kids = arch.children(report["baseline"]["system_id"])
        scored = bool(kids) and bool(arch.task_scores(kids[0], "test"))
    if not kids:
        return None
    if not scored:
        cmd = [
            sys.executable,
            "-m",
            "evolve",
            "eval",
            str(TASK),
            str(run_dir),
            "--system",
            kids[0],
            "--split",
            "test",
            *row_command(row, seed),
        ]
        print(f"[{row}] {' '.join(cmd)}", flush=True)
        if subprocess.call(cmd, cwd=ROOT, env={**os.environ, "HF_HUB_OFFLINE": "1"}) != 0:
            sys.exit(f"[{row}] evolve eval of the child {kids[0]} failed; see {run_dir}")
    return kids[0]


def test_scores(run_dir: Path, which: str, system_id: str | None = None) -> tuple[dict[str, float], dict[str, int]]:
    """``({task_id: score}, counts)`` of a run's ``which`` system (or ``system_id``) on test: the
    scores, and how many first replies start with SELECT and how many final queries ran."""
    from evolve.archive import Archive
    from evolve.types import LLMCall

    report = json.loads((run_dir / "report.json").read_text())
    sid = system_id or report[which]["system_id"]
    with Archive(run_dir, create=False) as arch:
        scores = arch.task_scores(sid, "test")
        trajs = arch.trajectories(system_id=sid, split="test", phase="eval")
    first = [next((s.output for s in t.steps if isinstance(s, LLMCall)), "") for t in trajs]
    counts = {
        "n": len(trajs),
        "select_first": sum(f.lstrip().lower().startswith("select") for f in first),
        "ran": sum(int((t.reward.components or {}).get("executes", 0) if t.reward else 0) for t in trajs),
    }
    return scores, counts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="runs/smollm_layers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", default="", help="comma-separated rows (default: all): " + ", ".join(ROWS))
    ap.add_argument("--rows-json", action="store_true", help="print the rows (task file, overrides) as JSON and stop")
    a = ap.parse_args()
    if a.rows_json:
        rows_json = {"task": str(TASK), "rows": {r: sets for r, (_, sets) in ROWS.items()}}
        print(json.dumps({**rows_json, "score_child": list(SCORE_CHILD), "against": AGAINST}))
        return
    from evolve._env import quiet_defaults

    quiet_defaults()
    from evolve.results.stats import paired

    rows = [r for r in a.only.split(",") if r] or list(ROWS)
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        sys.exit(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
    for r in list(rows):
        if r in AGAINST and AGAINST[r] not in rows:
            rows.insert(rows.index(r), AGAINST[r])
    out = Path(a.out)
    results = {}
    for row in rows:
        run_dir = run_row(row, a.seed, out)
        report = json.loads((run_dir / "report.json").read_text())
        if row in AGAINST:
            base, base_n = test_scores(out / f"seed{a.seed}" / AGAINST[row], "baseline")
            got, got_n = test_scores(run_dir, "baseline")
        else:
            base, base_n = test_scores(run_dir, "baseline")
            got, got_n = test_scores(run_dir, "best")
        p = paired(base, got)
        wall = (run_dir / "wall_seconds").read_text().strip() if (run_dir / "wall_seconds").is_file() else "?"
        results[row] = {
            "what": ROWS[row][0],
            "paired": p,
            "wall_seconds": wall,
            "baseline_counts": base_n,
            "counts": got_n,
            "budget_used": report.get("budget_used"),
            "best": report["best"]["system_id"],
            "val": {"baseline": report["baseline"]["val"]["score"], "best": report["best"]["val"]["score"]},
        }
        print(
            f"| {row} | {ROWS[row][0]} | {100 * p['a']:.1f}% | {100 * p['b']:.1f}% | "
            f"{100 * p['diff']:+.1f} (±{100 * (p['ci95'] or 0):.1f}) | {p['b_only']}/{p['a_only']} | "
            f"{base_n['select_first']} → {got_n['select_first']} | {base_n['ran']} → {got_n['ran']} | "
            f"{report['budget_used']['rollouts']} | {wall} s |",
            flush=True,
        )
        if row in ALSO and (out / f"seed{a.seed}" / ALSO[row][0] / "report.json").is_file():
            other_row, which = ALSO[row]
            other, _ = test_scores(out / f"seed{a.seed}" / other_row, which)
            q = results[row][f"against_{other_row}_{which}"] = paired(other, got)
            print(
                f"[{row}] against {other_row}'s {which}: {100 * q['a']:.1f}% → {100 * q['b']:.1f}%, "
                f"{100 * q['diff']:+.1f} (±{100 * (q['ci95'] or 0):.1f}), won/lost {q['b_only']}/{q['a_only']}",
                flush=True,
            )
        if row in SCORE_CHILD:
            # an operator that proposed nothing (GRPO's own dev check can refuse its step; no workflow beat
            # the root) leaves its parent
            child = child_on_test(row, a.seed, run_dir)
            scores, n = test_scores(run_dir, "", child) if child else (base, base_n)
            gen = report["generations"][-1]  # the one generation these rows run
            kept = (
                "none proposed"
                if not child
                else "kept"
                if child == report["best"]["system_id"]
                else "accepted, not the best"
                if gen["accepted"] == gen["children"]
                else "rejected"
            )
            c = paired(base, scores)
            results[row]["child"] = {"system_id": child, "outcome": kept, "paired": c, "counts": n, "scores": scores}
            print(
                f"[{row}] its child {(child or 'none')[:8]} ({kept}) on test: {100 * c['b']:.1f}%, "
                f"{100 * c['diff']:+.1f} (±{100 * (c['ci95'] or 0):.1f}), won/lost {c['b_only']}/{c['a_only']}, "
                f"SELECT first {n['select_first']}, ran {n['ran']}",
                flush=True,
            )
    path = out / f"seed{a.seed}" / "layers.json"
    old = json.loads(path.read_text()) if path.is_file() else {}
    merged = {**old, **results}
    for pair in PAIRS:
        if all("child" in merged.get(r, {}) for r in pair):
            star, grpo = (merged[r]["child"]["scores"] for r in pair)
            merged[pair_key(pair)] = paired(star, grpo)
    path.write_text(json.dumps(merged, indent=2))
    print(f"wrote {path}")
    summary(out)


def summary(out: Path) -> None:
    """GRPO's child against STaR's on test, for each pair of rows and each seed that has both, and
    the means (issue 40, item 3)."""
    docs = sorted((int(p.parent.name[4:]), json.loads(p.read_text())) for p in out.glob("seed*/layers.json"))
    for pair in PAIRS:
        key = pair_key(pair)
        seeds = [(s, d) for s, d in docs if key in d]
        if not seeds:
            continue
        print(
            f"\n{pair[0]} against {pair[1]}\n| seed | parent | STaR | GRPO | GRPO − STaR (paired 95%) | won/lost |\n"
            "|---|---|---|---|---|---|"
        )
        for s, d in seeds:
            h = d[key]
            what = {
                r: "" if d[r]["child"].get("outcome", "kept") == "kept" else f" ({d[r]['child']['outcome']})"
                for r in pair
            }
            print(
                f"| {s} | {100 * d[pair[0]]['paired']['a']:.1f}% | {100 * h['a']:.1f}%{what[pair[0]]} | "
                f"{100 * h['b']:.1f}%{what[pair[1]]} | {100 * h['diff']:+.1f} (±{100 * (h['ci95'] or 0):.1f}) | "
                f"{h['b_only']}/{h['a_only']} |"
            )
        mean = [
            sum(x) / len(seeds) for x in zip(*((d[pair[0]]["paired"]["a"], d[key]["a"], d[key]["b"]) for _, d in seeds))
        ]
        print(
            f"| mean of {len(seeds)} | {100 * mean[0]:.1f}% | {100 * mean[1]:.1f}% | {100 * mean[2]:.1f}% | "
            f"{100 * (mean[2] - mean[1]):+.1f} | |"
        )


if __name__ == "__main__":
    main()
