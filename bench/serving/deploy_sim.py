"""Safe deployment on the gateway's end-to-end SQL loop: over a stream of simulated sessions, the
candidates of a real operator (``from_traces`` on each round's recorded traffic) and injected bad
ones go through ``evolve promote`` (the paired regression gate) and a canary on live traffic; how
many bad ones reach ``active``, how many good ones are promoted, how long each took in sessions,
and the served accuracy over time (a PNG).

    python bench/serving/deploy_sim.py [--out DIR] [--rounds 6] [--round-sessions 1200]

The app is examples/gateway_sql/app.py (only the `openai` client), the model the default task's
cold-started local model behind a `local` gateway route; each user's feedback is the SQL world's
execution check, sent to the gateway's /v1/feedback (where the canary's test runs). Traffic users
ask training-split questions at T=0.8. A candidate is "good" or "bad" by its paired difference
from the system active when it was proposed, on 400 test-split tasks (databases never seen in
training), measured after the run and never shown to the deployment.

Injected bad candidates: a real child's LoRA update negated (x -2, clearly worse) and one negated
at x -0.4 (mildly worse).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "serving"))

from gateway_loop import GOLD_ENV, app, job_inputs  # noqa: E402  (verify is named by the job's task file)

DEPLOY = {
    "regression": {"tasks": "val", "limit": 200, "min_tasks": 100, "risk": 0.05, "margin": 0.02},
    "canary": {"share": 0.5, "min_sessions": 150, "max_sessions": 2500, "margin": 0.05, "alpha": 0.05},
}


def post(url: str, body: dict) -> int:
    import urllib.request

    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status


def scaled_adapter(ar, system, factor: float, tmp: Path):
    """The system with its LoRA update scaled by ``factor`` (negative: the update reversed)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    spec = system.models["policy"]
    src = str(ar.artifacts.path(spec.adapter))
    with safe_open(src, "pt") as f:
        meta = f.metadata()  # the adapter's config, as evolvekit wrote it
    tensors = load_file(src)
    out = {k: (v * factor if "lora_B" in k else v) for k, v in tensors.items()}
    path = tmp / f"adapter-x{factor:g}.safetensors"
    save_file(out, str(path), metadata=meta)
    ref = ar.artifacts.put_file(path, "adapter")
    models = {k: v.model_dump(mode="json") for k, v in system.models.items()}
    models["policy"]["adapter"] = ref.model_dump(mode="json")
    return system.replace(models=models, prompts={**system.prompts, "injected": f"x{factor:g}"})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--round-sessions", type=int, default=1000)
    ap.add_argument("--chunk", type=int, default=150, help="users per app run (feedback is sent after each)")
    ap.add_argument("--truth", type=int, default=400, help="test-split tasks that decide good and bad, afterwards")
    args = ap.parse_args()
    import yaml

    import evolve
    from evolve.archive import Archive
    from evolve.deploy import Deployment
    from evolve.deploy.manage import promote, status
    from evolve.gateway import GatewayServer
    from evolve.gateway.config import GatewayConfig
    from evolve.worlds.sql import dataset, reward
    from evolve.worlds.sql.questions import prompt_text

    out = args.out or Path(f"/tmp/deploy-sim-{int(time.time())}")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    task = yaml.safe_load((ROOT / "examples" / "sql_agent" / "task.yaml").read_text())
    task.update(operators=[], budget={"generations": 0}, deploy=DEPLOY, engine={"val_size": 200})
    task_file = out / "serve-task.yaml"
    task_file.write_text(yaml.safe_dump(task))
    serve_run = out / "serve"
    if not (serve_run / "archive.sqlite").exists():
        evolve.run(str(task_file), out=serve_run)
    base_id, spec, job = job_inputs(serve_run, out / "job")
    print(f"cold start: system {base_id[:12]} ({time.time() - t0:.0f} s)", flush=True)

    splits = dataset(seed=0, **task["dataset"]["params"])
    rng = random.Random(7)
    gold: dict[str, dict] = {}
    os.environ[GOLD_ENV] = str(out / "gold.json")
    timeline: list[dict] = []  # one row per served session
    candidates: list[dict] = []
    events: list[dict] = []

    cfg = GatewayConfig.model_validate(
        {
            "port": 0,
            "store": out / "traces",
            "routes": [{"name": "sql", "match": ["sql-agent"], "local": {"run": serve_run, "poll": 0.1}}],
        }
    )
    with GatewayServer(cfg) as gw:
        store = gw.gateway.store

        def serve(n: int, tag: str) -> list[dict]:
            rows = []
            for start in range(0, n, args.chunk):
                users = []
                for i in range(start, min(n, start + args.chunk)):
                    t = rng.choice(splits["train"])
                    u = f"{tag}-{i}"
                    gold[u] = t
                    users.append({"user": u, "prompt": prompt_text(t["schema"], t["question"])})
                for a in app(gw.url, users, 0.8):
                    r = reward(gold[a["user"]], {"sql": a["sql"]})
                    post(
                        f"{gw.url}/feedback",
                        {"session_id": a["user"], "score": r.score, "text": r.feedback, "id": f"check-{a['user']}"},
                    )
                    row = {"i": len(timeline), "user": a["user"], "system": a["system"], "score": r.score}
                    timeline.append(row)
                    rows.append(row)
                with Archive(serve_run, create=False) as ar:
                    for e in Deployment(ar).events():
                        if e["seq"] > (events[-1]["seq"] if events else 0):
                            events.append({**e, "at_session": len(timeline)})
                            print(
                                f"  [{len(timeline)}] {e['system'][:12]} {e['from']} -> {e['to']} ({e['by']}): "
                                f"{str(e['why'])[:160]}",
                                flush=True,
                            )
            return rows

        def job_child(rnd: int, rows: list[dict]):
            """from_traces on this round's sessions: the real operator's candidate (or None)."""
            job_task = {
                "name": f"round-{rnd}",
                "seed": rnd,
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
                "engine": {"acceptance": "val_only", "min_gain": -1.0},
            }
            run = out / f"job-{rnd}"
            (out / "gold.json").write_text(json.dumps(gold, default=str))  # what the job's verify reads
            evolve.run(job_task, base_dir=ROOT / "bench" / "serving", out=run)
            with Archive(run, create=False) as jar:
                kids = [r for r in jar.records() if r.operator == "from_traces"]
                if not kids:
                    return None
                child = jar.get_system(kids[0].id)
                adapter = jar.artifacts.path(child.models["policy"].adapter)
                with Archive(serve_run, create=False) as ar:
                    ar.artifacts.put_file(adapter, "adapter")
                    ar.add_system(child, parents=[base_id], operator="from_traces", rationale=f"round {rnd}")
            return child

        last_real = None
        queue: list[tuple[object, str, int]] = []  # candidates waiting for the deployment to be free

        def busy() -> bool:
            with Archive(serve_run, create=False) as ar:
                return Deployment(ar).canary() is not None

        for rnd in range(args.rounds):
            t1 = time.time()
            rows = serve(args.round_sessions, f"r{rnd}")
            acc = sum(r["score"] for r in rows) / len(rows)
            print(f"round {rnd}: {len(rows)} sessions, {100 * acc:.1f}% correct ({time.time() - t1:.0f} s)", flush=True)
            if rnd % 2 == 1 and last_real is not None:  # an injected bad one
                factor = -2.0 if rnd % 4 == 1 else -0.4
                with Archive(serve_run, create=False) as ar:
                    cand = scaled_adapter(ar, last_real, factor, out)
                    ar.add_system(cand, parents=[last_real.id], operator="injected", rationale=f"LoRA x{factor:g}")
                queue.append((cand, f"injected x{factor:g}", rnd))
            elif not any(k == "from_traces" for _, k, _ in queue):
                cand = job_child(rnd, rows)
                if cand is None:
                    print("  the job proposed nothing", flush=True)
                else:
                    last_real = cand
                    queue.append((cand, "from_traces", rnd))
            while queue and not busy():
                cand, kind, r0 = queue.pop(0)
                t1 = time.time()
                with Archive(serve_run, create=False) as ar:
                    active = ar.current()
                    Deployment(ar).propose(cand.id, by=kind, why=f"round {r0}")
                res = promote(task_file, serve_run, system=cand.id, by="deploy_sim")
                candidates.append(
                    {
                        "system": cand.id,
                        "kind": kind,
                        "round": r0,
                        "active_then": active,
                        "proposed_at": len(timeline),
                        "gate": res["state"],
                        "gates": [{k: g[k] for k in ("name", "passed", "n", "diff", "lower")} for g in res["gates"]],
                    }
                )
                print(
                    f"  candidate {cand.id[:12]} ({kind}): {res['state']} — {res['message'][:200]} "
                    f"({time.time() - t1:.0f} s)",
                    flush=True,
                )
        extra = 0  # let a canary still under way finish
        while busy() and extra < 3:
            serve(args.round_sessions, f"tail{extra}")
            extra += 1
        st = status(serve_run, traces=out / "traces")
        integrity = store.integrity()

    # the truth, afterwards: each candidate against the system active when it was proposed
    from evolve.results.stats import paired
    from evolve.scoring.session import Session
    from evolve.task.taskfile import load_task

    cfg_t, base_dir = load_task(task_file)
    session = Session(cfg_t, base_dir=base_dir, run_dir=serve_run, resume=True, evaluating=True, budgeted=False)
    truth_tasks = session.tasks("test")[: args.truth]

    def scores(sid: str) -> dict[str, float]:
        with Archive(serve_run, create=False) as ar:
            system = ar.get_system(sid)
        with session.outside_budget():
            trajs = session.rollouts(system, truth_tasks, split="test", tag="truth", description=f"truth {sid[:8]}")
        return {t.task_id: t.score for t in trajs}

    for c in candidates:
        p = paired(scores(c["active_then"]), scores(c["system"]))
        c["truth"] = {"diff": p["diff"], "ci95": p["ci95"], "n": p["n"]}
        c["verdict"] = (
            "good" if p["diff"] - (p["ci95"] or 0) > 0 else "bad" if p["diff"] + (p["ci95"] or 0) < 0 else ("neutral")
        )
        c["final"] = st["states"].get(c["system"])
        trail = [e for e in events if e["system"] == c["system"]]
        end = next((e for e in trail if e["to"] in ("active", "rolled_back", "rejected")), None)
        c["decided_at"] = end["at_session"] if end else None
        c["sessions_to_decide"] = (end["at_session"] - c["proposed_at"]) if end else None
        c["canary_sessions"] = (end.get("evidence") or {}).get("candidate_sessions") if end else None
    session.close()
    bad_active = [c for c in candidates if c["verdict"] == "bad" and c["final"] in ("active", "retired")]
    good_promoted = [c for c in candidates if c["verdict"] == "good" and c["final"] in ("active", "retired")]
    summary = {
        "sessions": len(timeline),
        "candidates": candidates,
        "bad": sum(c["verdict"] == "bad" for c in candidates),
        "bad_reached_active": len(bad_active),
        "good": sum(c["verdict"] == "good" for c in candidates),
        "good_promoted": len(good_promoted),
        "problems": st["problems"],
        "trace_integrity": len(integrity),
        "served_accuracy": sum(r["score"] for r in timeline) / len(timeline),
        "seconds": round(time.time() - t0),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    (out / "timeline.json").write_text(json.dumps(timeline))
    _plot(timeline, events, out / "served_accuracy.png")
    print(json.dumps({k: v for k, v in summary.items() if k != "candidates"}, indent=1))
    for c in candidates:
        print(
            f"{c['system'][:12]} {c['kind']:>14}: truth {100 * c['truth']['diff']:+.1f} ±{100 * (c['truth']['ci95'] or 0):.1f}"
            f" ({c['verdict']}); gate {c['gate']}; final {c['final']}; decided after "
            f"{c['sessions_to_decide']} sessions (canary arm {c['canary_sessions']})"
        )
    print(f"total {time.time() - t0:.0f} s; everything is in {out}")


def _plot(timeline: list[dict], events: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    w = 300
    xs, ys = [], []
    for i in range(w, len(timeline) + 1, 25):
        xs.append(i)
        ys.append(100 * sum(r["score"] for r in timeline[i - w : i]) / w)
    fig, ax = plt.subplots(figsize=(9, 3.8))
    ax.plot(xs, ys, lw=1.3, color="k", label=f"served accuracy (last {w} sessions)")
    colors = {"canary": "tab:orange", "active": "tab:green", "rolled_back": "tab:red", "rejected": "tab:purple"}
    seen = set()
    for e in events:
        if e["to"] in colors and e["by"] not in ("engine",):
            lab = e["to"] if e["to"] not in seen else None
            seen.add(e["to"])
            ax.axvline(e["at_session"], color=colors[e["to"]], ls="--", lw=1, label=lab)
    ax.set_xlabel("session")
    ax.set_ylabel("correct (%)")
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("SQL agent behind evolve gateway: candidates through gates and canary")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
