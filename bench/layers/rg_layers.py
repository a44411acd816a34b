"""The rest of issue 52's item 3: few-shot demos, the topology vote, the curriculum against a fixed mix, and
the layers together, each from the SFT cold start of examples/reasoning_gym/task.yaml, on SmolLM2-135M-Instruct.

    .venv/bin/python bench/layers/rg_layers.py --out runs/rg --rows fewshot,curriculum --seeds 0,1,2
    .venv/bin/python bench/layers/rg_layers.py --out runs/rg --table        # read the finished rows back, print the table

Each row is one ``evolve run examples/reasoning_gym/task.yaml`` with the overrides in :data:`ROWS`; its run
folder is ``<out>/<row>_seed<N>`` (a finished row is read back, not rerun). Rows:

- ``star``: one generation of the task file's STaR on the fixed mix from the SFT cold start. Every other row is
  paired with its baseline (the seed's SFT system answering plainly), so it runs first when it is missing.
- ``fewshot``: the ``bootstrap_demos`` operator (DSPy's BootstrapFewShot): demos from the SFT system's own
  solved training tasks, 3 children with 2 or 4 demos picked at random or for diversity, judged on validation.
- ``topology_ct2``: the topology search over the world's palette (a vote over sampled replies, a reformat
  loop) from the single step (``agent: evolve.topology:agent``), the vote's samples sent at once, every
  sample drawn by CTranslate2 in int8 (issue 51: a vote costs 3 to 8 calls a task). Its own baseline is the
  same SFT'd single step sampled the same way; the pairing with the plain SFT system crosses engines.
- ``fixed2``: two generations of the task file's STaR on the fixed mix (the training split as it is). Its
  first generation is the ``star`` row's (``<out>/star_seed<N>``, STaR's one generation), continued with
  ``--resume`` and ``budget.generations=2`` when that row exists; a fresh run otherwise.
- ``curriculum``: the same two generations with ``engine.curriculum: {band: [0.2, 0.8], min_samples: 4}``.
- ``curriculum_all``: the same with ``evidence: all``: STaR's own samples count beside the minibatch when
  the curriculum judges each generator.
- ``together``: the SFT cold start, then STaR, with the Reflexion agent sampling STaR's tasks and answering
  validation and test (the layers that moved it, together).
- ``sft_vote``: the seed's SFT system as one agent with self-consistency at about the team's model calls (a
  vote over ``VOTE_N`` = 3 replies sampled at 0.7, sent at once; the untrained team makes 2 to 4 calls a task),
  scored without training (``budget.generations=0``); paired with the untrained team (``team``'s baseline).
- ``team`` (issue 63 item 4): examples/multi_agent/task.yaml on the same tasks, a solver and a verifier
  with an adapter each, a retry on rejection; each role's own cold start, then STaR on every role in turn
  (two generations: the solver's, then the verifier's). Its baseline is the team untrained (cold starts
  only); paired with ``fixed2``, the single agent trained alone at the same STaR budget, and with the
  plain SFT system; ``calls_a_task`` says what the team's calls cost.

Every row is paired on the 300 test tasks with the seed's SFT system answering plainly (the ``star`` row's
baseline, by task content: :mod:`evolve.results.pairing`), and a row whose agent or system differs from its
own baseline is paired with that too. The figures come from the runs' archives; writes
``<out>/layers_seed<N>.json``. A run that fails stops the script with its exit code.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from evolve.worlds.reasoning_gym.workflow import PALETTE, single_step

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "examples" / "reasoning_gym" / "task.yaml"
TEAM = ROOT / "examples" / "multi_agent" / "task.yaml"  # the same generators, splits and seeds: the same test tasks

FEWSHOT = (
    "{name: bootstrap_demos, params: {k_choices: [2, 4], strategies: [random, diverse], children: 3, "
    "max_rollouts: 200, temperature: 0.4}}"
)
VOTE_AT_ONCE = json.dumps(
    [{**it, "params": {**it["params"], "parallel": 8}} if it["name"] == "vote" else it for it in PALETTE]
)
TOPOLOGY = (
    "{name: topology, params: {max_evals: 6, search_tasks: 60, exploration: 0.5, cost_weight: 0.002, "
    f"children: 2, palette: {VOTE_AT_ONCE}}}}}"
)
CURRICULUM = "engine.curriculum={band: [0.2, 0.8], min_samples: 4}"
CURRICULUM_ALL = "engine.curriculum={band: [0.2, 0.8], min_samples: 4, evidence: all}"
FIXED = (
    "engine.curriculum=null"  # the fixed mix: the task file as these rows were measured (it now runs the curriculum)
)
REFLEXION = "agent=evolve.worlds.reasoning_gym:reflexion_agent"
VOTE_N = 3  # the untrained team calls the model 2 (solve, verify) to 4 (a retry, verified again) times a task


def voted(n: int, temperature: float = 0.7) -> dict:
    """The single step wrapped in self-consistency by the world's palette's own ``vote`` (the edit the topology
    search makes): ``n`` replies sampled at once, the most common answer wins (replies with no answer do not
    vote unless none has one)."""
    from evolve.topology import Workflow
    from evolve.topology.edits import enumerate_edits

    (vote,) = [it for it in PALETTE if it["name"] == "vote"]
    item = {**vote, "grid": {"n": [n], "temperature": [temperature]}, "params": {**vote["params"], "parallel": n}}
    ((_edit, wf),) = enumerate_edits(Workflow.from_json(single_step()), [item])
    return wf.to_json()


# row -> (what it changes, --set overrides); each starts from the seed's SFT cold start
ROWS: dict[str, tuple[str, list[str]]] = {
    "star": ("STaR, one generation, the fixed mix", ["budget.generations=1", FIXED]),
    "fewshot": (
        "few-shot demos bootstrapped from its own solved training tasks (bootstrap_demos)",
        [f"operators=[{FEWSHOT}]", "budget.generations=1", FIXED],
    ),
    "topology_ct2": (
        (
            "topology search from the single step: a vote over sampled replies, a reformat loop; "
            "sampled by CTranslate2 in int8 (issue 51), its own SFT single step the baseline"
        ),
        [
            f"operators=[{TOPOLOGY}]",
            "budget.generations=1",
            FIXED,
            "agent=evolve.topology:agent",
            f"workflow.graph={json.dumps(single_step())}",
            "models.policy.params.engine=ctranslate2",
            "models.policy.params.compute_type=int8",
        ],
    ),
    "fixed2": ("STaR, two generations, the fixed mix", ["budget.generations=2", FIXED]),
    "curriculum": ("STaR, two generations, the curriculum (band 20-80%)", ["budget.generations=2", CURRICULUM]),
    "curriculum_all": (
        "STaR, two generations, the curriculum judging on STaR's samples too (evidence: all)",
        ["budget.generations=2", CURRICULUM_ALL],
    ),
    "together": (
        "SFT + STaR + Reflexion (sampling STaR's tasks and answering test)",
        ["budget.generations=1", FIXED, REFLEXION],
    ),
    "sft_vote": (
        f"the SFT system voting over {VOTE_N} sampled replies (self-consistency at the untrained team's calls)",
        [
            "budget.generations=0",
            FIXED,
            "agent=evolve.topology:agent",
            f"workflow.graph={json.dumps(voted(VOTE_N))}",
        ],
    ),
    "team": ("a solver and a verifier, an adapter each, trained in turn by STaR (examples/multi_agent)", []),
}
TASKS = {"team": TEAM}  # a row run from another task file than TASK
CONTINUES = {"fixed2": "star"}  # a row that continues another row's finished run for more generations
VERSUS = {
    "curriculum": "fixed2",
    "curriculum_all": "curriculum",
    "team": "fixed2",
    "sft_vote": "team:baseline",
}  # a row's best also paired with another row's best (or, ``row:baseline``, its baseline)


def row_args(row: str, seed: int) -> list[str]:
    args = ["--set", f"seed={seed}"]
    for s in ROWS[row][1]:
        args += ["--set", s]
    return args


def run_row(row: str, seed: int, out: Path) -> Path:
    run_dir = out / f"{row}_seed{seed}"
    if (run_dir / "report.json").is_file() and (run_dir / "rg_layers.json").is_file():
        return run_dir
    task = TASKS.get(row, TASK)
    cmd = [sys.executable, "-m", "evolve", "run", str(task), "--out", str(run_dir), *row_args(row, seed)]
    start = out / f"{CONTINUES.get(row, '')}_seed{seed}"
    if not run_dir.exists() and row in CONTINUES and (start / "report.json").is_file():
        shutil.copytree(start, run_dir, symlinks=True)
        (run_dir / "report.json").unlink()
        print(f"{row} seed {seed}: continuing a copy of {start}", flush=True)
    if run_dir.exists():
        cmd.append("--resume")
    t0, c0 = time.time(), os.times()
    with open(out / f"{row}_seed{seed}.log", "a") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    c1 = os.times()
    if rc:
        sys.exit(f"{row} seed {seed} failed with exit code {rc}; see {out / f'{row}_seed{seed}.log'}")
    (run_dir / "rg_layers.json").write_text(
        json.dumps(
            {
                "wall_s": round(time.time() - t0, 1),
                "cpu_s": round(c1.children_user + c1.children_system - c0.children_user - c0.children_system, 1),
            }
        )
    )
    return run_dir


def measure(row: str, seed: int, out: Path) -> dict:
    from evolve.archive import Archive
    from evolve.results.pairing import same_tasks
    from evolve.results.stats import describe, paired

    run_dir = out / f"{row}_seed{seed}"
    rep = json.loads((run_dir / "report.json").read_text())
    spent = json.loads((run_dir / "rg_layers.json").read_text())
    res = {
        "row": row,
        "seed": seed,
        "baseline": rep["baseline"],
        "best": rep["best"],
        **spent,
        "budget_used": rep["budget_used"],
        "own": describe(rep["paired"]["test"]) if rep.get("paired") else None,
        "curriculum": rep.get("curriculum"),
    }
    plain = out / f"star_seed{seed}"  # the seed's SFT system answering plainly: the star row's baseline
    with Archive(run_dir, create=False) as a, Archive(plain, create=False) as p:
        sft_id = json.loads((plain / "report.json").read_text())["baseline"]["system_id"]
        best = a.task_scores(rep["best"]["system_id"], "test")
        sft = p.task_scores(sft_id, "test")
        ids, why = same_tasks(p, a, "test", set(best) & set(sft))
        if why:
            raise SystemExit(f"{row} seed {seed}: {why}")
        c = paired({t: sft[t] for t in ids}, {t: best[t] for t in ids})
        res["vs_sft"] = {"n": len(ids), "sft": c["a"], "after": c["b"], "gain": describe(c), "paired": c}
        versus, _, which = VERSUS.get(row, "").partition(":")
        other = out / f"{versus}_seed{seed}"
        if row in VERSUS and (other / "report.json").is_file():
            with Archive(other, create=False) as o:
                theirs_id = json.loads((other / "report.json").read_text())[which or "best"]["system_id"]
                theirs = o.task_scores(theirs_id, "test")
                ids, why = same_tasks(o, a, "test", set(best) & set(theirs))
            if why:
                raise SystemExit(f"{row} seed {seed} against {VERSUS[row]}: {why}")
            c = paired({t: theirs[t] for t in ids}, {t: best[t] for t in ids})
            res["vs_row"] = {"row": VERSUS[row], "n": len(ids), "gain": describe(c), "paired": c}
    res["calls_a_task"] = calls_a_task(run_dir, rep["best"]["system_id"])
    if row in TASKS:
        res["judge"] = judged(run_dir, {w: rep[w]["system_id"] for w in ("baseline", "best")}, seed, TASKS[row])
    return res


def judged(run_dir: Path, systems: dict[str, str], seed: int, task_file: Path, split: str = "test") -> dict:
    """For each named system (name -> id): how the team's verifier judged its rollouts on ``split``
    (team.judge_rates: its accept rate on right and on wrong replies) and what the retries did
    (team.retry_outcomes), with the tasks remade once from ``task_file`` at ``seed``."""
    from evolve.archive import Archive
    from evolve.task.data import load_splits
    from evolve.task.taskfile import load_task

    if str(TEAM.parent) not in sys.path:
        sys.path.insert(0, str(TEAM.parent))  # the example's own folder, a constant of this script
    import team

    cfg, base = load_task(task_file, [f"seed={seed}"])
    tasks = {t["id"]: t for t in load_splits(cfg.dataset, base, seed)[split]}
    out: dict = {}
    with Archive(run_dir, create=False) as a:
        for name, system_id in systems.items():
            trajs = a.trajectories(system_id, split, "eval")
            rates = team.judge_rates(trajs, tasks)
            out[name] = None if rates is None else {**rates, "retries": team.retry_outcomes(trajs, tasks)}
    return out


def calls_a_task(run_dir: Path, system_id: str) -> float:
    """Model calls per test task of ``system_id`` (its scoring rollouts), read from the archive read-only."""
    from evolve.ui.run import RunView

    run = RunView(run_dir, "bench")  # read-only, leaving nothing beside a finished run's archive
    try:
        ((calls,),) = run.sql(
            "SELECT AVG(calls) FROM trajectories WHERE system_id = ? AND split = 'test'", (system_id,)
        )
    finally:
        run.close()
    return round(calls or 0.0, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "rg")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--table", action="store_true", help="only read finished rows back")
    ap.add_argument("--rows-json", action="store_true", help="print each row's task file and overrides as JSON, stop")
    a = ap.parse_args()
    if a.rows_json:
        rows_json = {r: {"task": str(TASKS.get(r, TASK)), "sets": sets} for r, (_, sets) in ROWS.items()}
        print(json.dumps({"rows": rows_json, "continues": CONTINUES, "versus": VERSUS}))
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    os.environ.setdefault("ANONYMIZED_TELEMETRY", "False")
    a.out.mkdir(parents=True, exist_ok=True)
    rows = [r.strip() for r in a.rows.split(",") if r.strip()]
    unknown = [r for r in rows if r not in ROWS]
    if unknown:
        sys.exit(f"unknown row(s) {unknown}; choose from {sorted(ROWS)}")
    seeds = [int(s) for s in a.seeds.split(",")]
    for seed in seeds:
        if not (a.out / f"star_seed{seed}" / "report.json").is_file():
            if a.table:
                sys.exit(f"{a.out / f'star_seed{seed}'} is missing: run the star row first (--rows star)")
            rows = ["star", *(r for r in rows if r != "star")]  # every row is paired with the star row's baseline
    for row in rows:
        for seed in seeds:
            if not a.table:
                run_row(row, seed, a.out)
            if (a.out / f"{row}_seed{seed}" / "rg_layers.json").is_file():
                res = measure(row, seed, a.out)
                f = a.out / f"layers_seed{seed}.json"
                doc = json.loads(f.read_text()) if f.is_file() else {}
                doc[row] = res
                f.write_text(json.dumps(doc, indent=1))
                print(
                    f"| {row} | {seed} | {100 * res['vs_sft']['sft']:.1f}% | {100 * res['vs_sft']['after']:.1f}% "
                    f"| {res['vs_sft']['gain']} | own: {res['own']} | {res['best']['system_id'][:8]} "
                    f"| {res['calls_a_task']} calls | {res['wall_s']:.0f} s |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
