"""world: harbor runs a task as Harbor's own source runs it (harbor 0.26: models/task/config.py,
verifier/verifier.py, agents/oracle.py and nop.py, trial/), here on the sandbox backend (no engine
needed; the docker backend's are in test_harbor_docker.py): test.sh by its own shebang with its
output kept, multi-step tasks sequenced and scored, Harbor's defaults, the oracle and nop agents,
what the sandbox cannot carry out refused by name, and the shell's state between commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from evolve.errors import InfraError
from evolve.llm.fake import ScriptedLM
from evolve.rollout import run_agent, score
from evolve.types import ModelSpec, System
from evolve.worlds.harbor import load_task, nop, oracle, reward
from evolve.worlds.harbor.check import check_task
from evolve.worlds.harbor.environment import open_environment
from evolve.worlds.harbor.task import TaskError, UnsupportedTask
from tests.helpers.harbor import play, shells, use_sandbox, write

REPO = Path(__file__).parents[2]
REWARD = (
    "mkdir -p /logs/verifier; if {cond}; then echo 1 > /logs/verifier/reward.txt; else echo 0 > "
    "/logs/verifier/reward.txt; echo 'not yet'; fi\n"
)


@pytest.fixture(autouse=True)
def sandbox_backend(monkeypatch):
    use_sandbox(monkeypatch)


def single(
    root: Path,
    name: str = "t",
    toml: str = "",
    test: str | None = None,
    solve: str = "echo ok > /app/out.txt",
    dockerfile: str = "FROM python:3.11-slim\nWORKDIR /app\n",
) -> Path:
    return write(
        root / name,
        {
            "instruction.md": "Write ok to /app/out.txt.\n",
            "task.toml": toml,
            "environment/Dockerfile": dockerfile,
            "tests/test.sh": test or "#!/bin/bash\n" + REWARD.format(cond='[ "$(cat /app/out.txt 2>/dev/null)" = ok ]'),
            "solution/solve.sh": "#!/bin/bash\n" + solve + "\n",
        },
    )


def steps_task(root: Path, toml_extra: str = "", first_min: str = "") -> Path:
    """Two steps: make /app/a (its own tests and solution), then /app/b (the shared tests/test.sh,
    its own verifier env, a workdir with setup.sh)."""
    return write(
        root / "steps",
        {
            "task.toml": f'{toml_extra}[[steps]]\nname = "one"\n{first_min}\n[[steps]]\nname = "two"\n'
            '[steps.verifier]\nenv = { WANT = "b" }\n',
            "environment/Dockerfile": "FROM python:3.11-slim\nWORKDIR /app\n",
            "tests/test.sh": "#!/bin/bash\n" + REWARD.format(cond='[ -f "/app/$WANT" ] && [ -f /app/setup-ran ]'),
            "steps/one/instruction.md": "Create /app/a.\n",
            "steps/one/tests/test.sh": "#!/bin/bash\n" + REWARD.format(cond="[ -f /app/a ]"),
            "steps/one/solution/solve.sh": "#!/bin/bash\ntouch /app/a\n",
            "steps/two/instruction.md": "Create /app/b.\n",
            "steps/two/workdir/seed.txt": "seed\n",
            "steps/two/workdir/setup.sh": "#!/bin/bash\n[ -f seed.txt ] && touch /app/setup-ran\n",
            "steps/two/solution/solve.sh": "#!/bin/bash\ntouch /app/b\n",
        },
    )


def world_agent(fn, task: dict):
    """An episode of a world agent (no model call): its trajectory."""
    system = System(models={"policy": ModelSpec(backend="scripted", name="m")})
    return run_agent(fn, system, task, lambda s, r: ScriptedLM("m", ["DONE"]))


# ----------------------------------------------------------------------------- Harbor's defaults and the verifier


def test_harbors_defaults_and_the_sections_the_world_reads(tmp_path):
    t = load_task(
        single(
            tmp_path,
            toml='[agent]\nuser = "dev"\n[verifier]\nuser = 0\n[solution]\n'
            'env = { MODE = "fast", KEY = "${EVOLVEKIT_TEST_KEY:-none}" }\n[environment]\n'
            "allow_internet = false\ncpus = 2\nstorage_mb = 10240\n",
        )
    )
    assert t["agent_timeout"] is None and t["verifier_timeout"] == 600.0 and t["build_timeout"] == 600.0
    assert (t["agent_user"], t["verifier_user"], t["cpus"]) == ("dev", "0", 2.0)
    assert t["solution_env"] == {"MODE": "fast", "KEY": "${EVOLVEKIT_TEST_KEY:-none}"}
    assert t["network"] == {"agent": "no-network", "verifier": "no-network", "declared": ["agent", "verifier"]}
    assert t["notes"] == [
        "[environment] storage_mb = 10240 is not enforced (no disk quota here)",
        "task.toml: [solution] env KEY = '${EVOLVEKIT_TEST_KEY:-none}': the host's EVOLVEKIT_TEST_KEY "
        "is not passed to tasks, so its default is used; to pass it, allow it in your task file "
        "(dataset.params.allow_env: [EVOLVEKIT_TEST_KEY]) or on the command line (--allow-env "
        "EVOLVEKIT_TEST_KEY)",
    ]
    assert load_task(single(tmp_path, "d"))["network"] == {"agent": "public", "verifier": "public", "declared": []}
    json.dumps(t)


def test_test_sh_runs_by_its_own_shebang_and_its_output_is_kept(tmp_path):
    """Harbor runs tests/test.sh directly (chmod +x, its shebang), from the working directory, its
    output in /logs/verifier/test-stdout.txt; that output is the feedback."""
    py = (
        "#!/usr/bin/env python3\nimport os, json\nprint('checked from', os.getcwd())\n"
        "ok = open('/app/out.txt').read().strip() == 'ok' if os.path.exists('/app/out.txt') else False\n"
        "json.dump({'reward': float(ok), 'style': 0.5}, open('/logs/verifier/reward.json', 'w'))\n"
    )
    t = load_task(single(tmp_path, test=py))
    traj = play(t, ["```bash\necho ok > /app/out.txt\n```", "DONE"])
    assert traj.score == 1.0 and traj.reward.components == {"reward": 1.0, "style": 0.5}, traj.reward
    assert "checked from /app" in traj.reward.feedback
    env = open_environment(t, "sandbox")
    try:
        v = env.verify()
        assert env.fetch("/logs/verifier/test-stdout.txt") == b"checked from /app\n" and v["score"] == 0.0
    finally:
        env.close()


def test_a_verifier_past_its_timeout_is_harbors_verifier_timeout(tmp_path):
    t = load_task(single(tmp_path, toml="[verifier]\ntimeout_sec = 1\n", test="#!/bin/bash\nsleep 30\n"))
    verdict = check_task(t, "sandbox", cache=False)
    nop_trial = verdict["trials"]["nop"]
    assert nop_trial["exception_type"] == "VerifierTimeoutError" and nop_trial["reward"] is None
    assert verdict["status"] == "broken" and "timeout_sec (1 s)" in verdict["why"]


# ----------------------------------------------------------------------------- multi-step tasks


def test_a_multi_step_task_runs_step_by_step_and_scores_as_harbor(tmp_path):
    """Each step in turn in one environment: its workdir copied in and setup.sh run, its own
    instruction (a fresh conversation), its tests (steps/<name>/tests over tests/, the step's
    verifier env); the episode's score is the steps' mean (Harbor's default) or the final step's."""
    t = load_task(steps_task(tmp_path))
    assert [s["name"] for s in t["steps"]] == ["one", "two"] and t["instruction"] == "Create /app/a."
    assert t["steps"][1]["test"] == "tests/test.sh" and t["steps"][0]["test"] == "steps/one/tests/test.sh"
    traj = play(t, ["```bash\ntouch /app/a\n```", "DONE", "```bash\ntouch /app/b\n```", "DONE"])
    assert traj.infra is None and traj.score == 1.0, (traj.infra, traj.reward)
    asked = [s.messages[-1].content for s in traj.steps if s.kind == "llm"]
    assert asked[0].endswith("Create /app/a.") and asked[2].endswith("Create /app/b.")
    assert [s["step"] for s in traj.output["verifier"]["steps"]] == ["one", "two"]
    half = play(t, ["```bash\ntouch /app/a\n```", "DONE", "DONE"])
    assert half.score == 0.5 and half.reward.components == {"reward": 0.5}
    final = load_task(steps_task(tmp_path / "f", 'multi_step_reward_strategy = "final"\n'))
    assert play(final, ["```bash\ntouch /app/a\n```", "DONE", "DONE"]).score == 0.0
    assert play(final, ["DONE", "```bash\ntouch /app/b\n```", "DONE"]).score == 1.0


def test_min_reward_stops_the_remaining_steps(tmp_path):
    t = load_task(steps_task(tmp_path, first_min="min_reward = 1.0"))
    traj = play(t, ["DONE", "```bash\ntouch /app/b\n```", "DONE"])
    v = traj.output["verifier"]
    assert [s["step"] for s in v["steps"]] == ["one"] and traj.score == 0.0
    assert "step 'one': reward = 0 is below its min_reward 1; the remaining steps did not run" in v["stopped"]
    assert "the remaining steps did not run" in traj.reward.feedback


def test_oracle_and_nop_are_harbors_own_agents(tmp_path):
    """``oracle`` runs each step's solve.sh (solution env, DEBIAN_FRONTEND=noninteractive) then the
    tests; ``nop`` only the tests; the check reports both trials as Harbor's result would."""
    t = {**load_task(steps_task(tmp_path)), "backend": "sandbox"}
    out = world_agent(oracle, t).output
    assert out["verifier"]["score"] == 1.0 and [s["exit_code"] for s in out["solve"]] == [0, 0]
    assert world_agent(nop, t).output["verifier"]["score"] == 0.0
    envy = single(
        tmp_path,
        "envy",
        toml='[solution]\nenv = { WORD = "${EVOLVEKIT_TEST_WORD:-ok}" }\n',
        solve='[ "$DEBIAN_FRONTEND" = noninteractive ] && echo "$WORD" > /app/out.txt',
    )
    verdict = check_task(load_task(envy), "sandbox", cache=False)
    assert verdict["status"] == "ok" and verdict["trials"]["oracle"]["rewards"] == {"reward": 1.0}
    assert verdict["trials"]["nop"] == {**verdict["trials"]["nop"], "reward": 0.0, "exception_type": None}


# ----------------------------------------------------------------------------- what is refused, by name


@pytest.mark.parametrize(
    "toml, status, needle",
    [
        (
            '[agent]\nuser = "dev"\n',
            "unsupported",
            "[agent] user = 'dev': the sandbox backend runs every command as its one user",
        ),
        ('[verifier]\nenvironment_mode = "separate"\n', "unsupported", "a separate verifier environment"),
        (
            '[environment]\nnetwork_mode = "public"\n',
            "unsupported",
            "its agent needs the network (network_mode = 'public'",
        ),
    ],
)
def test_what_the_sandbox_cannot_carry_out_is_refused_by_name(tmp_path, toml, status, needle):
    verdict = check_task(load_task(single(tmp_path, toml=toml)), "sandbox", cache=False)
    assert verdict["status"] == status and needle in verdict["why"] and "docker backend" in verdict["why"], verdict


def test_features_not_run_yet_are_refused_by_name(tmp_path):
    cases = {
        '[environment.healthcheck]\ncommand = "true"\n': "[environment] healthcheck: a readiness healthcheck",
        '[environment]\nmcp_servers = [{ name = "x", command = "y", transport = "stdio" }]\n': "MCP servers",
        '[verifier]\nenvironment_mode = "separate"\n[[steps]]\nname = "a"\n': "a multi-step task with a separate "
        "verifier environment",
        'artifacts = [{ source = "/app/x", service = "db" }]\n': "an artifact from another compose service",
    }
    for i, (toml, needle) in enumerate(cases.items()):
        d = single(tmp_path, f"t{i}", toml=toml)
        write(d, {"steps/a/instruction.md": "A.\n"})
        with pytest.raises(UnsupportedTask) as e:
            load_task(d)
        assert needle in str(e.value), (toml, str(e.value))
    with pytest.raises(TaskError, match="step 'a' has no test"):
        load_task(
            write(
                tmp_path / "nt",
                {
                    "task.toml": '[[steps]]\nname = "a"\n',
                    "steps/a/instruction.md": "A.\n",
                    "environment/Dockerfile": "FROM python:3.11-slim\n",
                },
            )
        )


# ----------------------------------------------------------------------------- the shell between commands


def test_the_sandbox_keeps_the_directory_and_exports_between_commands(tmp_path):
    """On the sandbox backend each command starts where the last left, with its exports (a file in
    /tmp and a background process do not outlive their command there: the docker backend keeps a
    real shell)."""
    t = load_task(single(tmp_path))
    traj = play(
        t,
        [
            "```bash\nmkdir -p /app/w && cd /app/w\n```",
            "```bash\nexport WORD=ok\n```",
            "```bash\npwd; echo $WORD > /app/out.txt\n```",
            "```bash\nexit 4\n```",
            "```bash\npwd\n```",
            "DONE",
        ],
    )
    r = shells(traj)
    assert r[2]["stdout"] == "/app/w\n" and traj.score == 1.0, (r, traj.reward)
    assert r[3]["exit_code"] == 4 and r[4]["stdout"] == "/app/w\n"


def test_no_reward_file_is_never_a_score_on_any_path(tmp_path):
    t = load_task(single(tmp_path, test="#!/bin/bash\necho looks fine\nexit 0\n"))
    traj = score(reward, t, world_agent(oracle, {**t, "backend": "sandbox"}))
    assert traj.infra is not None and traj.infra.category == "environment" and traj.score == 0.0
    assert "wrote no reward file" in traj.infra.message and "looks fine" in traj.infra.message
    with pytest.raises(InfraError) as e:
        open_environment(t, "sandbox").verify()
    assert e.value.kind == "RewardFileNotFoundError"
