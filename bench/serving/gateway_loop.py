"""The whole loop on this machine: an SQL agent app that knows nothing of evolvekit
(examples/gateway_sql/app.py, only the `openai` client and a base URL) serves simulated users
through `evolve gateway` over the SQL world's cold-started local model; the users' feedback is the
SQL world's execution check; an offline job (`from_traces`) evolves the system from the recorded
traffic; the gateway then serves the evolved system. Served accuracy on held-out users, before and
after, with the paired interval.

    python bench/serving/gateway_loop.py [--out DIR] [--traffic 1500] [--heldout 500] [--temperature 0.8]

The cold start is the default task's (examples/sql_agent/task.yaml: the same SFT base, cached in
EVOLVE_CACHE_DIR). Traffic users ask training-split questions and the app samples at
--temperature; held-out users ask test-split questions (databases never seen in training), at
temperature 0, the same users before and after.
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

ROOT = Path(__file__).resolve().parents[2]
GOLD_ENV = "EVOLVE_BENCH_GOLD"


def verify(task: dict, output) -> object:
    """The simulated users' check of a replayed answer (the execution match against what the user
    wanted, which the simulator knows)."""
    from evolve.worlds.sql import reward

    gold = json.loads(Path(os.environ[GOLD_ENV]).read_text())[task["session_id"]]
    text = output if isinstance(output, str) else (output or {}).get("text") or ""
    return reward(gold, {"sql": text})


def job_inputs(serve_run: Path, job: Path):
    """(the served system's id, its policy spec, the folder with copies of its base weights and
    cold-start demos): what an offline job on the traffic trains from."""
    from evolve.archive import Archive
    from evolve.types import ArtifactRef

    with Archive(serve_run, create=False) as ar:
        base_id = ar.current()
        spec = ar.get_system(base_id).models["policy"]
        job.mkdir(exist_ok=True)
        shutil.copyfile(ar.artifacts.path(spec.base), job / "base.st")
        if spec.params.get("sft_examples"):
            shutil.copyfile(ar.artifacts.path(ArtifactRef(**spec.params["sft_examples"])), job / "sft_examples.json")
    return base_id, spec, job


def app(base_url: str, users: list[dict], temperature: float) -> list[dict]:
    inp = "".join(json.dumps(u) + "\n" for u in users)
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "gateway_sql" / "app.py"),
            "--base-url",
            base_url,
            "--temperature",
            str(temperature),
        ],
        input=inp,
        capture_output=True,
        text=True,
        check=True,
    )
    return [json.loads(line) for line in out.stdout.splitlines()]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--traffic", type=int, default=1500)
    ap.add_argument("--heldout", type=int, default=500)
    ap.add_argument("--temperature", type=float, default=0.8)
    args = ap.parse_args()
    import random

    import yaml

    import evolve
    from evolve.archive import Archive
    from evolve.gateway import GatewayServer
    from evolve.gateway.config import GatewayConfig
    from evolve.results.stats import describe, paired
    from evolve.worlds.sql import dataset, reward
    from evolve.worlds.sql.questions import prompt_text

    out = args.out or Path(f"/tmp/gateway-loop-{int(time.time())}")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    task = yaml.safe_load((ROOT / "examples" / "sql_agent" / "task.yaml").read_text())
    task.update(operators=[], budget={"generations": 0})
    serve_run = out / "serve"
    if not (serve_run / "archive.sqlite").exists():
        evolve.run(task, base_dir=ROOT / "examples" / "sql_agent", out=serve_run)
    base_id, spec, job = job_inputs(serve_run, out / "job")
    print(f"cold start: system {base_id[:12]} ({time.time() - t0:.0f} s)", flush=True)

    splits = dataset(seed=0, **task["dataset"]["params"])
    rng = random.Random(1)
    traffic = rng.sample(splits["train"], args.traffic)
    heldout = splits["test"][: args.heldout]
    gold = {f"u{i}": t for i, t in enumerate(traffic)}
    (out / "gold.json").write_text(json.dumps(gold, default=str))
    os.environ[GOLD_ENV] = str(out / "gold.json")

    cfg = GatewayConfig.model_validate(
        {
            "port": 0,
            "store": out / "traces",
            "routes": [{"name": "sql", "match": ["sql-agent"], "local": {"run": serve_run, "poll": 0.1}}],
        }
    )
    with GatewayServer(cfg) as gw:
        store = gw.gateway.store

        def held_out(tag: str) -> tuple[dict, str]:
            users = [{"user": f"{tag}-{t['id']}", "prompt": prompt_text(t["schema"], t["question"])} for t in heldout]
            answers = app(gw.url, users, 0.0)
            systems = {a["system"] for a in answers}
            return {t["id"]: reward(t, {"sql": a["sql"]}).score for t, a in zip(heldout, answers)}, ",".join(
                s[:12] for s in systems
            )

        t1 = time.time()
        before, sys_before = held_out("before")
        print(
            f"held-out before: {100 * sum(before.values()) / len(before):.1f}% on {len(before)} users "
            f"(system {sys_before}, {time.time() - t1:.0f} s)",
            flush=True,
        )
        t1 = time.time()
        users = [{"user": u, "prompt": prompt_text(t["schema"], t["question"])} for u, t in gold.items()]
        answers = app(gw.url, users, args.temperature)
        for a in answers:
            r = reward(gold[a["user"]], {"sql": a["sql"]})
            store.feedback(session_id=a["user"], score=r.score, text=r.feedback, id=f"check-{a['user']}")
        served = sum(store.feedback_of(session_id=a["user"])[0].score for a in answers) / len(answers)
        print(
            f"traffic: {len(answers)} sessions at T={args.temperature:g}, {100 * served:.1f}% correct "
            f"({time.time() - t1:.0f} s)",
            flush=True,
        )

        t1 = time.time()
        job_task = {
            "name": "from-traffic",
            "seed": 0,
            "agent": "evolve.gateway.dataset:replay",
            "reward": "gateway_loop:verify",
            "models": {
                "policy": {
                    "backend": "local",
                    "name": spec.name,
                    "params": {"weights": str(job / "base.st"), "temperature": 0.0, "max_tokens": 96},
                }
            },
            "dataset": {
                "source": "evolve.gateway.dataset:sessions",
                "params": {"store": str(out / "traces"), "feedback": "scored", "val": 0.15},
            },
            "operators": [
                {
                    "name": "from_traces",
                    "params": {"min_score": 1.0, "dedupe": False, "replay": 0.5, "r": 16, "lr": 0.003, "epochs": 3},
                }
            ],
            "budget": {"generations": 1},
            "engine": {"acceptance": "val_only"},
        }
        report = evolve.run(job_task, base_dir=ROOT / "bench" / "serving", out=out / "job-run")
        with Archive(out / "job-run", create=False) as jar:
            kids = [r for r in jar.records() if r.operator == "from_traces"]
            accepted = jar.current() in {k.id for k in kids}
            if not kids:
                raise SystemExit("the offline job proposed no system (too few successful sessions?)")
            child = jar.get_system(kids[0].id)
            adapter = jar.artifacts.path(child.models["policy"].adapter)
            with Archive(serve_run, create=False) as ar:
                ar.artifacts.put_file(adapter, "adapter")
                ar.add_system(child, parents=[base_id], operator="from_traces")
                ar.set_current(child.id, reason="promote")
        print(
            f"offline job: child {child.id[:12]} from {kids[0].info.get('examples')} recorded turns, "
            f"{'accepted' if accepted else 'not accepted'} by the job's val ({time.time() - t1:.0f} s)",
            flush=True,
        )
        deadline = time.time() + 60
        while gw.gateway.routes[0].current_system() != child.id and time.time() < deadline:
            time.sleep(0.05)
        after, sys_after = held_out("after")
        print(f"held-out after: {100 * sum(after.values()) / len(after):.1f}% (system {sys_after})", flush=True)
        c = paired(before, after)
        print(f"served accuracy, evolved against cold start: {describe(c)}")
        print(
            f"trace store: {store.counts()}, integrity problems: {len(store.integrity())}; "
            f"job report val: {json.dumps(report.get('best', {}).get('val', {}) if isinstance(report, dict) else '')[:200]}"
        )
    print(f"total {time.time() - t0:.0f} s; everything is in {out}")


if __name__ == "__main__":
    main()
