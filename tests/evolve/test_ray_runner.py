"""The Ray runner on a real Ray cluster on this machine: a head and a second node started with
``ray start`` on loopback addresses (127.0.0.2, 127.0.0.3), each with its own resources. The
seeded toy run builds the golden lineage; faults (an actor killed mid-job, the second node's
raylet killed mid-run, a hung agent, the driver killed -9 and resumed) lose and duplicate nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import evolve
from evolve.archive import Archive
from tests.helpers import DATA, ROOT, stored_rollouts
from tests.helpers.upstream import free_port

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.slow

RAY = str(Path(sys.executable).with_name("ray"))
ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT)}


def _ray(*args: str) -> None:
    r = subprocess.run([RAY, *args], env=ENV, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr


class Cluster:
    """A head (127.0.0.2) and a second node (127.0.0.3) of 2 CPUs each, started with ``ray start``."""

    def __init__(self) -> None:
        self.port = free_port()
        self.address = f"127.0.0.2:{self.port}"

    def start(self) -> "Cluster":
        _ray("stop", "--force")
        _ray("start", "--head", f"--port={self.port}", "--node-ip-address=127.0.0.2", "--num-cpus=2",
             '--resources={"head": 1}', "--include-dashboard=false", "--disable-usage-stats")
        _ray("start", f"--address={self.address}", "--node-ip-address=127.0.0.3", "--num-cpus=2",
             '--resources={"node2": 1}', "--disable-usage-stats")
        return self

    def params(self, **extra) -> list[str]:
        return ["runner.name=ray", f"runner.params.address={self.address}",
                "runner.params.node_ip_address=127.0.0.2", *[f"runner.params.{k}={v}" for k, v in extra.items()]]

    def raylet(self, ip: str) -> int:
        out = subprocess.run(["pgrep", "-f", f"raylet.*node.ip.address={ip}"], capture_output=True, text=True).stdout
        pids = [int(p) for p in out.split()]
        assert pids, f"no raylet for {ip}"
        return pids[0]

    def stop(self) -> None:
        _ray("stop", "--force")


@pytest.fixture(scope="module")
def cluster():
    c = Cluster().start()
    yield c
    c.stop()


def _lineage(run):
    from tests.evolve.test_engine import lineage_of

    return lineage_of(run)


def _counts(run) -> tuple[int, int]:
    """(stored trajectories, distinct keys): nothing duplicated."""
    with Archive(run, create=False) as a:
        rows = a.trajectory_rows()
        return len(rows), len({r.key for r in rows})


def test_the_toy_run_on_ray_builds_the_golden_lineage_of_the_thread_runner(cluster, tmp_path):
    evolve.run(DATA / "toy.yaml", out=tmp_path / "run", overrides=cluster.params())
    assert _lineage(tmp_path / "run") == json.loads((DATA / "golden_toy_lineage.json").read_text())
    n, keys = _counts(tmp_path / "run")
    assert n == keys > 0


def test_actors_go_where_the_task_file_asks(cluster):
    from evolve.runners import RolloutJob, WorkerSpec
    from evolve.runners.ray_runner import RayRunner
    from evolve.types import ModelSpec, System

    system = System(models={"policy": ModelSpec(backend="scripted", name="s", params={"echo": True})})
    jobs = [RolloutJob(key=f"k{i}", system=system, task={"id": f"t{i}", "x": i}, timeout=30) for i in range(6)]
    spec = WorkerSpec(agent="tests.helpers.agents:where", reward="tests.helpers.agents:exact", artifacts_root="/tmp")
    with RayRunner(workers=2, address=cluster.address, node_ip_address="127.0.0.2", resources={"node2": 0.5}) as r:
        got = [t.output for _, t in r.run(spec, jobs)]
    assert len(got) == 6 and {g["ip"] for g in got} == {"127.0.0.3"}  # only the second node has node2
    with pytest.raises(Exception, match=r"no Ray node could start a worker asking for \{CPU: 1, gpu_x: 1\}"):
        with RayRunner(workers=1, address=cluster.address, node_ip_address="127.0.0.2", resources={"gpu_x": 1},
                       start_timeout=5) as r:
            list(r.run(spec, jobs[:1]))


def test_an_actor_killed_mid_job_and_a_hung_agent_fail_their_jobs_and_the_run_goes_on(cluster, tmp_path):
    from evolve.runners import RolloutJob, WorkerSpec
    from evolve.runners.ray_runner import RayRunner
    from evolve.types import ModelSpec, System

    system = System(models={"policy": ModelSpec(backend="scripted", name="s", params={"echo": True})})
    tasks = [{"id": "ok1", "x": 1}, {"id": "die", "x": 2, "exit": True}, {"id": "hang", "x": 3, "hang": 60},
             {"id": "ok2", "x": 4}]
    jobs = [RolloutJob(key=t["id"], system=system, task=t, timeout=2) for t in tasks]
    spec = WorkerSpec(agent="tests.helpers.agents:exit_or_hang", reward="tests.helpers.agents:exact",
                      artifacts_root=str(tmp_path))
    t0 = time.monotonic()
    with RayRunner(workers=2, address=cluster.address, node_ip_address="127.0.0.2", grace=1, start_timeout=30) as r:
        got = {j.key: t for j, t in r.run(spec, jobs)}
        assert r.restarts == 2
    assert sorted(got) == ["die", "hang", "ok1", "ok2"] and time.monotonic() - t0 < 45
    assert got["ok1"].error is None and got["ok2"].error is None
    assert got["die"].infra is not None and got["die"].infra.category == "worker"  # the world failed: retried
    assert "ray worker died" in got["die"].error
    assert got["hang"].infra is None and got["hang"].error.startswith("timeout: killed after")  # the agent's fault


def test_the_driver_killed_9_resumes_with_nothing_lost_or_duplicated(cluster, tmp_path):
    task = tmp_path / "slow.yaml"
    t = __import__("yaml").safe_load((DATA / "toy.yaml").read_text())
    t["agent"] = "tests.helpers.agents:slow_toy"
    t["runner"] = {"name": "ray", "workers": 4, "timeout": 30}
    task.write_text(json.dumps(t))
    args = [sys.executable, "-m", "evolve", "run", str(task), "--out", str(tmp_path / "run"),
            *sum((["--set", s] for s in cluster.params()), [])]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=ENV)
    deadline = time.time() + 120
    while time.time() < deadline and stored_rollouts(tmp_path / "run") < 30:
        time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    before, _ = _counts(tmp_path / "run")
    assert before >= 30
    r = subprocess.run([*args, "--resume"], capture_output=True, text=True, env=ENV, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    n, keys = _counts(tmp_path / "run")
    assert n == keys and n >= before
    assert _lineage(tmp_path / "run") == json.loads((DATA / "golden_toy_lineage.json").read_text())
    import sqlite3

    with sqlite3.connect(tmp_path / "run" / "archive.sqlite") as c:
        assert c.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def _vowel_task(tmp_path: Path, **parts) -> dict:
    """The vowel world over a fresh tiny local model (greedy, 4 tokens), with ``parts`` added."""
    from evolve.policy.tiny import CharTokenizer, TinyConfig, build_model
    from evolve.policy.weights import save_base

    cfg = TinyConfig(d_model=32, n_layers=1, n_heads=2, d_ff=64, max_len=64)
    save_base(build_model(cfg, seed=3), CharTokenizer(), cfg, tmp_path / "base.safetensors")
    return {"name": "v", "seed": 0, "agent": "tests.helpers.agents:vowel_agent",
            "reward": "tests.helpers.agents:vowel_reward", "dataset": {"source": "tests.helpers.agents:vowel_dataset"},
            "models": {"policy": {"backend": "local", "name": "tiny", "params": {
                "weights": str(tmp_path / "base.safetensors"), "temperature": 0.0, "max_tokens": 4}}}, **parts}


def test_a_shared_model_server_answers_every_rollout_actor_as_the_thread_runner_does(cluster, tmp_path):
    from evolve.runners import RolloutJob, ThreadRunner, WorkerSpec
    from evolve.runners.ray_models import PREFIX
    from evolve.runners.ray_runner import RayRunner
    from evolve.types import LLMCall

    evolve.run(_vowel_task(tmp_path, budget={"generations": 0}), out=tmp_path / "run")
    with Archive(tmp_path / "run", create=False) as a:
        system = a.get_system(a.current())
    spec = WorkerSpec(agent="tests.helpers.agents:vowel_agent", reward="tests.helpers.agents:vowel_reward",
                      artifacts_root=str(tmp_path / "run" / "artifacts"))
    jobs = [RolloutJob(key=f"k{i}", system=system, task={"id": f"t{i}", "q": "xyz"[: 1 + i % 3] * (1 + i % 4)},
                       seed=i, temperature=1.0, timeout=60) for i in range(24)]
    with ThreadRunner(workers=8) as r:
        here = {j.key: t for j, t in r.run(spec, jobs)}
    with RayRunner(workers=3, address=cluster.address, node_ip_address="127.0.0.2", num_cpus=0.5,
                   model_server={"num_cpus": 0.5}) as r:
        there = {j.key: t for j, t in r.run(spec, jobs)}
        servers = [e for e in ray.util.list_named_actors(all_namespaces=True) if e["name"].startswith(PREFIX)]
        assert len(servers) == 1  # one server for the base, shared by the three rollout actors
        stats = ray.get(ray.get_actor(servers[0]["name"], namespace=servers[0]["namespace"]).stats.remote())
    calls = sum(isinstance(s, LLMCall) for t in there.values() for s in t.steps)
    assert stats["calls"] == calls == 48 and stats["models"] == 1
    for k in here:  # the same sampled tokens, seed for seed
        a = [s.token_ids for s in here[k].steps if isinstance(s, LLMCall)]
        b = [s.token_ids for s in there[k].steps if isinstance(s, LLMCall)]
        assert a == b and here[k].output == there[k].output and here[k].error is None is there[k].error


def test_star_trains_its_adapter_in_a_ray_task_where_the_task_file_asks(cluster, tmp_path):
    star = {"tasks": 8, "samples": 2, "threshold": 0.0, "min_examples": 1, "epochs": 1, "replay": 0, "batch_size": 8}
    task = _vowel_task(
        tmp_path, operators=[{"name": "star", "params": star}],
        runner={"name": "ray", "workers": 2, "timeout": 60,
                "params": {"address": cluster.address, "node_ip_address": "127.0.0.2", "num_cpus": 0.5,
                           "train": {"num_cpus": 1, "resources": {"node2": 0.5}}}},
        budget={"generations": 1}, engine={"minibatch": 4, "acceptance": "val_only", "min_gain": -1})
    evolve.run(task, out=tmp_path / "run")
    with Archive(tmp_path / "run", create=False) as a:
        (kid,) = [r for r in a.records() if r.operator == "star"]
        adapter = a.get_system(kid.id).models["policy"].adapter
        assert a.artifacts.has(adapter.sha256)  # the adapter came back and is stored in the run
    assert kid.info["trained_remotely"] is True and kid.info["train_loss"] is not None
    bad = {**task, "runner": {**task["runner"], "params": {**task["runner"]["params"], "train": {"num_gpus": 1}}}}
    with pytest.raises(Exception, match=r"runner.params.train asks for \{CPU: 1, GPU: 1\}, which no node"):
        evolve.run(bad, out=tmp_path / "run2")


# last in the file: `ray stop --force` at its end stops every Ray process here, the module's cluster too
def test_the_second_nodes_raylet_killed_mid_run_fails_its_jobs_with_the_cause_and_the_run_finishes(tmp_path):
    c = Cluster().start()
    try:
        task = tmp_path / "slow.yaml"
        t = __import__("yaml").safe_load((DATA / "toy.yaml").read_text())
        t["agent"] = "tests.helpers.agents:slower_toy"
        t["runner"] = {"name": "ray", "workers": 4, "timeout": 30}
        task.write_text(json.dumps(t))
        log = tmp_path / "out.log"
        with open(log, "w") as f:
            proc = subprocess.Popen([sys.executable, "-m", "evolve", "run", str(task), "--out", str(tmp_path / "run"),
                                     *sum((["--set", s] for s in c.params()), [])],
                                    stdout=f, stderr=subprocess.STDOUT, env=ENV)
            deadline = time.time() + 120
            while time.time() < deadline and not stored_rollouts(tmp_path / "run"):
                time.sleep(0.1)
            os.kill(c.raylet("127.0.0.3"), signal.SIGKILL)  # a batch is in flight on both nodes: the second dies
            assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
        text = log.read_text()
        assert "ray worker died" in text, text[-4000:]  # its jobs failed with the cause, were retried on the head
        n, keys = _counts(tmp_path / "run")
        assert n == keys
        assert _lineage(tmp_path / "run") == json.loads((DATA / "golden_toy_lineage.json").read_text())
    finally:
        c.stop()
