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
from evolve.types import LLMCall
from tests.helpers import DATA, ROOT, stored_rollouts
from tests.helpers.upstream import free_port

ray = pytest.importorskip("ray")
torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow

RAY = str(Path(sys.executable).with_name("ray"))


def _env() -> dict[str, str]:
    return {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT)}


@pytest.fixture(scope="module", autouse=True)
def ray_auth_off():
    """Token authentication off, said explicitly, for every node and driver of these loopback
    clusters. Left unset, Ray 2.5x decides per process: ``ray start --head`` turns it on whenever
    ``~/.ray/auth_token`` exists (a local ``ray.init()`` writes one), while a joining node and a
    driver given an address stay off and are refused. (Token mode cannot be switched on for this
    process's own driver: Ray reads the mode once, when it is imported.)"""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_AUTH_MODE", "disabled")
        yield


def _ray(*args: str, env: dict[str, str] | None = None) -> None:
    r = subprocess.run([RAY, *args], env={**_env(), **(env or {})}, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr


class Cluster:
    """A head (127.0.0.2) and a second node (127.0.0.3) of 2 CPUs each, started with ``ray start``."""

    def __init__(self) -> None:
        self.port = free_port()
        self.address = f"127.0.0.2:{self.port}"

    def start(self, env: dict[str, str] | None = None) -> Cluster:
        """``env``: more environment for the nodes (their workers inherit it)."""
        _ray("stop", "--force")
        _ray(
            "start",
            "--head",
            f"--port={self.port}",
            "--node-ip-address=127.0.0.2",
            "--num-cpus=2",
            '--resources={"head": 1}',
            "--include-dashboard=false",
            "--disable-usage-stats",
            env=env,
        )
        _ray(
            "start",
            f"--address={self.address}",
            "--node-ip-address=127.0.0.3",
            "--num-cpus=2",
            '--resources={"node2": 1}',
            "--disable-usage-stats",
            env=env,
        )
        return self

    def params(self, **extra) -> list[str]:
        return [
            "runner.name=ray",
            f"runner.params.address={self.address}",
            "runner.params.node_ip_address=127.0.0.2",
            *[f"runner.params.{k}={v}" for k, v in extra.items()],
        ]

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
        with RayRunner(
            workers=1, address=cluster.address, node_ip_address="127.0.0.2", resources={"gpu_x": 1}, start_timeout=5
        ) as r:
            list(r.run(spec, jobs[:1]))


def test_an_actor_killed_mid_job_and_a_hung_agent_fail_their_jobs_and_the_run_goes_on(cluster, tmp_path):
    from evolve.runners import RolloutJob, WorkerSpec
    from evolve.runners.ray_runner import RayRunner
    from evolve.types import ModelSpec, System

    system = System(models={"policy": ModelSpec(backend="scripted", name="s", params={"echo": True})})
    tasks = [
        {"id": "ok1", "x": 1},
        {"id": "die", "x": 2, "exit": True},
        {"id": "hang", "x": 3, "hang": 60},
        {"id": "ok2", "x": 4},
    ]
    jobs = [RolloutJob(key=t["id"], system=system, task=t, timeout=2) for t in tasks]
    spec = WorkerSpec(
        agent="tests.helpers.agents:exit_or_hang", reward="tests.helpers.agents:exact", artifacts_root=str(tmp_path)
    )
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
    args = [
        sys.executable,
        "-m",
        "evolve",
        "run",
        str(task),
        "--out",
        str(tmp_path / "run"),
        *sum((["--set", s] for s in cluster.params()), []),
    ]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env())
    deadline = time.time() + 120
    while time.time() < deadline and stored_rollouts(tmp_path / "run") < 30:
        time.sleep(0.3)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    before, _ = _counts(tmp_path / "run")
    assert before >= 30
    r = subprocess.run([*args, "--resume"], capture_output=True, text=True, env=_env(), timeout=600)
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
    return {
        "name": "v",
        "seed": 0,
        "agent": "tests.helpers.agents:vowel_agent",
        "reward": "tests.helpers.agents:vowel_reward",
        "dataset": {"source": "tests.helpers.agents:vowel_dataset"},
        "models": {
            "policy": {
                "backend": "local",
                "name": "tiny",
                "params": {"weights": str(tmp_path / "base.safetensors"), "temperature": 0.0, "max_tokens": 4},
            }
        },
        **parts,
    }


def test_a_shared_model_server_answers_every_rollout_actor_as_the_thread_runner_does(cluster, tmp_path):
    from evolve.cluster.model_server import PREFIX
    from evolve.runners import RolloutJob, ThreadRunner, WorkerSpec
    from evolve.runners.ray_runner import RayRunner

    evolve.run(_vowel_task(tmp_path, budget={"generations": 0}), out=tmp_path / "run")
    with Archive(tmp_path / "run", create=False) as a:
        system = a.get_system(a.current())
    spec = WorkerSpec(
        agent="tests.helpers.agents:vowel_agent",
        reward="tests.helpers.agents:vowel_reward",
        artifacts_root=str(tmp_path / "run" / "artifacts"),
    )
    jobs = [
        RolloutJob(
            key=f"k{i}",
            system=system,
            task={"id": f"t{i}", "q": "xyz"[: 1 + i % 3] * (1 + i % 4)},
            seed=i,
            temperature=1.0,
            timeout=60,
        )
        for i in range(24)
    ]
    with ThreadRunner(workers=8) as r:
        here = {j.key: t for j, t in r.run(spec, jobs)}
    with RayRunner(
        workers=3, address=cluster.address, node_ip_address="127.0.0.2", num_cpus=0.5, model_server={"num_cpus": 0.5}
    ) as r:
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
        tmp_path,
        operators=[{"name": "star", "params": star}],
        runner={
            "name": "ray",
            "workers": 2,
            "timeout": 60,
            "params": {
                "address": cluster.address,
                "node_ip_address": "127.0.0.2",
                "num_cpus": 0.5,
                "train": {"num_cpus": 1, "resources": {"node2": 0.5}},
            },
        },
        budget={"generations": 1},
        engine={"minibatch": 4, "acceptance": "val_only", "min_gain": -1},
    )
    evolve.run(task, out=tmp_path / "run")
    with Archive(tmp_path / "run", create=False) as a:
        (kid,) = [r for r in a.records() if r.operator == "star"]
        adapter = a.get_system(kid.id).models["policy"].adapter
        assert a.artifacts.has(adapter.sha256)  # the adapter came back and is stored in the run
    assert kid.info["trained_remotely"] is True and kid.info["train_loss"] is not None
    bad = {**task, "runner": {**task["runner"], "params": {**task["runner"]["params"], "train": {"num_gpus": 1}}}}
    with pytest.raises(Exception, match=r"runner.params.train asks for \{CPU: 1, GPU: 1\}, which no node"):
        evolve.run(bad, out=tmp_path / "run2")


def test_a_train_request_the_trainer_cannot_honour_is_refused_before_the_run():
    from evolve.errors import ConfigError
    from evolve.runners.ray_runner import RayRunner

    with pytest.raises(ConfigError, match=r"runner.params.train.*takes no key 'num_gpu'; it takes num_cpus, num_gpus"):
        RayRunner(train={"num_gpu": 1})
    with pytest.raises(ConfigError, match=r"timeout must be a number > 0, got 0"):
        RayRunner(train={"timeout": 0})
    with pytest.raises(ConfigError, match=r"resources must be a mapping"):
        RayRunner(train={"resources": ["gpu"]})
    for threads in (0, 1.5, True):
        with pytest.raises(ConfigError, match=r"runner.params.train.threads.*whole number >= 1"):
            RayRunner(train={"threads": threads})


def _ray_runner(cluster, **train) -> dict:
    return {
        "name": "ray",
        "workers": 2,
        "timeout": 60,
        "params": {"address": cluster.address, "node_ip_address": "127.0.0.2", "num_cpus": 0.5, "train": train},
    }


def _child(run: Path, operator: str):
    with Archive(run, create=False) as a:
        (kid,) = [r for r in a.records() if r.operator == operator]
        return kid, a.get_system(kid.id).models["policy"]


def test_grpo_learns_in_a_ray_actor_where_the_task_file_asks_and_builds_the_drivers_adapter(cluster, tmp_path):
    grpo = {"steps": 2, "tasks_per_step": 4, "group_size": 4, "dev_tasks": 0, "lr": 0.01, "micro_batch": 8}
    here = _vowel_task(
        tmp_path,
        operators=[{"name": "grpo", "params": grpo}],
        budget={"generations": 1},
        runner={"name": "thread", "workers": 4, "timeout": 60},
        engine={"minibatch": 4, "acceptance": "val_only", "min_gain": -1},
    )
    evolve.run(here, out=tmp_path / "here")  # the learner in this process
    there = {**here, "runner": _ray_runner(cluster, num_cpus=1, resources={"node2": 0.5})}
    evolve.run(there, out=tmp_path / "there")
    kid_here, model_here = _child(tmp_path / "here", "grpo")
    kid, model = _child(tmp_path / "there", "grpo")
    assert "trained_in" not in kid_here.info
    where = kid.info["trained_in"]
    assert where["ip"] == "127.0.0.3" and where["pid"] != os.getpid()  # an actor on the node that has node2
    assert all(row["trained_tokens"] > 0 for row in kid.info["curve"] if "loss" in row)  # it learned something
    # the same rollouts (tokens sampled on the rollout actors are the thread runner's) and the same
    # seed: the adapter trained in the actor is the one trained here, byte for byte
    assert model.adapter is not None and model.adapter.sha256 == model_here.adapter.sha256
    assert [r["loss"] for r in kid.info["curve"] if "loss" in r] == [
        r["loss"] for r in kid_here.info["curve"] if "loss" in r
    ]
    with pytest.raises(Exception, match=r"runner.params.train asks for \{CPU: 1, GPU: 1\}, which no node"):
        evolve.run({**there, "runner": _ray_runner(cluster, num_gpus=1)}, out=tmp_path / "bad")
    # node2 exists, but the rollout actors hold all of it: an error after start_timeout, not a wait
    busy = _ray_runner(cluster, num_cpus=0.5, resources={"node2": 0.5})
    busy["params"].update(resources={"node2": 0.5}, start_timeout=20)
    t0 = time.monotonic()
    with pytest.raises(
        Exception,
        match=r"no Ray node could start the training actor asking for "
        r"\{CPU: 0.5, node2: 0.5\} \(runner.params.train\) within 20s",
    ):
        evolve.run({**there, "runner": busy}, out=tmp_path / "busy")
    assert time.monotonic() - t0 < 120


def test_the_sft_cold_start_trains_in_a_ray_task_and_builds_the_drivers_weights(cluster, tmp_path, monkeypatch):
    task = _vowel_task(tmp_path, budget={"generations": 0}, runner={"name": "thread", "workers": 4, "timeout": 60})
    policy = task["models"]["policy"]
    del policy["params"]["weights"]
    policy["cold_start"] = {
        "demos": "tests.helpers.agents:vowel_demos",
        "n_demos": 16,
        "epochs": 3,
        "batch_size": 8,
        "eval_every": 4,
        "n_eval": 4,
        "tiny": {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64, "max_len": 64},
    }
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache-here"))
    evolve.run(task, out=tmp_path / "here")
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache-there"))
    evolve.run({**task, "runner": _ray_runner(cluster, num_cpus=1, resources={"node2": 0.5})}, out=tmp_path / "there")
    bases = {}
    for side in ("here", "there"):
        with Archive(tmp_path / side, create=False) as a:
            bases[side] = a.get_system(a.current()).models["policy"].base.sha256
        (info,) = [json.loads(p.read_text()) for p in (tmp_path / f"cache-{side}" / "sft").glob("*/info.json")]
        assert info["steps"] == 12 and info["best_val"] is not None
        if side == "there":
            assert info["trained_in"]["ip"] == "127.0.0.3" and info["trained_in"]["pid"] != os.getpid()
        else:
            assert info["trained_in"]["pid"] == os.getpid()
    assert bases["here"] == bases["there"]  # the weights trained in the task are the driver's, byte for byte
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache-bad"))
    with pytest.raises(Exception, match=r"runner.params.train asks for \{CPU: 1, GPU: 1\}, which no node"):
        evolve.run({**task, "runner": _ray_runner(cluster, num_gpus=1)}, out=tmp_path / "bad")


# a two-role team on the tiny model: the solver answers, the verifier judges, a rejected answer is
# tried once more (examples/multi_agent/team.py's graph, on the vowel world)
TEAM = {
    "entry": "solve",
    "nodes": [
        {"id": "solve", "type": "llm", "params": {"role": "solver", "prompt": "{q}", "out": "reply"}},
        {
            "id": "verify",
            "type": "llm",
            "params": {"role": "verifier", "prompt": "{q}: {reply}. Right?", "out": "verdict", "max_tokens": 3},
        },
        {"id": "check", "type": "check", "params": {"fn": "evolve.policy.roles:accepted"}},
        {
            "id": "retry",
            "type": "llm",
            "max_visits": 1,
            "params": {"role": "solver", "prompt": "{q}, not {reply}", "out": "reply"},
        },
        {"id": "answer", "type": "answer", "params": {"key": "reply"}},
    ],
    "edges": [
        {"src": "solve", "dst": "verify"},
        {"src": "verify", "dst": "check"},
        {"src": "check", "dst": "retry", "when": "not ok"},
        {"src": "check", "dst": "answer"},
        {"src": "retry", "dst": "verify"},
    ],
}


def test_each_roles_own_model_server_sits_on_the_node_asked_for_and_answers_as_the_shared_server(cluster, tmp_path):
    from evolve.cluster.model_server import PREFIX
    from evolve.errors import ConfigError, UserError
    from evolve.runners import RolloutJob, WorkerSpec
    from evolve.runners.ray_runner import RayRunner

    task = _vowel_task(tmp_path, agent="evolve.topology:agent", workflow={"graph": TEAM}, budget={"generations": 0})
    tiny = task["models"].pop("policy")
    task["models"] = {"solver": tiny, "verifier": tiny}  # one base, two roles
    evolve.run(task, out=tmp_path / "run")
    with Archive(tmp_path / "run", create=False) as a:
        system = a.get_system(a.current())
    assert system.models["solver"].base == system.models["verifier"].base
    spec = WorkerSpec(
        agent="evolve.topology:agent",
        reward="tests.helpers.agents:vowel_reward",
        artifacts_root=str(tmp_path / "run" / "artifacts"),
    )
    jobs = [
        RolloutJob(
            key=f"k{i}", system=system, task={"id": f"t{i}", "q": "bcdfg"[i % 5] * (1 + i % 3)}, seed=i, timeout=60
        )
        for i in range(12)
    ]  # greedy: the task file's temperature 0

    def servers():
        return {
            e["name"]: ray.get(ray.get_actor(e["name"], namespace=e["namespace"]).stats.remote())
            for e in ray.util.list_named_actors(all_namespaces=True)
            if e["name"].startswith(PREFIX)
        }

    kw = {"workers": 2, "address": cluster.address, "node_ip_address": "127.0.0.2", "num_cpus": 0.5}
    with RayRunner(**kw, model_server={"num_cpus": 0.5}) as r:  # the default: one server for the base
        shared = {j.key: t for j, t in r.run(spec, jobs)}
        assert [s["role"] for s in servers().values()] == [None]
    pinned = {
        "num_cpus": 0.5,
        "servers": "per_role",
        "roles": {"solver": {"resources": {"head": 0.01}}, "verifier": {"resources": {"node2": 0.01}}},
    }
    with RayRunner(**kw, model_server=pinned) as r:
        per_role = {j.key: t for j, t in r.run(spec, jobs)}
        stats = {s["role"]: s for s in servers().values()}
    calls = {
        role: sum(s.role == role for t in per_role.values() for s in t.steps if isinstance(s, LLMCall))
        for role in ("solver", "verifier")
    }
    assert sorted(stats) == ["solver", "verifier"] and min(calls.values()) >= len(jobs)
    for role, ip in (("solver", "127.0.0.2"), ("verifier", "127.0.0.3")):  # head has head, the second node2
        assert stats[role]["ip"] == ip, stats
        assert stats[role]["by_role"] == {role: calls[role]} and stats[role]["calls"] == calls[role]
    assert stats["solver"]["node"] != stats["verifier"]["node"]
    for k, t in shared.items():  # the same scores, answers and sampled tokens as the shared server's
        u = per_role[k]
        assert t.error is None is u.error and t.score == u.score and t.output == u.output
        assert [(s.role, s.token_ids) for s in t.steps if isinstance(s, LLMCall)] == [
            (s.role, s.token_ids) for s in u.steps if isinstance(s, LLMCall)
        ]
    assert len({t.score for t in shared.values()}) > 1  # scores that differ by task: a comparison that can fail
    # refused before a rollout starts: a role the system lacks, and a server no node can hold
    with pytest.raises(ConfigError, match=r"model_server.roles.*unknown role 'judge'; .* solver, verifier"):
        with RayRunner(**kw, model_server={"servers": "per_role", "roles": {"judge": {}}}) as r:
            r.run(spec, jobs)
    with pytest.raises(UserError, match=r"the server of role 'verifier' asks for \{CPU: 1, gpu_x: 1\}, which no node"):
        with RayRunner(
            **kw, model_server={"servers": "per_role", "roles": {"verifier": {"resources": {"gpu_x": 1}}}}
        ) as r:
            r.run(spec, jobs)


# the SQL quickstart (examples/sql_agent/task.yaml), reduced to a few minutes: a smaller tiny model
# and demo set, fewer tasks, one generation; STaR learns every sample and its child is accepted, so
# that a child is trained, scored on val, and compared
QUICKSTART = ROOT / "examples" / "sql_agent" / "task.yaml"
REDUCED = [
    "dataset.params={n_train: 240, n_val: 24, n_test: 24}",
    "models.policy.cold_start.n_demos=48",
    "models.policy.cold_start.epochs=4",
    "models.policy.cold_start.eval_every=12",
    "models.policy.cold_start.n_eval=12",
    "models.policy.cold_start.tiny={d_model: 64, n_layers: 2, n_heads: 2, d_ff: 128, max_len: 512}",
    "operators.0.params={tasks: 24, samples: 2, temperature: 0.8, threshold: 0.0, turns: all, "
    "min_examples: 1, replay: 0.5, epochs: 1, batch_size: 16}",
    "budget={generations: 1}",
    "engine={minibatch: 12, min_gain: -1, val_tolerance: 1}",
    "runner.workers=8",
]


def test_the_sql_quickstart_on_ray_builds_the_systems_of_the_thread_runner(cluster, tmp_path, monkeypatch):
    """Rollouts in Ray actors answered by a shared model server actor, the cold start and STaR's
    training in Ray tasks on the second node: the same lineage, scores and sampled tokens as the
    thread runner's run of the same task, each from its own empty SFT cache."""
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache-thread"))
    here = evolve.run(QUICKSTART, out=tmp_path / "thread", overrides=REDUCED)
    monkeypatch.setenv("EVOLVE_CACHE_DIR", str(tmp_path / "cache-ray"))
    # the rollout actors and the server on the head, so that the training always has room on node2
    there = evolve.run(
        QUICKSTART,
        out=tmp_path / "ray",
        overrides=[
            *REDUCED,
            *cluster.params(
                num_cpus=0.1,
                resources="{head: 0.01}",
                model_server="{num_cpus: 1, resources: {head: 0.01}}",
                train="{num_cpus: 1, resources: {node2: 0.5}}",
            ),
        ],
    )
    lineage = _lineage(tmp_path / "thread")
    assert _lineage(tmp_path / "ray") == lineage
    assert [d["accepted"] for d in lineage["decisions"]] == [True]  # the STaR child, accepted (scored on val)
    for key in ("baseline", "best"):
        assert there[key]["system_id"] == here[key]["system_id"]
        assert there[key]["val"] == here[key]["val"] and there[key]["test"] == here[key]["test"]
    (info,) = [json.loads(p.read_text()) for p in (tmp_path / "cache-ray" / "sft").glob("*/info.json")]
    assert info["trained_in"]["ip"] == "127.0.0.3"  # the cold start trained on the node that has node2
    # with the driver's torch threads, not the 1 Ray's num_cpus would give it: the weights depend on it
    (mine,) = [json.loads(p.read_text()) for p in (tmp_path / "cache-thread" / "sft").glob("*/info.json")]
    assert info["trained_in"]["threads"] == mine["trained_in"]["threads"] == torch.get_num_threads()
    with Archive(tmp_path / "thread", create=False) as a, Archive(tmp_path / "ray", create=False) as b:
        (star,) = [r for r in b.records() if r.operator == "star"]
        assert star.info["trained_remotely"] is True
        mine = {r.key: r.trajectory for r in a.trajectory_rows()}
        theirs = {r.key: r.trajectory for r in b.trajectory_rows()}
        assert set(mine) == set(theirs) and len(mine) > 100
        for k in mine:  # every rollout: the same score and the same sampled tokens, call for call
            x, y = mine[k], theirs[k]
            assert x.score == y.score and x.error == y.error
            assert [s.token_ids for s in x.steps if isinstance(s, LLMCall)] == [
                s.token_ids for s in y.steps if isinstance(s, LLMCall)
            ]


# last in the file: `ray stop --force` at its end stops every Ray process here, the module's cluster too
def test_the_second_nodes_raylet_killed_mid_run_fails_its_jobs_with_the_cause_and_the_run_finishes(tmp_path):
    marks = tmp_path / "marks"  # where each job starts: the kill lands while one runs on the second node
    marks.mkdir()
    c = Cluster().start(env={"EVOLVE_TEST_MARKS": str(marks)})
    try:
        task = tmp_path / "slow.yaml"
        t = __import__("yaml").safe_load((DATA / "toy.yaml").read_text())
        t["agent"] = "tests.helpers.agents:marked_toy"
        t["runner"] = {"name": "ray", "workers": 4, "timeout": 30}
        task.write_text(json.dumps(t))
        log = tmp_path / "out.log"
        with open(log, "w") as f:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "evolve",
                    "run",
                    str(task),
                    "--out",
                    str(tmp_path / "run"),
                    *sum((["--set", s] for s in c.params()), []),
                ],
                stdout=f,
                stderr=subprocess.STDOUT,
                env=_env(),
            )
            deadline = time.time() + 300  # a loaded machine starts the second node's actors late
            while time.time() < deadline and not any(m.name.startswith("127.0.0.3-") for m in marks.iterdir()):
                time.sleep(0.05)
            assert any(marks.iterdir()), log.read_text()[-3000:]
            os.kill(c.raylet("127.0.0.3"), signal.SIGKILL)  # a job of the second node runs (1.3 s): it dies
            assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
        text = log.read_text()
        assert "ray worker died" in text, text[-4000:]  # its jobs failed with the cause, were retried on the head
        n, keys = _counts(tmp_path / "run")
        assert n == keys
        assert _lineage(tmp_path / "run") == json.loads((DATA / "golden_toy_lineage.json").read_text())
    finally:
        c.stop()
