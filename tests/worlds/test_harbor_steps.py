"""world: harbor runs a multi-step task's step healthchecks as Harbor 0.26 does (its
``trial/multi_step.py``, ``environments/base.py``'s ``run_healthcheck``, ``trial/trial.py``'s
multi-step reward), on the sandbox backend (the docker backend runs the example task in
test_harbor_docker.py): after a step's workdir and setup.sh, before its agent; Docker's retry and
start-period rules; a step that fails it runs neither its agent nor its tests and stops the
others; the mean leaves it out and ``final`` has no reward (Harbor's metrics count 0); the first
step that cannot start is the world failing; a malformed table is an invalid task naming the
field."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from evolve.llm.fake import ScriptedLM
from evolve.rollout import run_agent
from evolve.types import ModelSpec, System
from evolve.worlds.harbor import load_task, nop, oracle
from evolve.worlds.harbor.check import check_task, trial
from evolve.worlds.harbor.environment.outcome import EnvironmentError_
from evolve.worlds.harbor.environment.phases import healthcheck
from evolve.worlds.harbor.task import TaskError
from tests.helpers.harbor import play, shells, use_sandbox, write

REPO = Path(__file__).parents[2]
TALLY = REPO / "examples" / "harbor_shapes" / "tally-in-steps"
REWARD = (
    "mkdir -p /logs/verifier; if {cond}; then echo 1 > /logs/verifier/reward.txt; else echo 0 > "
    "/logs/verifier/reward.txt; fi\n"
)
GOOD_TOOL = (
    "```bash\ncat > /app/tally.py <<'PY'\nimport sys, collections\nt = collections.Counter()\n"
    "for l in open(sys.argv[1]):\n    if l.strip():\n        n, a = l.split()\n        t[n] += int(a)\n"
    "for n in sorted(t):\n    print(n, t[n])\nPY\n```"
)


@pytest.fixture(autouse=True)
def sandbox_backend(monkeypatch):
    use_sandbox(monkeypatch)


def two_steps(root: Path, check: str = "", top: str = "", first: str = "", setup: str | None = None) -> Path:
    """Step one: make /app/a; step two (``check``: its healthcheck table's lines): make /app/b."""
    files = {
        "task.toml": f'{top}[[steps]]\nname = "one"\n{first}\n[[steps]]\nname = "two"\n'
        + (f"[steps.healthcheck]\n{check}\n" if check else ""),
        "environment/Dockerfile": "FROM python:3.11-slim\nWORKDIR /app\n",
        "steps/one/instruction.md": "Create /app/a.\n",
        "steps/one/tests/test.sh": "#!/bin/bash\n" + REWARD.format(cond="[ -f /app/a ]"),
        "steps/one/solution/solve.sh": "#!/bin/bash\ntouch /app/a\n",
        "steps/two/instruction.md": "Create /app/b.\n",
        "steps/two/tests/test.sh": "#!/bin/bash\n" + REWARD.format(cond="[ -f /app/b ]"),
        "steps/two/solution/solve.sh": "#!/bin/bash\ntouch /app/b\n",
    }
    if setup is not None:
        files["steps/two/workdir/setup.sh"] = "#!/bin/bash\n" + setup + "\n"
    return write(root, files)


def world_agent(fn, task: dict):
    system = System(models={"policy": ModelSpec(backend="scripted", name="m")})
    return run_agent(fn, system, task, lambda s, r: ScriptedLM("m", ["DONE"]))


def asked(traj) -> list[str]:
    return [s.messages[-1].content for s in traj.steps if s.kind == "llm"]


# ----------------------------------------------------------------------------- the example task


def test_the_example_runs_its_step_healthcheck_and_scores_as_harbor():
    """tally-in-steps: the report step's healthcheck runs step one's tool on the step's own data
    (copied in from its workdir). The oracle scores 1; nop (no tool) fails the healthcheck, so the
    report step's agent and tests never run and the score is step one's alone; a tool that works
    gets the report step's agent, asked its own instruction; a tool that crashes does not."""
    t = {**load_task(TALLY), "backend": "sandbox"}
    hc = t["steps"][1]["healthcheck"]
    assert t["steps"][0]["healthcheck"] is None
    assert hc == {
        "command": "python3 /app/tally.py /app/sales.txt > /dev/null",
        "interval_sec": 0.5,
        "timeout_sec": 10.0,
        "start_period_sec": 0.0,
        "start_interval_sec": 5.0,
        "retries": 2,
    }
    assert world_agent(oracle, t).output["verifier"]["score"] == 1.0
    v = world_agent(nop, t).output["verifier"]
    assert v["score"] == 0.0 and v["components"] == {"reward": 0.0}
    assert [s.get("failed") for s in v["steps"]] == [None, "healthcheck"] and "components" not in v["steps"][1]
    assert (
        "step 'report': its healthcheck failed before its agent (its healthcheck failed after 2 consecutive "
        "retries: python3 /app/tally.py /app/sales.txt > /dev/null (exit 2, output: "
    ) in v["stopped"]

    half = play(t, [GOOD_TOOL, "DONE", "DONE"])
    assert half.infra is None and half.score == 0.5, (half.infra, half.reward)
    assert asked(half)[-1].endswith("SUM the sum of all the amounts.") and "this week's sales" in asked(half)[-1]
    assert [s["step"] for s in half.output["verifier"]["steps"]] == ["tool", "report"]

    crash = play(
        t,
        [
            "```bash\necho 'raise SystemExit(3)' > /app/tally.py\n```",
            "DONE",
            "```bash\ntouch /app/report.txt\n```",
            "DONE",
        ],
    )
    assert crash.infra is None and crash.score == 0.0
    assert len(asked(crash)) == 2 and not any("report.txt" in a for a in asked(crash))
    assert "its healthcheck failed after 2 consecutive retries" in crash.reward.feedback
    assert "(exit 3)" in crash.output["verifier"]["stopped"]


# ----------------------------------------------------------------------------- what a failed healthcheck does


def test_a_later_steps_failed_healthcheck_is_left_out_of_the_mean_and_is_final_s_nothing(tmp_path):
    """Harbor's mean is over the steps with a verifier result, so step one's 1 stands alone; with
    ``final`` the last step has none: Harbor's reward is none (its metrics count 0)."""
    check = 'command = "test -f /app/ready"\ninterval_sec = 0.05\nretries = 2\n'
    t = load_task(two_steps(tmp_path / "m", check))
    only_a = play(t, ["```bash\ntouch /app/a\n```", "DONE", "```bash\ntouch /app/b\n```", "DONE"])
    v = only_a.output["verifier"]
    assert only_a.score == 1.0 and v["components"] == {"reward": 1.0}, v
    assert v["source"] == "1 step(s) verified, 1 failed before its agent, mean" and len(asked(only_a)) == 2
    both = play(t, ["```bash\ntouch /app/a /app/ready\n```", "DONE", "DONE"])
    assert both.score == 0.5 and [s["step"] for s in both.output["verifier"]["steps"]] == ["one", "two"]

    final = {
        **load_task(two_steps(tmp_path / "f", check, top='multi_step_reward_strategy = "final"\n')),
        "backend": "sandbox",
    }
    lost = play(final, ["```bash\ntouch /app/a\n```", "DONE"])
    assert lost.infra is None and lost.score == 0.0 and lost.reward.components == {}
    assert "has no rewards: Harbor's reward is none, counted 0" in lost.output["verifier"]["source"]
    assert trial(final, "sandbox", solve=False)["reward"] is None  # as Harbor's trial result records it
    assert trial(final, "sandbox", solve=True)["reward"] is None  # solve.sh of step one makes no /app/ready


def test_a_later_steps_failed_setup_sh_stops_the_steps_as_a_healthcheck_does(tmp_path):
    t = load_task(two_steps(tmp_path, setup="echo 'no seed here' >&2; exit 4"))
    traj = play(t, ["```bash\ntouch /app/a\n```", "DONE", "```bash\ntouch /app/b\n```", "DONE"])
    v = traj.output["verifier"]
    assert traj.infra is None and traj.score == 1.0 and v["steps"][1]["failed"] == "setup"
    assert "steps/two/workdir/setup.sh exited 4: 'no seed here'" in v["stopped"] and len(asked(traj)) == 2


def test_a_first_step_that_cannot_start_is_the_world_failing(tmp_path):
    """Nothing an agent did can fail step one's healthcheck: the world failing (never a score),
    which the check reports by Harbor's exception type."""
    d = two_steps(
        tmp_path, first='[steps.healthcheck]\ncommand = "echo not ready; exit 1"\ninterval_sec = 0\nretries = 1\n'
    )
    t = load_task(d)
    traj = play(t, ["```bash\ntouch /app/a\n```", "DONE"])
    assert traj.infra is not None and "the first step cannot start" in str(traj.infra)
    verdict = check_task(t, "sandbox", cache=False)
    assert verdict["status"] == "broken" and verdict["trials"]["nop"]["exception_type"] == "HealthcheckError"
    assert (
        "its healthcheck failed after 1 consecutive retries: echo not ready; exit 1 (exit 1, output: 'not ready')"
        in verdict["why"]
    )


def test_a_healthcheck_passes_once_it_exits_0_in_the_real_environment(tmp_path):
    """Each try runs in the step's environment, from the working directory, after setup.sh: this
    one passes on its third try (retries = 3), and with retries = 2 fails the step."""
    counter = 'command = "n=$(cat tries 2>/dev/null || echo 0); echo $((n+1)) > tries; [ $n -ge 2 ] && [ -f seeded ]"\n'
    t = load_task(two_steps(tmp_path / "ok", counter + "interval_sec = 0.05\nretries = 3\n", setup="touch seeded"))
    traj = play(t, ["```bash\ntouch /app/a\n```", "DONE", "```bash\ncat /app/tries; touch /app/b\n```", "DONE"])
    assert traj.score == 1.0 and traj.output["verifier"].get("stopped") is None
    assert shells(traj)[-1]["stdout"].strip() == "3"
    short = load_task(
        two_steps(tmp_path / "short", counter + "interval_sec = 0.05\nretries = 2\n", setup="touch seeded")
    )
    assert (
        play(short, ["```bash\ntouch /app/a\n```", "DONE", "DONE"]).output["verifier"]["steps"][1]["failed"]
        == "healthcheck"
    )


# ----------------------------------------------------------------------------- Docker's retry rules


class _Env:
    """Answers each healthcheck try from ``codes`` (None: the try timed out) and records them."""

    def __init__(self, codes: list[int | None]) -> None:
        self.codes, self.tries, self.task = list(codes), 0, {"id": "t"}

    def sh(self, command: str, *, timeout: float | None, user: str | None = None) -> SimpleNamespace:
        code = self.codes[self.tries]
        self.tries += 1
        return SimpleNamespace(exit_code=code if code is not None else -1, timed_out=code is None, stdout="", stderr="")


def _run(codes: list[int | None], **hc) -> tuple[str | None, _Env, list[float]]:
    env, slept, now = _Env(codes), [], [0.0]

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    step = {
        "name": "s",
        "agent_user": None,
        "healthcheck": {
            "command": "probe",
            "interval_sec": 5.0,
            "timeout_sec": 30.0,
            "start_period_sec": 0.0,
            "start_interval_sec": 1.0,
            "retries": 3,
            **hc,
        },
    }
    return healthcheck(env, step, sleep=sleep, clock=lambda: now[0]), env, slept


def test_retries_count_consecutive_failures_after_the_start_period():
    why, env, slept = _run([1, 1, 0])
    assert why is None and env.tries == 3 and slept == [5.0, 5.0]
    why, env, slept = _run([1, 1, 1, 0])
    assert why == "its healthcheck failed after 3 consecutive retries: probe (exit 1)" and env.tries == 3
    assert slept == [5.0, 5.0]
    why, env, _ = _run([1], retries=0)
    assert why is not None and env.tries == 1
    # within the 2.5 s start period failures do not count (tries at 0, 1, 2 s), then three more may fail
    why, env, slept = _run([1, 1, 1, 1, 1, 0], start_period_sec=2.5)
    assert why is None and env.tries == 6 and slept == [1.0, 1.0, 1.0, 5.0, 5.0]
    why, env, _ = _run([1, 1, 1, 1, 1, 1], start_period_sec=2.5)
    assert why is not None and env.tries == 6
    with pytest.raises(
        EnvironmentError_,
        match=r"step 's': its healthcheck 'probe' did not finish within its "
        r"timeout_sec \(30 s\)",
    ):
        _run([1, None])


# ----------------------------------------------------------------------------- a malformed table


@pytest.mark.parametrize(
    "table, needle",
    [
        ('healthcheck = "true"', "[[steps]] 'two' healthcheck must be a table"),
        ("[steps.healthcheck]\ninterval_sec = 1", "[[steps]] 'two' healthcheck: command must be a shell command"),
        ('[steps.healthcheck]\ncommand = "  "', "command must be a shell command"),
        (
            '[steps.healthcheck]\ncommand = "true"\nretries = -1',
            "retries must be a whole number from 0 to 1000, got -1",
        ),
        (
            '[steps.healthcheck]\ncommand = "true"\nretries = 1.5',
            "retries must be a whole number from 0 to 1000, got 1.5",
        ),
        (
            '[steps.healthcheck]\ncommand = "true"\ninterval_sec = "5"',
            "interval_sec must be a non-negative number of seconds up to a day (86400), got '5'",
        ),
        ('[steps.healthcheck]\ncommand = "true"\ntimeout_sec = 0', "timeout_sec must be a positive number"),
        (
            '[steps.healthcheck]\ncommand = "true"\nstart_period_sec = 1e6',
            "start_period_sec must be a non-negative number of seconds up to a day",
        ),
        ('[steps.healthcheck]\ncommand = "true"\nintervall_sec = 1', "unknown key 'intervall_sec'"),
    ],
)
def test_a_malformed_healthcheck_is_an_invalid_task_naming_the_field(tmp_path, table, needle):
    d = two_steps(tmp_path)
    (d / "task.toml").write_text((d / "task.toml").read_text() + table + "\n")
    with pytest.raises(TaskError) as e:
        load_task(d)
    assert e.value.status == "invalid" and needle in str(e.value), str(e.value)


def test_the_mean_is_each_keys_over_the_verified_steps_only():
    """Harbor's ``_aggregate_step_rewards``: a key a verified step lacks counts 0, a step that
    failed before its agent is out of the denominator; no verified step is no reward (0 here)."""
    from evolve.worlds.harbor.environment.outcome import aggregate

    a = {"step": "a", "components": {"reward": 1.0, "style": 1.0}, "exit_code": 0, "output": "ok", "seconds": 1.0}
    b = {"step": "b", "components": {"reward": 0.0}, "exit_code": 1, "output": "no", "seconds": 2.0}
    c = {"step": "c", "failed": "setup", "kind": "RuntimeError", "reason": "setup.sh exited 1"}
    v = aggregate({}, [a, b, c])
    assert (v["score"], v["components"], v["exit_code"]) == (0.5, {"reward": 0.5, "style": 0.5}, 1)
    assert v["output"].endswith("[c] setup failed: setup.sh exited 1") and v["seconds"] == 3.0
    assert aggregate({"multi_step_reward_strategy": "final"}, [a, b])["components"] == {"reward": 0.0}
    assert (aggregate({}, [c])["score"], aggregate({}, [c])["components"]) == (0.0, {})
