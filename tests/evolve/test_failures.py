"""Failing loudly and scoring honestly: the world failing under a rollout is never a score, a
failed run never exits 0, and rewards are checked at the boundary (evolve.failures, evolve.scoring.retry)."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

import evolve
from evolve.archive import Archive
from evolve.errors import InfraError, LLMError, RunFailed
from evolve.failures import classify, signature
from evolve.rollout import run_agent, score
from evolve.types import Message, ModelSpec, System
from tests.helpers.servers import FakeOpenAI, free_port, toy_reply

TESTS = Path(__file__).parents[1]
DATA = TESTS / "data"
pytestmark = pytest.mark.filterwarnings("ignore:.*ReadOnly.*:UserWarning")


def toy(**changes) -> dict:
    data = yaml.safe_load((DATA / "toy.yaml").read_text())
    data["failures"] = {"backoff": 0.01, "retries": 3}
    for key, value in changes.items():
        data[key] = value
    return data


def report_scores(report: dict) -> tuple:
    return tuple(
        (report[w]["system_id"], report[w]["val"]["score"], report[w]["test"]["score"]) for w in ("baseline", "best")
    )


def stored(run_dir: Path) -> int:
    db = run_dir / "archive.sqlite"
    return sqlite3.connect(db).execute("select count(*) from trajectories").fetchone()[0] if db.exists() else 0


def cli(*args, cwd, env=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "evolve", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env
    )


# ----------------------------------------------------------------------------- classification


def test_the_world_failing_is_told_from_the_agent_failing():
    import httpx
    import openai

    req = httpx.Request("POST", "http://127.0.0.1:1/v1/chat/completions")

    def status(cls, code):
        return cls("x", response=httpx.Response(code, request=req), body=None)

    cases = [
        (openai.APIConnectionError(request=req), "unreachable", True),
        (openai.APITimeoutError(request=req), "timeout", True),
        (status(openai.RateLimitError, 429), "rate_limit", True),
        (status(openai.InternalServerError, 503), "server", True),
        (status(openai.AuthenticationError, 401), "auth", False),
        (status(openai.NotFoundError, 404), "not_found", False),
        (httpx.ConnectError("refused"), "unreachable", True),
        (ConnectionRefusedError(111, "refused"), "unreachable", True),
        (LLMError("m: down", category="unreachable"), "unreachable", True),
        (LLMError("m: closed"), "backend", False),
        (
            __import__("evolve.sandbox", fromlist=["SandboxUnavailable"]).SandboxUnavailable("no bwrap"),
            "sandbox",
            False,
        ),
    ]
    for e, category, retryable in cases:
        f = classify(e)
        assert f is not None and (f.category, f.retryable) == (category, retryable), (e, f)
    # the agent's own failures: its logic, and requests the model refused
    for e in (
        ValueError("bad"),
        KeyError("q"),
        TimeoutError("its own tool"),
        status(openai.BadRequestError, 400),
        LLMError("prompt too long", category="request"),
    ):
        assert classify(e) is None, e
    assert (
        signature("agent raised ValueError: agent exploded on val-13\n  trace")
        == "agent raised ValueError: agent exploded on val-N"
    )


def _swallowing_agent(task, ctx):
    try:
        return ctx.llm("policy").complete([Message(role="user", content="hi")]).text
    except Exception:  # noqa: BLE001 - an agent that hides the outage
        return "fallback"


def test_a_rollout_the_model_failed_under_is_marked_even_when_the_agent_catches_it():
    from evolve.llm.fake import ScriptedLM

    down = ScriptedLM("m", ["x"], faults={"rate": 1.0, "kinds": ["unreachable"]})
    system = System(models={"policy": ModelSpec(backend="scripted", name="m")})
    traj = run_agent(_swallowing_agent, system, {"id": "t"}, lambda s, r: down)
    assert traj.output == "fallback" and traj.infra is not None and traj.infra.category == "unreachable"
    assert traj.error.startswith("the world failed under the rollout")
    up = ScriptedLM("m", ["x"])
    ok = run_agent(_swallowing_agent, system, {"id": "t"}, lambda s, r: up)
    assert ok.infra is None and ok.error is None and ok.output == "x"

    def broken(system, role):  # the model cannot be built (a key unset, a file missing)
        from evolve.errors import ConfigError

        raise ConfigError("the environment variable 'K' (api_key_env) is not set")

    t = run_agent(_swallowing_agent, system, {"id": "t"}, broken)
    assert t.infra.category == "config" and not t.infra.retryable and "api_key_env" in t.infra.message


# ----------------------------------------------------------------------------- rewards at the boundary


@pytest.mark.parametrize(
    "value, expected",
    [
        (np.float32(0.25), 0.25),
        (np.bool_(True), 1.0),
        (True, 1.0),
        (np.int64(1), 1.0),
        (np.array(0.5), 0.5),
        ({"score": np.float64(0.75), "components": {"a": np.float32(1)}}, 0.75),
    ],
)
def test_numpy_scalars_and_bools_are_rewards(value, expected):
    t = score(lambda task, out: value, {"id": "t"}, run_agent(lambda task, ctx: "o", System(), {"id": "t"}, None))
    assert t.reward.error is None and t.reward.score == expected


@pytest.mark.parametrize(
    "value, needle",
    [
        (float("nan"), "finite"),
        (float("inf"), "finite"),
        (-float("inf"), "finite"),
        ("0.5", "got str"),
        (None, "got NoneType"),
        ({"score": float("nan")}, "finite"),
        ({"points": 1}, "needs a 'score'"),
        (np.array([1.0, 0.0]), "got ndarray"),
    ],
)
def test_a_reward_that_is_not_a_finite_number_is_a_reward_error(value, needle):
    t = score(lambda task, out: value, {"id": "t"}, run_agent(lambda task, ctx: "o", System(), {"id": "t"}, None))
    assert t.reward.score == 0.0 and needle in t.reward.error and t.infra is None
    json.loads(t.model_dump_json())  # storable: no NaN reaches the archive


def _nan_on_one(task, output):
    return float("nan") if task["id"] == "val-3" else (1.0 if str(output) == str(task["answer"]) else 0.0)


def _out_of_range(task, output):
    return 5.0 if task["a"] % 2 else 0.0


def test_a_nan_reward_on_one_task_neither_crashes_the_run_nor_breaks_resume(tmp_path):
    report = evolve.run(toy(), reward=_nan_on_one, out=tmp_path / "r", overrides=["budget.generations=1"])
    again = evolve.run(toy(), reward=_nan_on_one, out=tmp_path / "r", overrides=["budget.generations=1"], resume=True)
    assert report_scores(again) == report_scores(report)
    assert report["failures"]["val"]["reward_errors"] >= 1
    assert any("finite" in kind for kind, _ in report["failures"]["val"]["kinds"])
    md = (tmp_path / "r" / "report.md").read_text()
    assert "## Failures" in md and "reward failed" in md


def test_scores_outside_the_declared_range_are_reported(tmp_path):
    report = evolve.run(toy(), reward=_out_of_range, out=tmp_path / "r", overrides=["budget.generations=0"])
    assert report["out_of_range"]["val"]["n"] > 0 and report["out_of_range"]["val"]["max"] == 5.0
    assert "outside the reward range [0, 1]" in (tmp_path / "r" / "report.md").read_text()
    ok = evolve.run(
        toy(reward_range=[0, 5]), reward=_out_of_range, out=tmp_path / "r2", overrides=["budget.generations=0"]
    )
    assert ok["out_of_range"] == {}


# ----------------------------------------------------------------------------- failure injection


def _faulty(rate: float, retries: int = 6, kinds=("unreachable", "timeout", "rate_limit")) -> dict:
    data = toy()
    data["models"]["policy"]["params"]["faults"] = {"rate": rate, "kinds": list(kinds), "seed": 1}
    data["failures"]["retries"] = retries
    return data


@pytest.fixture
def flaky(monkeypatch):
    """The scripted backend with a share of its calls failing (``flaky(rate)``), the systems unchanged:
    the same run, with a flaky model server under it."""
    from evolve.llm import fake
    from evolve.registry import llm_backends

    def set_rate(rate: float) -> None:
        def build(spec, artifacts=None):
            lm = fake.build(spec, artifacts)
            lm._faults = fake._check_faults(
                {"rate": rate, "kinds": ["unreachable", "timeout", "rate_limit"], "seed": 1}
            )
            return lm

        monkeypatch.setitem(llm_backends._objects, "scripted", build)

    return set_rate


def test_faults_absorbed_by_retries_give_the_scores_of_a_run_without_them(tmp_path, flaky):
    clean = evolve.run(toy(), out=tmp_path / "clean")
    flaky(0.3)
    faulty = evolve.run(toy(failures={"retries": 6, "backoff": 0.01}), out=tmp_path / "faulty")
    assert report_scores(faulty) == report_scores(clean)
    assert (
        faulty["lineage"] == clean["lineage"] and faulty["generations"][-1]["best"] == clean["generations"][-1]["best"]
    )
    assert stored(tmp_path / "faulty") == stored(tmp_path / "clean")  # retried, never stored twice
    world = Archive(tmp_path / "faulty", create=False).events("world_failure")
    assert len(world) > 20 and {e["category"] for e in world} == {"unreachable", "timeout", "rate_limit"}
    assert sum(r["world_failures"] for r in faulty["failures"].values()) == len(world)
    assert "world failures retried" in (tmp_path / "faulty" / "report.md").read_text()


def test_faults_past_the_retries_stop_the_run_without_a_blend(tmp_path, flaky, monkeypatch):
    from evolve.registry import llm_backends

    saved = llm_backends._objects.get("scripted")
    flaky(0.3)
    with pytest.raises(InfraError, match="injected fault") as e:
        evolve.run(toy(failures={"retries": 0}), out=tmp_path / "r")
    assert "kept failing" in str(e.value)
    assert not (tmp_path / "r" / "report.json").exists()  # no report made of a part of the run
    a = Archive(tmp_path / "r", create=False)
    assert all(t.infra is None and t.error is None for t in a.trajectories())  # only real results were kept
    # the world is back: the resumed run is the run without faults
    if saved is None:
        monkeypatch.delitem(llm_backends._objects, "scripted")
    else:
        monkeypatch.setitem(llm_backends._objects, "scripted", saved)
    report = evolve.run(toy(), out=tmp_path / "r", resume=True)
    clean = evolve.run(toy(), out=tmp_path / "clean")
    assert report_scores(report) == report_scores(clean)


class _DownRunner:
    """A runner under which the world is always down: every job comes back as a world failure."""

    workers = 4

    def __init__(self):
        self.batches: list[int] = []  # jobs handed over per run() call
        self.consumed: list[int] = []  # jobs the caller took results of

    def run(self, spec, jobs):
        from evolve.failures import infra
        from evolve.runners.base import failed_trajectory

        self.batches.append(len(jobs))
        self.consumed.append(0)
        for job in jobs:
            self.consumed[-1] += 1
            yield job, failed_trajectory(job, "down", infra=infra("unreachable", "connection refused"))


def test_a_server_that_is_down_is_probed_once_a_round_not_once_a_task():
    from evolve.runners import RolloutJob
    from evolve.scoring.retry import Retrying, RetryPolicy

    runner, waits, logs = _DownRunner(), [], []
    jobs = [RolloutJob(key=f"k{i}", system=System(), task={"id": f"t{i}"}) for i in range(20)]
    retrying = Retrying(
        runner, RetryPolicy(retries=3, backoff=1.0, max_backoff=3.0), log=logs.append, sleep=waits.append
    )
    with pytest.raises(InfraError, match="20 rollouts could not be run after 3 retries over 6.0s"):
        list(retrying.run(None, jobs))
    # the first batch is cut after 4 failures in a row (as many as the runner's workers); each retry
    # round sends one probe, which fails, so the other 19 wait; the waits double up to max_backoff
    assert runner.batches == [20, 1, 1, 1] and runner.consumed == [4, 1, 1, 1]
    assert waits == [1.0, 2.0, 3.0]
    assert any("holding the other 16 back" in m for m in logs) and sum("retry" in m for m in logs) == 3


def test_the_cli_exits_3_when_the_world_stays_down_and_says_how_to_resume(tmp_path):
    f = tmp_path / "task.yaml"
    f.write_text(yaml.safe_dump(_faulty(1.0, retries=1)))
    r = cli("run", str(f), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == 3, r.stderr
    assert "Traceback" not in r.stderr and "injected fault" in r.stderr
    assert f"--out {tmp_path / 'run'}" in r.stderr and "--resume" in r.stderr


# ----------------------------------------------------------------------------- the outage sequence over HTTP


def _http_task(port: int, runner: str, out: Path) -> dict:
    data = toy(agent="evolve.worlds.toy:agent", out=str(out), prompts={"instruction": "add"})  # right 2 times in 3
    data["models"]["policy"] = {
        "backend": "litellm",
        "name": "openai/toy",
        "params": {"api_base": f"http://127.0.0.1:{port}/v1", "max_retries": 0, "timeout": 5, "temperature": 0.0},
    }
    data["runner"] = {"name": runner, "workers": 2 if runner == "process" else 4, "timeout": 30}
    data["budget"] = {"generations": 2}
    return data


def _outage(tmp_path: Path, runner: str) -> None:
    port = free_port()
    server = FakeOpenAI(port, respond=toy_reply)
    ref = evolve.run(_http_task(port, runner, tmp_path / "ref"))  # the same run with the server up throughout
    server.close()  # the model server goes down
    task = _http_task(port, runner, tmp_path / "run")
    with pytest.raises(InfraError, match="unreachable") as e:
        evolve.run(task, overrides=["budget.generations=1"])
    assert "APIConnectionError" in str(e.value) or "Connection" in str(e.value)
    assert stored(tmp_path / "run") == 0  # no connection error was stored as a score
    server.start()  # it is back
    try:
        report = evolve.run(task, resume=True)
        assert report_scores(report) == report_scores(ref)  # the real baseline, no false gain
        assert report["baseline"]["val"]["score"] == ref["baseline"]["val"]["score"] > 0
        score_, n, _ = evolve.evaluate(_write(tmp_path, task), tmp_path / "run", system="baseline", split="test")
        assert (score_, n) == (ref["baseline"]["test"]["score"], ref["baseline"]["test"]["n"])
    finally:
        server.close()


def _write(tmp_path: Path, task: dict) -> Path:
    f = tmp_path / "task.yaml"
    f.write_text(yaml.safe_dump(task))
    return f


def test_an_outage_under_the_thread_runner_is_not_a_score(tmp_path, loopback_env):
    _outage(tmp_path, "thread")


@pytest.mark.slow
def test_an_outage_under_the_process_runner_is_not_a_score(tmp_path, loopback_env):
    _outage(tmp_path, "process")


# ----------------------------------------------------------------------------- total failure is never exit 0


def _raising_agent(task, ctx):
    raise KeyError("question")


def test_an_agent_that_fails_on_every_task_fails_the_run(tmp_path):
    with pytest.raises(RunFailed, match=r"baseline failed on 20 of 20 .*KeyError: 'question' \(20 times\)") as e:
        evolve.run(toy(), agent=_raising_agent, out=tmp_path / "r")
    assert "evolve archive show" in str(e.value)
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report["stop_reason"].startswith("failed:") and report["failures"]["val"]["failed"] == 20
    assert "test" not in report["baseline"]  # a failed run is not scored on test


@pytest.mark.parametrize(
    "reward, code, needle",
    [
        ("'str'", 1, "reward returned 'str'"),
        ("None", 1, "reward returned None"),
        ("numpy.float32(1.0)", 0, None),
    ],
)
def test_the_exit_code_says_whether_the_reward_worked(tmp_path, reward, code, needle):
    (tmp_path / "rew.py").write_text(f"import numpy\n\ndef reward(task, output):\n    return {reward}\n")
    f = tmp_path / "task.yaml"
    f.write_text(yaml.safe_dump(toy(reward="rew:reward", budget={"generations": 0})))
    r = cli("run", str(f), "--out", str(tmp_path / "run"), cwd=tmp_path)
    assert r.returncode == code, r.stderr
    assert "Traceback" not in r.stderr
    if needle:
        assert needle in r.stderr and "evolve archive show" in r.stderr
    else:
        assert "100.0%" in r.stdout


def test_an_unreachable_server_exits_3(tmp_path, loopback_env):
    task = _http_task(free_port(), "thread", tmp_path / "run")
    task["failures"]["retries"] = 1
    r = cli("run", str(_write(tmp_path, task)), cwd=tmp_path)
    assert r.returncode == 3 and "Traceback" not in r.stderr and "unreachable" in r.stderr, r.stderr


@pytest.mark.parametrize(
    "params, needle",
    [
        ({"api_key_env": "EVOLVE_NO_SUCH_KEY"}, "'EVOLVE_NO_SUCH_KEY' (api_key_env) is not set"),
        ({"temprature": 0.2}, "did you mean 'temperature'"),
    ],
)
def test_model_mistakes_are_found_before_the_run_directory_is_made(tmp_path, params, needle):
    task = _http_task(free_port(), "thread", tmp_path / "run")
    task["models"]["policy"]["params"].update(params)
    r = cli("run", str(_write(tmp_path, task)), cwd=tmp_path)
    assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not (tmp_path / "run").exists()


def test_a_missing_scripted_reply_is_found_before_the_run_directory_is_made(tmp_path):
    task = toy(out=str(tmp_path / "run"))
    task["models"]["policy"]["params"]["reply"] = "replies_that_are_not_there:reply"
    r = cli("run", str(_write(tmp_path, task)), cwd=tmp_path)
    assert r.returncode == 2 and "models.policy.params.reply" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists()


# ----------------------------------------------------------------------------- a dead worker process


def test_a_worker_that_dies_on_one_task_every_time_is_that_rollouts_failure(tmp_path):
    task = toy(
        agent="tests.helpers.agents:maybe_crash",
        reward="tests.helpers.agents:exact",
        dataset={"train": "t.jsonl", "val": "v.jsonl"},
        operators=[],
        budget={"generations": 0},
        models={"policy": {"backend": "scripted", "name": "s", "params": {"echo": True}}},
    )
    task["runner"] = {"name": "process", "workers": 2, "timeout": 30}
    task["failures"] = {"retries": 2, "backoff": 0.01}
    rows = [{"id": f"v{i}", "q": f"q{i}", "answer": f"q{i}", **({"crash": True} if i == 0 else {})} for i in range(6)]
    for name in ("t.jsonl", "v.jsonl"):
        (tmp_path / name).write_text("\n".join(json.dumps(r) for r in rows))
    report = evolve.run(task, base_dir=tmp_path, out=tmp_path / "r")
    assert report["baseline"]["val"]["score"] == pytest.approx(5 / 6, abs=1e-3)
    crashed = [t for t in Archive(tmp_path / "r", create=False).trajectories(split="val") if t.error]
    assert (
        len(crashed) == 1 and "worker process died" in crashed[0].error and "on each of 3 attempts" in crashed[0].error
    )
    assert len(Archive(tmp_path / "r", create=False).events("world_failure")) == 3


def test_an_archive_that_stored_an_outage_as_a_score_gives_it_up_and_eval_runs_it_again(tmp_path):
    """Archives written before this change stored a model's connection errors as scores of 0."""
    task = toy(prompts={"instruction": "add carefully"}, budget={"generations": 0})
    f = tmp_path / "task.yaml"
    f.write_text(yaml.safe_dump(task))
    evolve.run(f, out=tmp_path / "r")
    db = sqlite3.connect(tmp_path / "r" / "archive.sqlite")
    seq, data = db.execute(
        "SELECT t.seq, d.data FROM trajectories t JOIN trajectory_data d ON d.seq = t.seq "
        "WHERE t.split = 'test' ORDER BY t.seq LIMIT 1"
    ).fetchone()
    old = json.loads(data)
    old.update(
        output=None,
        reward={"score": 0.0, "components": {"failed": 1.0}, "feedback": "x", "error": None},
        error="agent raised LLMError: model 'openai/x' at http://127.0.0.1:1/v1: failed after 4 attempts in "
        "3.1s (retryable): APIConnectionError: litellm.APIConnectionError: Connection error.\n  tb",
    )
    for t in ("trajectories", "trajectory_data"):
        db.execute(f"DROP TRIGGER {t}_no_update")
    db.execute("UPDATE trajectory_data SET data = ? WHERE seq = ?", (json.dumps(old).encode(), seq))
    db.execute("UPDATE trajectories SET error = 1, score = 0 WHERE seq = ?", (seq,))
    db.execute("DELETE FROM schema_version")  # as evolvekit 0.1 left it
    db.execute("INSERT INTO schema_version (version, applied_at) VALUES (2, 0)")
    db.commit()
    db.close()
    score_, n, _ = evolve.evaluate(f, tmp_path / "r", system="baseline", split="test")
    assert (score_, n) == (1.0, 20)  # the outage was not served as a score: the task ran again
    events = Archive(tmp_path / "r", create=False).events("world_failure")
    assert len(events) == 1 and events[0]["category"] == "unreachable" and events[0]["trajectory"]["error"]


class _MutatorDown:
    """An operator whose own model (a mutating LLM) is unreachable."""

    name = "mutator_down"

    def propose(self, parent, ctx):
        raise LLMError(
            "model 'openai/mutator' at http://127.0.0.1:1/v1: failed after 4 attempts (retryable, "
            "unreachable): APIConnectionError: Connection error.",
            category="unreachable",
        )


def test_an_operator_whose_model_is_down_stops_the_run_as_the_world_failing(tmp_path, monkeypatch):
    from evolve.registry import operators

    monkeypatch.setitem(operators._objects, "mutator_down", _MutatorDown)
    with pytest.raises(InfraError, match="operator 'mutator_down': its model failed \\(unreachable\\)"):
        evolve.run(toy(operators=[{"name": "mutator_down"}]), out=tmp_path / "r")
