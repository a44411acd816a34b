"""Runners: one scored trajectory per job, failures recorded, hangs and crashes survived."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest

from evolve.errors import UserError
from evolve.llm.fake import ScriptedLM
from evolve.runners import ProcessRunner, RolloutJob, Runner, ThreadRunner, Worker, WorkerSpec
from evolve.types import LLMCall, ModelSpec, System, Trajectory

TESTS = str(Path(__file__).parents[1])

SYSTEM = System(models={"policy": ModelSpec(backend="scripted", name="echo", params={"echo": True})})


def spec(
    tmp_path: Path, agent: str = "tests.helpers.agents:one_step", reward: str = "tests.helpers.agents:exact"
) -> WorkerSpec:
    return WorkerSpec(agent=agent, reward=reward, artifacts_root=str(tmp_path / "artifacts"), search_path=TESTS)


def jobs(tasks: list[dict], timeout: float | None = None, system: System = SYSTEM) -> list[RolloutJob]:
    return [RolloutJob(key=f"k/{t['id']}", system=system, task=t, seed=i, timeout=timeout) for i, t in enumerate(tasks)]


def tasks(n: int, **extra) -> list[dict]:
    return [{"id": f"t{i}", "q": f"q{i}", "answer": f"q{i}", **extra} for i in range(n)]


def collect(runner, spec_, js) -> dict[str, object]:
    out = {}
    for job, traj in runner.run(spec_, js):
        assert job.key not in out, "a job came back twice"
        out[job.key] = traj
    assert set(out) == {j.key for j in js}
    return out


def is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie (killed, waiting for a reaper that may not exist in a container) is gone too
        return Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


@pytest.fixture(params=["thread", "process"])
def runner(request):
    r = ThreadRunner(workers=4, grace=0.3) if request.param == "thread" else ProcessRunner(workers=2, grace=0.3)
    yield r
    r.close()


# ----------------------------------------------------------------------------- both runners


def test_one_scored_trajectory_per_job(runner, tmp_path):
    assert isinstance(runner, Runner)
    js = jobs(tasks(20))
    out = collect(runner, spec(tmp_path), js)
    for job in js:
        traj = out[job.key]
        assert traj.ok and traj.score == 1.0 and traj.reward is not None
        assert traj.task_id == job.task["id"] and traj.system_id == SYSTEM.id
        (step,) = traj.steps
        assert isinstance(step, LLMCall) and step.output == job.task["q"] and step.token_ids
    # a second run on the same runner reuses its workers
    assert len(collect(runner, spec(tmp_path), jobs(tasks(3)))) == 3


def test_agent_and_reward_failures_are_recorded(runner, tmp_path):
    ts = tasks(6)
    ts[1]["boom"] = True
    ts[2]["boom_reward"] = True
    out = collect(
        runner, spec(tmp_path, "tests.helpers.agents:boom_agent", "tests.helpers.agents:boom_reward"), jobs(ts)
    )
    bad = out["k/t1"]
    assert not bad.ok and "ValueError: agent exploded on t1" in bad.error and bad.score == 0.0
    assert bad.reward.components == {"failed": 1.0}
    r = out["k/t2"]
    assert r.ok and r.reward.error and "RuntimeError: reward exploded" in r.reward.error and r.score == 0.0
    assert all(out[f"k/t{i}"].score == 1.0 for i in (0, 3, 4, 5))


def test_empty_job_list(runner, tmp_path):
    assert list(runner.run(spec(tmp_path), [])) == []


# ----------------------------------------------------------------------------- thread runner


def test_thread_runner_watchdog_abandons_a_hanging_agent(tmp_path):
    runner = ThreadRunner(workers=2, grace=0.3)
    ts = tasks(6)
    ts[0]["hang"] = True
    t0 = time.monotonic()
    order = []
    for job, traj in runner.run(spec(tmp_path, "tests.helpers.agents:maybe_hang"), jobs(ts, timeout=0.5)):
        order.append((job.key, traj, time.monotonic() - t0))
    assert len(order) == 6 and len({k for k, _, _ in order}) == 6
    key, traj, at = order[-1]
    assert key == "k/t0" and traj.error.startswith("timeout:") and "abandoned" in traj.error
    assert traj.score == 0.0 and 0.8 <= at < 4.0
    assert all(t.ok for k, t, _ in order[:-1])
    assert runner.abandoned == 1
    # the runner goes on
    assert all(
        t.ok
        for t in collect(
            runner, spec(tmp_path, "tests.helpers.agents:maybe_hang"), jobs(tasks(4), timeout=0.5)
        ).values()
    )
    runner.close()


def test_thread_runner_cooperative_deadline_and_system_exit(tmp_path):
    slow = ScriptedLM("slow", delay=0.2)
    system = System(models={"policy": ModelSpec(backend="slow-test", name="slow")})

    def two_calls(task, ctx):
        ctx.llm("policy").complete([{"role": "user", "content": "a"}])
        ctx.llm("policy").complete([{"role": "user", "content": "b"}])  # past the deadline: checked, raises
        return "done"

    from evolve.registry import llm_backends

    llm_backends.register("slow-test", lambda spec, artifacts: slow)
    runner = ThreadRunner(workers=2, grace=5)
    out = collect(
        runner,
        WorkerSpec(two_calls, lambda t, o: 1.0, str(tmp_path)),
        [RolloutJob("a", system, {"id": "a"}, timeout=0.1)],
    )
    assert out["a"].error.startswith("timeout:") and len(out["a"].steps) == 1  # the first call was recorded
    out = collect(runner, spec(tmp_path, "tests.helpers.agents:exit_agent"), jobs(tasks(2)))
    assert all("SystemExit" in t.error for t in out.values())
    runner.close()


def test_thread_runner_accepts_callables_and_early_break(tmp_path):
    runner = ThreadRunner(workers=3)
    s = WorkerSpec(agent=lambda task, ctx: task["q"], reward=lambda task, out: 0.5, artifacts_root=str(tmp_path))
    it = runner.run(s, jobs(tasks(50)))
    first = next(it)
    assert first[1].score == 0.5
    it.close()  # abandoning the iterator must not hang or leak an error
    assert len(collect(runner, s, jobs(tasks(5)))) == 5
    assert runner.worker is not None and runner.worker.spec == s
    runner.close()


def test_thread_runner_bad_agent_path_raises_at_run(tmp_path):
    with pytest.raises(UserError, match="no_such_module"):
        ThreadRunner().run(spec(tmp_path, "no_such_module:agent"), jobs(tasks(1)))


def test_thread_runner_throughput(tmp_path):
    """Trivial rollouts through the thread runner (ScriptedLM, one step, scored)."""
    system = System(models={"policy": ModelSpec(backend="scripted", name="r", params={"responses": ["q"]})})
    js = jobs(tasks(2000), system=system, timeout=60)
    runner = ThreadRunner(workers=32)
    collect(runner, spec(tmp_path), js[:100])  # warm up
    t0 = time.perf_counter()
    n = sum(1 for _ in runner.run(spec(tmp_path), js))
    rate = n / (time.perf_counter() - t0)
    runner.close()
    print(f"thread runner: {rate:.0f} rollouts/s")
    assert n == 2000 and rate > 500  # ~4,000-8,000/s on an idle 2-core machine


# ----------------------------------------------------------------------------- the shared loop


class _ScriptedPool:
    """A pool for the scheduling loop whose workers are scripted by the task: "ok" finishes, "die"
    kills its worker, "unsendable" cannot be sent, "hang" never returns."""

    noun, verb, aftermath, reports_start = "scripted worker", "killed", "it was replaced", True

    def __init__(self) -> None:
        self.slots, self.replaced, self.started, self.killed = [], 0, 0, 0
        self._busy = []

    def start(self):
        from evolve.runners.schedule import Slot

        slot = Slot()
        slot.ready = True
        self.slots.append(slot)
        self.started += 1
        return slot

    def submit(self, slot, job):
        if job.task["do"] == "unsendable":
            raise TypeError("cannot pickle")
        slot.started_at = time.monotonic()
        self._busy.append(slot)
        return True

    def wait(self, timeout):
        from evolve.runners.schedule import Finished

        out = []
        for slot in list(self._busy):
            do = slot.job.task["do"]
            if do == "hang":
                continue
            self._busy.remove(slot)
            if do == "die":
                self.slots.remove(slot)
                out.append(Finished(slot, None, "scripted worker died (exit code 9)"))
            else:
                out.append(Finished(slot, Trajectory(task_id=slot.job.task["id"], system_id=slot.job.system.id)))
        if not out:
            time.sleep(timeout)
        return out

    def kill(self, slot):
        self.killed += 1
        if slot in self._busy:
            self._busy.remove(slot)
        self.slots.remove(slot)

    def not_ready(self, slot):
        raise AssertionError("scripted workers are ready at once")


def test_the_shared_loop_fails_what_goes_wrong_and_yields_every_job_once():
    from evolve.runners.schedule import schedule

    pool = _ScriptedPool()
    dos = ["ok", "die", "ok", "unsendable", "hang", "ok"]
    js = [RolloutJob(key=f"k/{i}", system=SYSTEM, task={"id": str(i), "do": d}, timeout=0.2) for i, d in enumerate(dos)]
    out = {job.key: traj for job, traj in schedule(pool, js, run=1, workers=2, grace=0.1, start_timeout=5)}
    assert sorted(out) == sorted(j.key for j in js)
    assert all(out[f"k/{i}"].error is None for i in (0, 2, 5))
    died = out["k/1"]
    assert died.error == "scripted worker died (exit code 9) while running this rollout" and died.infra is not None
    assert died.infra.category == "worker" and died.infra.retryable
    assert out["k/3"].error == "runner: cannot send the job to a scripted worker: TypeError: cannot pickle"
    assert re.fullmatch(
        r"timeout: killed after [\d.]+s \(limit 0.2s \+ 0.1s grace\); it was replaced", out["k/4"].error
    )
    assert out["k/4"].infra is None  # a hung agent is the agent's fault, not the world's
    assert pool.replaced == 2 and pool.killed == 1 and len(pool.slots) <= 2
    # an iterator left early kills the workers still busy with its jobs
    it = schedule(
        pool,
        [RolloutJob("h", SYSTEM, {"id": "h", "do": "hang"}), RolloutJob("o", SYSTEM, {"id": "o", "do": "ok"})],
        run=2,
        workers=2,
        grace=0.1,
        start_timeout=5,
    )
    assert next(it)[0].key == "o"
    it.close()
    assert pool.killed == 2 and not pool._busy


# ----------------------------------------------------------------------------- worker


def test_worker_caches_llms_per_spec_and_closes_them(tmp_path):
    w = Worker(spec(tmp_path))
    a = w.llm(SYSTEM, "policy")
    same = System(
        models={"policy": ModelSpec(backend="scripted", name="echo", params={"echo": True})}, prompts={"x": "y"}
    )
    other = System(models={"policy": ModelSpec(backend="scripted", name="other", params={"echo": True})})
    assert w.llm(same, "policy") is a and w.llm(other, "policy") is not a
    b = w.llm(other, "policy")
    w.close()
    assert a.closed and b.closed


def test_seeded_sampling_is_reproducible_and_varies_with_seed(tmp_path):
    system = System(
        models={
            "policy": ModelSpec(backend="scripted", name="s", params={"reply": "tests.helpers.agents:seeded_reply"})
        }
    )
    w = Worker(spec(tmp_path))
    task = {"id": "x", "q": "hi", "answer": "HI"}

    def out(seed, temperature=None):
        return w.execute(RolloutJob("x", system, task, seed=seed, temperature=temperature)).output

    assert out(1) == out(2) == "HI"  # greedy
    assert out(1, 1.0) == out(1, 1.0) != out(2, 1.0)
    assert w.execute(RolloutJob("x", system, task)).score == 1.0
    w.close()


def test_task_without_id_is_a_failed_trajectory_not_a_crash(tmp_path):
    w = Worker(spec(tmp_path))
    traj = w.execute(RolloutJob("k", SYSTEM, {"q": "x"}))
    assert traj.error and traj.error.startswith("runner: KeyError") and traj.task_id == "k" and traj.score == 0.0


# ----------------------------------------------------------------------------- process runner


def test_process_runner_kills_a_hanging_agent_and_its_children(tmp_path):
    pid_file = tmp_path / "pids"
    runner = ProcessRunner(workers=2, grace=0.3)
    ts = tasks(5)
    ts[0].update(hang=True, child=True, pid_file=str(pid_file))
    t0 = time.monotonic()
    out = collect(runner, spec(tmp_path, "tests.helpers.agents:maybe_hang"), jobs(ts, timeout=0.5))
    elapsed = time.monotonic() - t0
    bad = out["k/t0"]
    assert bad.error.startswith("timeout: killed after") and bad.score == 0.0
    assert all(out[f"k/t{i}"].ok for i in range(1, 5))
    pids = [int(x) for x in pid_file.read_text().split()]
    assert len(pids) == 2  # the worker and the `sleep` it started
    deadline = time.monotonic() + 3
    while not all(is_gone(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(is_gone(p) for p in pids), pids
    assert runner.restarts == 1 and elapsed < 10
    # the runner goes on with a fresh worker
    assert all(
        t.ok
        for t in collect(runner, spec(tmp_path, "tests.helpers.agents:maybe_hang"), jobs(tasks(3), timeout=5)).values()
    )
    runner.close()


def test_process_runner_survives_a_worker_crash(tmp_path):
    runner = ProcessRunner(workers=1, grace=0.3)
    ts = tasks(6)
    ts[1]["crash"] = True
    ts[3]["segv"] = True
    out = collect(runner, spec(tmp_path, "tests.helpers.agents:maybe_crash"), jobs(ts))
    crashed = out["k/t1"]
    assert "worker process died (exit code 3)" in crashed.error and crashed.score == 0.0
    assert "worker process died (killed by SIGSEGV)" in out["k/t3"].error
    assert all(out[f"k/t{i}"].ok and out[f"k/t{i}"].score == 1.0 for i in (0, 2, 4, 5))
    assert runner.restarts == 2
    # SystemExit inside an agent is a failed rollout, not a dead worker
    out = collect(runner, spec(tmp_path, "tests.helpers.agents:exit_agent"), jobs(tasks(2)))
    assert all("SystemExit" in t.error for t in out.values()) and runner.restarts == 2
    runner.close()
    assert runner._pool.slots == []


def test_process_runner_needs_import_paths(tmp_path):
    runner = ProcessRunner(workers=1)
    with pytest.raises(UserError, match="import path"):
        runner.run(WorkerSpec(lambda t, c: 1, "tests.helpers.agents:exact", str(tmp_path)), jobs(tasks(1)))
    # a module-level function is turned into its import path
    from tests.helpers.agents import exact, one_step

    out = collect(runner, WorkerSpec(one_step, exact, str(tmp_path), TESTS), jobs(tasks(2)))
    assert all(t.score == 1.0 for t in out.values())
    runner.close()


def test_process_runner_reports_an_agent_that_cannot_be_imported(tmp_path):
    runner = ProcessRunner(workers=1)
    with pytest.raises(UserError, match="no_such_module"):
        list(runner.run(spec(tmp_path, "no_such_module:agent"), jobs(tasks(2))))
    runner.close()


def test_process_runner_abandoned_iterator_kills_busy_workers(tmp_path):
    pid_file = tmp_path / "pids"
    runner = ProcessRunner(workers=2)
    ts = tasks(2)
    ts[1].update(hang=True, pid_file=str(pid_file))
    it = runner.run(spec(tmp_path, "tests.helpers.agents:maybe_hang"), jobs(ts))  # no timeout: it would hang forever
    job, traj = next(it)
    assert job.key == "k/t0" and traj.ok
    deadline = time.monotonic() + 10
    while not pid_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    it.close()
    (pid,) = [int(x) for x in pid_file.read_text().split()]
    assert is_gone(pid)
    runner.close()


def test_process_runner_gives_up_on_workers_that_die_at_start(tmp_path):
    (tmp_path / "dies_on_import.py").write_text("import os\nos._exit(7)\n")
    runner = ProcessRunner(workers=1)
    s = WorkerSpec("dies_on_import:agent", "tests.helpers.agents:exact", str(tmp_path), search_path=str(tmp_path))
    with pytest.raises(UserError, match=r"keep dying before they are ready \(exit code 7"):
        list(runner.run(s, jobs(tasks(2))))
    runner.close()


def test_a_job_that_reads_no_log_probs_says_so_to_the_rollout_and_its_model(runner, tmp_path):
    """``RolloutJob.logprobs=False`` (STaR's samples) reaches the rollout's context in a worker
    thread or process; a model call then passes ``logprobs=False`` to a backend that takes it, none
    to one that does not, and an agent's OpenAI request that asks for them still gets them."""
    from evolve.llm.base import Completion
    from evolve.rollout import run_agent

    js = [RolloutJob(key=f"k/{t['id']}", system=SYSTEM, task=t, logprobs=i % 2 == 0) for i, t in enumerate(tasks(4))]
    out = collect(runner, spec(tmp_path, agent="tests.helpers.agents:logprobs_wanted"), js)
    assert [out[j.key].output for j in js] == [True, False, True, False]

    seen: list[dict] = []

    class Takes:
        name = "takes"

        def complete(self, messages, *, temperature=None, max_tokens=None, stop=None, seed=None, logprobs=True):
            seen.append({"logprobs": logprobs})
            return Completion(text="x", model=self.name)

    class Plain:
        name = "plain"

        def complete(self, messages, *, temperature=None, max_tokens=None, stop=None, seed=None):
            seen.append({})
            return Completion(text="x", model=self.name)

    def agent(task, ctx):
        ctx.llm().complete([{"role": "user", "content": "q"}])
        ctx.llm().complete([{"role": "user", "content": "q"}], logprobs=True)  # what the rollout route passes
        return "x"

    for backend, wanted, calls in [
        (Takes(), True, [{"logprobs": True}] * 2),
        (Takes(), False, [{"logprobs": False}, {"logprobs": True}]),
        (Plain(), False, [{}, {}]),
    ]:
        seen.clear()
        traj = run_agent(agent, SYSTEM, {"id": "t"}, lambda system, role, b=backend: b, logprobs=wanted)
        assert traj.error is None and seen == calls
    # top_logprobs only reaches a backend that takes it; asking another is the agent's request error, not the world's
    seen.clear()
    traj = run_agent(
        lambda task, ctx: ctx.llm().complete([{"role": "user", "content": "q"}], top_logprobs=2).text,
        SYSTEM,
        {"id": "t"},
        lambda system, role: Plain(),
    )
    assert seen == [] and "takes no top_logprobs" in traj.error and traj.infra is None


def test_a_jobs_token_cap_reaches_the_rollout_and_caps_every_call(runner, tmp_path):
    """``RolloutJob.max_tokens`` (STaR's capped samples) reaches the rollout's context in a worker,
    thread or process; each model call then asks for at most that many tokens, whatever the agent asked."""
    from evolve.llm.base import Completion
    from evolve.rollout import run_agent

    js = [
        RolloutJob(key=f"k/{t['id']}", system=SYSTEM, task=t, max_tokens=None if i else 7)
        for i, t in enumerate(tasks(2))
    ]
    out = collect(runner, spec(tmp_path, agent="tests.helpers.agents:max_tokens_cap"), js)
    assert [out[j.key].output for j in js] == [7, None]

    seen: list = []

    class Backend:
        name = "b"

        def complete(self, messages, *, temperature=None, max_tokens=None, stop=None, seed=None):
            seen.append(max_tokens)
            return Completion(text="x", model=self.name)

    def agent(task, ctx):
        for asked in (None, 500, 10):
            ctx.llm().complete([{"role": "user", "content": "q"}], max_tokens=asked)
        return "x"

    for cap, calls in [(64, [64, 64, 10]), (None, [None, 500, 10])]:
        seen.clear()
        traj = run_agent(agent, SYSTEM, {"id": "t"}, lambda system, role: Backend(), max_tokens=cap)
        assert traj.error is None and seen == calls
