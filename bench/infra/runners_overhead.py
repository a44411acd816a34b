"""Rollouts per second and per-rollout overhead of the thread, process and Ray runners, on the same
scripted agent whose one LLM call takes a fixed simulated latency (50 ms), at 1 to 256 concurrent
rollouts; and the local model's tokens per second through one shared Ray model server against one
model per rollout actor.

    python bench/infra/runners_overhead.py [--latency 0.05] [--rollouts 4] [--levels 1,4,16,64,256] [--out FILE]

Each runner gets ``workers = concurrency`` and ``rollouts x concurrency`` jobs (at least 32), after
warm-up batches until every worker has answered (workers started, imports done). Overhead per
rollout is the wall time per rollout at that concurrency minus what a perfect runner would take
(the latency / concurrency).
The Ray runs use a local two-node cluster on loopback (``ray start``, 2 CPUs per node; each actor
asks for at most 0.05 CPU, less when there are many, so that all can be placed). For the local
model, the rollout actors run on the second node with Ray's defaults (one torch thread each: a
fraction of a CPU) and the shared server alone on the head with 2 CPUs (two torch threads).

Each level measures ``--repeats`` batches and keeps the median (the machine is shared). Process
and Ray workers are processes: the memory they take (the PSS of the worker processes with the
workers started, per worker) is measured at each level, and a level whose projected memory would
leave less than ``--keep-free`` GiB available is not run; the results say so, with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
LATENCY_ENV = "EVOLVE_BENCH_LATENCY"
START_LIMIT = 1800.0  # seconds for a level's workers to come up


def slow_reply(messages, seed=None, temperature=None) -> str:
    """The scripted model with a fixed latency."""
    time.sleep(float(os.environ.get(LATENCY_ENV, "0.05")))
    return "ok"


def agent(task, ctx):
    from evolve.types import Message

    if task.get("pid"):  # the warm-up asks which worker ran it
        return os.getpid()
    return ctx.llm("policy").complete([Message(role="user", content=str(task["id"]))]).text


def reward(task, output) -> float:
    return float(output == "ok")


def _jobs(n: int, tag: str, pid: bool = False):
    from evolve.runners import RolloutJob
    from evolve.types import ModelSpec, System

    system = System(
        models={"policy": ModelSpec(backend="scripted", name="slow", params={"reply": "runners_overhead:slow_reply"})}
    )
    return [
        RolloutJob(key=f"{tag}-{i}", system=system, task={"id": f"{tag}-{i}", "pid": pid}, timeout=120)
        for i in range(n)
    ]


def warm(runner, name: str, spec, concurrency: int, limit: float = START_LIMIT) -> float:
    """Run warm-up batches until every one of the ``concurrency`` workers has answered (a Ray
    actor that is still starting gets no job, so one batch is not enough); seconds it took."""
    t0 = time.perf_counter()
    for k in range(10**6):
        got = list(runner.run(spec, _jobs(concurrency, f"warm{k}", pid=True)))
        assert all(t.error is None for _, t in got), [t.error for _, t in got][:3]
        up = len({t.output for _, t in got})
        if name == "thread" or up >= concurrency:
            break
        if time.perf_counter() - t0 > limit:
            raise RuntimeError(f"{name} x{concurrency}: only {up} workers answered after {limit:g} s")
        time.sleep(1.0)
    return time.perf_counter() - t0


def available_mib() -> float:
    """The machine's MemAvailable, in MiB."""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def worker_pss_mib(name: str) -> tuple[float, int]:
    """(PSS in MiB, how many) of the runner's worker processes: the process runner's are this
    process's descendants (its forkserver included), the Ray runner's the ``ray::RayWorker``
    actor processes. PSS counts each shared page once across the processes that share it."""
    import psutil

    if name == "process":
        procs = psutil.Process().children(recursive=True)
    elif name in ("ray", "ray+server"):
        kinds = ("ray::RayWorker", "ray::ModelServer") if name == "ray+server" else ("ray::RayWorker",)
        procs = [p for p in psutil.process_iter(["cmdline"]) if (p.info["cmdline"] or [""])[0].startswith(kinds)]
    else:
        return 0.0, 0
    total, n = 0.0, 0
    for p in procs:
        try:
            total += p.memory_full_info().pss / 2**20
            n += 1
        except psutil.Error:
            pass
    return total, n


def wait_gone(limit: float = 300.0) -> float:
    """Wait until the last level's worker processes (process pool, Ray actors) have exited, so
    that the next level does not share the cores with them; seconds waited."""
    import psutil

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < limit:
        left = [
            p
            for p in psutil.process_iter(["cmdline"])
            if (p.info["cmdline"] or [""])[0].startswith(("ray::RayWorker", "ray::ModelServer"))
        ]
        for child in psutil.Process().children():
            try:  # multiprocessing's forkserver and resource tracker live as long as we do: their children count
                helper = any(k in " ".join(child.cmdline()) for k in ("forkserver", "resource_tracker"))
                left += child.children(recursive=True) if helper else [child]
            except psutil.Error:
                pass
        if not left:
            break
        time.sleep(1.0)
    return time.perf_counter() - t0


def measure(runner, name: str, spec, concurrency: int, per: int, latency: float, repeats: int) -> dict:
    start_s = warm(runner, name, spec, concurrency)
    pss, procs = worker_pss_mib(name)  # the workers, all started
    n = max(32, per * concurrency)
    walls = []
    for k in range(repeats):
        t0 = time.perf_counter()
        got = list(runner.run(spec, _jobs(n, f"run{k}")))
        walls.append(time.perf_counter() - t0)
        assert len(got) == n and all(t.error is None for _, t in got), [t.error for _, t in got if t.error][:3]
    wall = sorted(walls)[len(walls) // 2]  # the median batch
    per_rollout = wall / n
    return {
        "concurrency": concurrency,
        "rollouts": n,
        "repeats": repeats,
        "wall_s": round(wall, 3),
        "walls_s": [round(w, 3) for w in walls],
        "rollouts_per_s": round(n / wall, 1),
        "overhead_ms": round(1000 * (per_rollout - latency / concurrency) * concurrency, 2),
        "start_s": round(start_s, 2),
        "worker_processes": procs,
        "memory_pss_mib": round(pss),
        "memory_per_worker_mib": round(pss / procs, 1) if procs else 0.0,
    }


def start_cluster(port: int) -> str:
    ray = str(Path(sys.executable).with_name("ray"))
    # token auth off, said explicitly: unset, a head turns it on when ~/.ray/auth_token exists and the
    # joining node is refused (Ray 2.5x)
    env = {
        **os.environ,
        "RAY_USAGE_STATS_ENABLED": "0",
        "RAY_AUTH_MODE": "disabled",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'bench' / 'infra'}",
        LATENCY_ENV: os.environ.get(LATENCY_ENV, "0.05"),
    }
    subprocess.run([ray, "stop", "--force"], env=env, capture_output=True)
    for args in (
        [
            "--head",
            f"--port={port}",
            "--node-ip-address=127.0.0.2",
            "--include-dashboard=false",
            '--resources={"head": 1}',
        ],
        [f"--address=127.0.0.2:{port}", "--node-ip-address=127.0.0.3", '--resources={"node2": 1}'],
    ):
        subprocess.run(
            [ray, "start", *args, "--num-cpus=2", "--disable-usage-stats"], env=env, check=True, capture_output=True
        )
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
    task = {
        "name": "tps",
        "seed": 0,
        "agent": "tests.helpers.agents:one_step",
        "reward": "tests.helpers.agents:exact",
        "dataset": {"source": "tests.helpers.agents:vowel_dataset"},
        "budget": {"generations": 0},
        "models": {
            "policy": {
                "backend": "local",
                "name": "tiny",
                "params": {"weights": str(tmp / "base.safetensors"), "temperature": 1.0, "max_tokens": 48},
            }
        },
        "runner": {"workers": 4},
    }
    evolve.run(
        {**task, "agent": "tests.helpers.agents:vowel_agent", "reward": "tests.helpers.agents:vowel_reward"},
        out=tmp / "run",
    )
    with Archive(tmp / "run", create=False) as a:
        system = a.get_system(a.current())
    spec = WorkerSpec(
        agent="tests.helpers.agents:one_step",
        reward="tests.helpers.agents:exact",
        artifacts_root=str(tmp / "run" / "artifacts"),
        search_path=str(ROOT),
    )
    out = {}
    # the rollout actors on the second node with Ray's defaults (a fraction of a CPU: one torch thread
    # each); the server alone on the head with 2 CPUs (two torch threads: the machine's cores)
    for mode, server in (
        ("one model per actor", None),
        ("shared server actor", {"num_cpus": 2, "resources": {"head": 1}}),
    ):
        with RayRunner(
            workers=workers,
            address=address,
            node_ip_address="127.0.0.2",
            num_cpus=0.05,
            resources={"node2": 0.01},
            model_server=server,
        ) as r:
            list(
                r.run(
                    spec,
                    [
                        RolloutJob(
                            key=f"w{i}",
                            system=system,
                            task={"id": f"w{i}", "q": "warm"},
                            seed=i,
                            temperature=1.0,
                            timeout=300,
                        )
                        for i in range(workers)
                    ],
                )
            )
            pss, procs = worker_pss_mib("ray+server")
            jobs = [
                RolloutJob(
                    key=f"t{i}",
                    system=system,
                    task={"id": f"t{i}", "q": f"question {i}"},
                    seed=i,
                    temperature=1.0,
                    timeout=300,
                )
                for i in range(n)
            ]
            t0 = time.perf_counter()
            got = [t for _, t in r.run(spec, jobs)]
            wall = time.perf_counter() - t0
        toks = sum(len(s.token_ids or ()) for t in got for s in t.steps if isinstance(s, LLMCall))
        out[mode] = {
            "workers": workers,
            "rollouts": n,
            "tokens": toks,
            "wall_s": round(wall, 2),
            "tokens_per_s": round(toks / wall, 1),
            "errors": sum(t.error is not None for t in got),
            "processes": procs,
            "memory_pss_mib": round(pss),
        }
        print(f"  {mode}: {out[mode]}", flush=True)
    return out


def _runner(name: str, c: int, address: str):
    from evolve.runners import ProcessRunner, ThreadRunner
    from evolve.runners.ray_runner import RayRunner

    if name == "thread":
        return ThreadRunner(workers=c)
    if name == "process":
        return ProcessRunner(workers=c)
    # 4 logical CPUs in the cluster: every actor must fit, with room for the cluster's own work
    # 2 cores start a few Ray worker processes per second at best: room for 256 to come up
    return RayRunner(
        workers=c, address=address, node_ip_address="127.0.0.2", num_cpus=min(0.05, 3.6 / c), start_timeout=START_LIMIT
    )


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--latency", type=float, default=0.05)
    ap.add_argument("--rollouts", type=int, default=4, help="rollouts per worker in each measured batch")
    ap.add_argument("--repeats", type=int, default=3, help="measured batches per level (the median is kept)")
    ap.add_argument("--levels", default="1,4,16,64,256")
    ap.add_argument(
        "--keep-free",
        type=float,
        default=4.0,
        help="GiB of memory a level of process or Ray workers must leave available (others use it too)",
    )
    ap.add_argument("--tps-workers", default="4,16", help="rollout actors for the local model's tokens/s")
    ap.add_argument("--tps-rollouts", type=int, default=256, help="rollouts in the local model's measured batch")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    os.environ[LATENCY_ENV] = str(args.latency)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # as start_cluster's nodes; read when ray is imported
    from evolve.runners import WorkerSpec

    spec = WorkerSpec(
        agent="runners_overhead:agent",
        reward="runners_overhead:reward",
        artifacts_root="/tmp",
        search_path=str(ROOT / "bench" / "infra"),
    )
    levels = [int(x) for x in args.levels.split(",") if x]
    from tests.helpers.upstream import free_port

    address = start_cluster(free_port())
    results: dict = {
        "latency_s": args.latency,
        "machine": f"{os.cpu_count()} cores, {available_mib() / 1024:.1f} GiB available at the start",
        "runners": {},
        "skipped": [],
    }
    try:
        for name in ("thread", "process", "ray"):
            rows: list[dict] = []
            for c in levels:
                wait_gone()  # the last level's workers gone
                free = available_mib()
                per = rows[-1]["memory_per_worker_mib"] if rows and rows[-1]["concurrency"] >= 4 else 0.0
                need = per * c
                if name != "thread" and need and free - need < args.keep_free * 1024:
                    why = (
                        f"{name} x{c}: not run; {c} workers would take about {need / 1024:.1f} GiB "
                        f"({per:.0f} MiB each, measured at x{rows[-1]['concurrency']}), and {free / 1024:.1f} GiB "
                        f"is available (the level must leave {args.keep_free:g} GiB)"
                    )
                    results["skipped"].append(why)
                    print(why, flush=True)
                    continue
                runner = _runner(name, c, address)
                try:
                    row = measure(runner, name, spec, c, args.rollouts, args.latency, args.repeats)
                except Exception as e:  # noqa: BLE001 - a level that cannot run is a result too
                    why = f"{name} x{c}: failed: {type(e).__name__}: {e}"
                    results["skipped"].append(why)
                    print(why, flush=True)
                    continue
                finally:
                    runner.close()
                rows.append(row)
                results["runners"][name] = rows
                if args.out:  # as it goes: a later level that fails loses nothing
                    args.out.write_text(json.dumps(results, indent=1))
                print(
                    f"{name:>8} x{c:<4} {row['rollouts_per_s']:>8.1f} rollouts/s   overhead "
                    f"{row['overhead_ms']:>8.2f} ms per rollout   start {row['start_s']:>6.1f} s   "
                    f"{row['memory_per_worker_mib']:>6.1f} MiB PSS per worker",
                    flush=True,
                )
            results["runners"][name] = rows
        wait_gone()
        print("local model, tokens per second:", flush=True)
        results["local_model"] = {
            w: tokens_per_second(address, workers=int(w), n=args.tps_rollouts) for w in args.tps_workers.split(",")
        }
    finally:
        subprocess.run([str(Path(sys.executable).with_name("ray")), "stop", "--force"], capture_output=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
