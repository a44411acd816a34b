"""Rollouts per second and per-rollout overhead of the thread, process and Ray runners, on the same
scripted agent whose one LLM call takes a fixed simulated latency (50 ms), at 1 to 256 concurrent
rollouts; and the local model's tokens per second through one shared Ray model server against one
model per rollout actor.

    python bench/runners_bench.py [--latency 0.05] [--rollouts 4] [--out bench/runners.json]

Each runner gets ``workers = concurrency`` and ``rollouts x concurrency`` jobs (at least 32), after
one warm-up batch (workers started, imports done). Overhead per rollout is the wall time per
rollout at that concurrency minus what a perfect runner would take (the latency / concurrency).
The Ray runs use a local two-node cluster on loopback (``ray start``, 2 CPUs per node, actors of
0.05 CPU so they can all be placed); each actor is a process, so the process and Ray runners stop
where this machine's memory would (see ``--max-process``, ``--max-ray``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
LATENCY_ENV = "EVOLVE_BENCH_LATENCY"


def slow_reply(messages, seed=None, temperature=None) -> str:
    """The scripted model with a fixed latency."""
    time.sleep(float(os.environ.get(LATENCY_ENV, "0.05")))
    return "ok"


def agent(task, ctx):
    from evolve.types import Message

    return ctx.llm("policy").complete([Message(role="user", content=str(task["id"]))]).text


def reward(task, output) -> float:
    return float(output == "ok")


def _jobs(n: int, tag: str):
    from evolve.runners import RolloutJob
    from evolve.types import ModelSpec, System

    system = System(models={"policy": ModelSpec(backend="scripted", name="slow",
                                                 params={"reply": "runners_bench:slow_reply"})})
    return [RolloutJob(key=f"{tag}-{i}", system=system, task={"id": f"{tag}-{i}"}, timeout=120) for i in range(n)]


def measure(runner, spec, concurrency: int, per: int, latency: float) -> dict:
    warm = list(runner.run(spec, _jobs(concurrency, "warm")))
    assert all(t.error is None for _, t in warm), [t.error for _, t in warm][:3]
    n = max(32, per * concurrency)
    t0 = time.perf_counter()
    got = list(runner.run(spec, _jobs(n, "run")))
    wall = time.perf_counter() - t0
    assert len(got) == n and all(t.error is None for _, t in got), [t.error for _, t in got if t.error][:3]
    per_rollout = wall / n
    return {"concurrency": concurrency, "rollouts": n, "wall_s": round(wall, 3),
            "rollouts_per_s": round(n / wall, 1),
            "overhead_ms": round(1000 * (per_rollout - latency / concurrency) * concurrency, 2)}


def start_cluster(port: int) -> str:
    ray = str(Path(sys.executable).with_name("ray"))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'bench'}",
           LATENCY_ENV: os.environ.get(LATENCY_ENV, "0.05")}
    subprocess.run([ray, "stop", "--force"], env=env, capture_output=True)
    for args in (["--head", f"--port={port}", "--node-ip-address=127.0.0.2", "--include-dashboard=false"],
                 [f"--address=127.0.0.2:{port}", "--node-ip-address=127.0.0.3"]):
        subprocess.run([ray, "start", *args, "--num-cpus=2", "--disable-usage-stats"], env=env, check=True,
                       capture_output=True)
    return f"127.0.0.2:{port}"


def tokens_per_second(address: str, workers: int, n: int) -> dict:
    """The local tiny model: one server actor shared by ``workers`` rollout actors, against each
    rollout actor loading its own copy."""
    import tempfile

    import evolve
    from evolve.archive import Archive
    from evolve.policy.tiny import CharTokenizer, TinyConfig, build_model
    from evolve.policy.weights import save_base
    from evolve.runners import RolloutJob, WorkerSpec
    from evolve.runners.ray_runner import RayRunner
    from evolve.types import LLMCall

    tmp = Path(tempfile.mkdtemp())
    cfg = TinyConfig(d_model=128, n_layers=2, n_heads=4, d_ff=256, max_len=256)
    save_base(build_model(cfg, seed=0), CharTokenizer(), cfg, tmp / "base.safetensors")
    task = {"name": "tps", "seed": 0, "agent": "tests.helpers.agents:one_step", "reward": "tests.helpers.agents:exact",
            "dataset": {"source": "tests.helpers.agents:vowel_dataset"}, "budget": {"generations": 0},
            "models": {"policy": {"backend": "local", "name": "tiny", "params": {
                "weights": str(tmp / "base.safetensors"), "temperature": 1.0, "max_tokens": 48}}},
            "runner": {"workers": 4}}
    evolve.run({**task, "agent": "tests.helpers.agents:vowel_agent", "reward": "tests.helpers.agents:vowel_reward"},
               out=tmp / "run")
    with Archive(tmp / "run", create=False) as a:
        system = a.get_system(a.current())
    spec = WorkerSpec(agent="tests.helpers.agents:one_step", reward="tests.helpers.agents:exact",
                      artifacts_root=str(tmp / "run" / "artifacts"), search_path=str(ROOT))
    out = {}
    for mode, server in (("one model per actor", None), ("shared server actor", {"num_cpus": 0.05})):
        with RayRunner(workers=workers, address=address, node_ip_address="127.0.0.2", num_cpus=0.05,
                       model_server=server) as r:
            list(r.run(spec, [RolloutJob(key=f"w{i}", system=system, task={"id": f"w{i}", "q": "warm"}, seed=i,
                                         temperature=1.0, timeout=300) for i in range(workers)]))
            jobs = [RolloutJob(key=f"t{i}", system=system, task={"id": f"t{i}", "q": f"question {i}"}, seed=i,
                               temperature=1.0, timeout=300) for i in range(n)]
            t0 = time.perf_counter()
            got = [t for _, t in r.run(spec, jobs)]
            wall = time.perf_counter() - t0
        toks = sum(len(s.token_ids or ()) for t in got for s in t.steps if isinstance(s, LLMCall))
        out[mode] = {"workers": workers, "rollouts": n, "tokens": toks, "wall_s": round(wall, 2),
                     "tokens_per_s": round(toks / wall, 1), "errors": sum(t.error is not None for t in got)}
        print(f"  {mode}: {out[mode]}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--rollouts", type=int, default=4, help="rollouts per worker in each measured batch")
    ap.add_argument("--levels", default="1,4,16,64,256")
    ap.add_argument("--max-process", type=int, default=64)
    ap.add_argument("--max-ray", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    os.environ[LATENCY_ENV] = str(args.latency)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    from evolve.runners import ProcessRunner, ThreadRunner, WorkerSpec
    from evolve.runners.ray_runner import RayRunner

    spec = WorkerSpec(agent="runners_bench:agent", reward="runners_bench:reward", artifacts_root="/tmp",
                      search_path=str(ROOT / "bench"))
    levels = [int(x) for x in args.levels.split(",")]
    from tests.helpers.upstream import free_port

    address = start_cluster(free_port())
    results: dict = {"latency_s": args.latency, "machine": f"{os.cpu_count()} cores", "runners": {}}
    try:
        for name in ("thread", "process", "ray"):
            rows = []
            for c in levels:
                if name == "process" and c > args.max_process or name == "ray" and c > args.max_ray:
                    continue
                if name == "thread":
                    runner = ThreadRunner(workers=c)
                elif name == "process":
                    runner = ProcessRunner(workers=c)
                else:
                    runner = RayRunner(workers=c, address=address, node_ip_address="127.0.0.2", num_cpus=0.05)
                try:
                    row = measure(runner, spec, c, args.rollouts, args.latency)
                finally:
                    runner.close()
                rows.append(row)
                print(f"{name:>8} x{c:<4} {row['rollouts_per_s']:>8.1f} rollouts/s   overhead "
                      f"{row['overhead_ms']:>8.2f} ms per rollout", flush=True)
            results["runners"][name] = rows
        print("local model, tokens per second:", flush=True)
        results["local_model"] = tokens_per_second(address, workers=4, n=64)
    finally:
        subprocess.run([str(Path(sys.executable).with_name("ray")), "stop", "--force"], capture_output=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
