"""world: harbor: Harbor task folders as they are, in the sandbox backend (no container engine runs
here), scored by their own tests; bad folders named, the world failing never a score."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import evolve
from evolve.errors import ConfigError, InfraError
from evolve.worlds.harbor import dataset, load_task, solution_commands, split_of
from evolve.worlds.harbor.agent import parse_reply
from evolve.worlds.harbor.check import check_task
from evolve.worlds.harbor.environment import DockerEnvironment, open_environment, parse_reward
from evolve.worlds.harbor.task import TaskError, find_tasks
from tests.helpers.harbor import LESSON, make_tasks, play, respond, use_sandbox

REPO = Path(__file__).parents[2]
EXAMPLES = REPO / "examples" / "harbor_tasks"


@pytest.fixture(autouse=True)
def sandbox_backend(monkeypatch):
    use_sandbox(monkeypatch)


def test_the_worlds_rooms_depend_downwards_only():
    """task/ (the format) imports nothing else of the world, environment/ (where a task runs) only
    task/, and both backends share one phase delegation and one backend switch."""
    import ast

    from evolve.worlds.harbor.environment import SandboxEnvironment
    from evolve.worlds.harbor.environment.base import PhasedEnvironment

    root = REPO / "evolve" / "worlds" / "harbor"
    may = {
        "task": ("evolve.worlds.harbor.task",),
        "environment": ("evolve.worlds.harbor.task", "evolve.worlds.harbor.environment"),
    }
    for room, prefixes in may.items():
        for f in sorted((root / room).glob("*.py")):
            for node in ast.walk(ast.parse(f.read_text())):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                for name in names:
                    if name.startswith("evolve.worlds.harbor"):
                        assert name.startswith(prefixes), f"{room}/{f.name} imports {name}"
    for backend in (DockerEnvironment, SandboxEnvironment):
        assert issubclass(backend, PhasedEnvironment)
        assert "solve" not in vars(backend) and "start_step" not in vars(backend)
    switches = [f for f in root.rglob("*.py") if "EVOLVE_HARBOR_BACKEND" in f.read_text()]
    assert switches == [root / "environment" / "__init__.py"]


def mk(
    root: Path,
    name: str = "t",
    *,
    instruction: str = "Create /app/out.txt holding ok.",
    toml: str | None = None,
    test: str | None = None,
    solve: str | None = "echo ok > /app/out.txt",
    dockerfile: str | None = None,
    files: dict | None = None,
) -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    if instruction is not None:
        (d / "instruction.md").write_text(instruction)
    (d / "task.toml").write_text(
        toml if toml is not None else "[verifier]\ntimeout_sec = 10\n[agent]\ntimeout_sec = 30\n"
    )
    (d / "environment" / "Dockerfile").write_text(dockerfile or "FROM python:3.11-slim\nWORKDIR /app\n")
    for k, v in (files or {}).items():
        (d / "environment" / k).write_text(v)
    if test is not False:
        (d / "tests" / "test.sh").write_text(
            test
            or "#!/bin/bash\nmkdir -p /logs/verifier\n"
            'if [ "$(cat /app/out.txt 2>/dev/null)" = ok ]; then echo 1 > '
            '/logs/verifier/reward.txt; else echo "out.txt is wrong"; echo 0 > '
            "/logs/verifier/reward.txt; fi\n"
        )
    if solve is not None:
        (d / "solution").mkdir()
        (d / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve + "\n")
    return d


# ----------------------------------------------------------------------------- reading task folders


def test_a_task_folder_loads_with_harbors_keys(tmp_path):
    d = mk(
        tmp_path,
        toml='schema_version = "1.1"\n[task]\nname = "me/t"\n[metadata]\ndifficulty = "easy"\n'
        'tags = ["x"]\n[verifier]\ntimeout_sec = 12\nenv = { MODE = "strict" }\n[agent]\ntimeout_sec = 34.5\n'
        '[environment]\nbuild_timeout_sec = 56\nmemory = "1G"\ncpus = 1\nallow_internet = false\n',
    )
    t = load_task(d)
    assert (t["id"], t["name"], t["verifier_timeout"], t["agent_timeout"], t["build_timeout"], t["memory_mb"]) == (
        "t",
        "me/t",
        12.0,
        34.5,
        56.0,
        1024,
    )
    assert t["verifier_env"] == {"MODE": "strict"} and t["metadata"]["difficulty"] == "easy" and t["has_solution"]
    json.dumps(t)  # a task ships to any worker as JSON


@pytest.mark.parametrize(
    "change, needle",
    [
        (dict(instruction=None), "no instruction.md"),
        (dict(test=False), "no tests/test.sh"),
        (dict(instruction="  \n"), "instruction.md is empty"),
        (
            dict(toml="[verifier]\ntimeout_secs = 10\n"),
            "unknown key 'timeout_secs' at the [verifier] (did you mean 'timeout_sec'",
        ),
        (dict(toml="[agnet]\ntimeout_sec = 10\n"), "unknown key 'agnet' at the top level (did you mean 'agent'"),
        (dict(toml="[agent]\ntimeout_sec = -5\n"), "[agent] timeout_sec must be a positive number of seconds, got -5"),
        (dict(toml='[agent]\ntimeout_sec = "10m"\n'), "must be a positive number of seconds, got '10m'"),
        (dict(toml="[verifier]\ntimeout_sec = 100000\n"), "is over a day"),
        (dict(toml="[agent\ntimeout_sec = 1\n"), "task.toml is not valid TOML"),
        (dict(toml='[environment]\nos = "windows"\n'), "only Linux environments"),
        (
            dict(toml='[verifier]\nenv = { KEY = "${EVOLVEKIT_NO_SUCH_VAR}" }\n'),
            "[verifier] env KEY = "
            "'${EVOLVEKIT_NO_SUCH_VAR}' reads the host's environment variable EVOLVEKIT_NO_SUCH_VAR, which a task gets only "
            "when you allow it: allow it in your task file (dataset.params.allow_env: [EVOLVEKIT_NO_SUCH_VAR])",
        ),
        (
            dict(toml='[environment]\nnetwork_mode = "allowlist"\nallowed_hosts = ["pypi.org"]\n'),
            "network_mode = 'allowlist' (allowed_hosts): the harbor world has no egress filter",
        ),
        (dict(toml='[agent]\nnetwork_mode = "internet"\n'), "[agent] network_mode = 'internet'; use 'no-network' or"),
        (
            dict(toml='[environment.healthcheck]\ncommand = "true"\n'),
            "[environment] healthcheck: a readiness healthcheck",
        ),
        (dict(toml='[[verifier.collect]]\ncommand = "true"\n'), "[[verifier.collect]] hooks"),
        (
            dict(toml='[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ndocker_image = "x"\n'),
            "environment_mode = 'shared' with a [verifier.environment]",
        ),
        (dict(toml="[agent]\nuser = true\n"), "[agent] user must be a user name or a uid"),
        (dict(toml='multi_step_reward_strategy = "max"\n[[steps]]\nname = "a"\n'), "no steps/a/instruction.md"),
        (dict(toml='[metadata]\nsplit = "holdout"\n'), "[metadata] split = 'holdout'; use one of train, val, test"),
    ],
)
def test_a_folder_that_is_not_a_valid_task_is_named_with_the_fix(tmp_path, change, needle):
    d = mk(tmp_path, "bad-task", **change)
    with pytest.raises(TaskError) as e:
        load_task(d)
    assert "bad-task" in str(e.value) and needle in str(e.value), str(e.value)


def test_finding_tasks_names_what_is_not_there(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="holds no Harbor task folders"):
        find_tasks(tmp_path / "empty")
    with pytest.raises(ConfigError, match="no such folder"):
        find_tasks(tmp_path / "nope")
    mk(tmp_path / "a", "same")
    mk(tmp_path / "b", "same")
    with pytest.raises(ConfigError, match="two task folders are named 'same'"):
        find_tasks([tmp_path / "a", tmp_path / "b"])


BAD = {  # task id: (status, a piece of the reason)
    "run-before-workdir": (
        "unsupported",
        "line 2: RUN 'mkdir -p /opt/tool && echo x > /opt/tool/conf' exited 1 in the sandbox",
    ),
    "host-var": (
        "unsupported",
        "env API_KEY = '${EVOLVEKIT_NO_SUCH_VAR}' reads the host's environment variable "
        "EVOLVEKIT_NO_SUCH_VAR, which a task gets only when you allow it",
    ),
    "multi-step-no-reward": ("broken", "RewardFileNotFoundError: tests/test.sh wrote no reward file"),
    "bad-toml": ("invalid", "task.toml is not valid TOML"),
    "bad-split": ("invalid", "[metadata] split = 'holdout'"),
}


def _folder_with_bad_tasks(root: Path) -> None:
    mk(root, "good-a")
    # a RUN before the first WORKDIR runs in /, as Docker runs it
    mk(
        root,
        "good-b",
        dockerfile="FROM python:3.11-slim\nRUN mkdir -p /app && echo seed > /app/seed.txt\nWORKDIR /app\n",
    )
    mk(
        root,
        "run-before-workdir",
        dockerfile="FROM python:3.11-slim\nRUN mkdir -p /opt/tool && echo x > /opt/tool/conf\nWORKDIR /app\n",
    )
    mk(root, "host-var", toml='[environment]\nenv = { API_KEY = "${EVOLVEKIT_NO_SUCH_VAR}" }\n')
    mk(root, "bad-toml", toml="[agent\ntimeout_sec = 1\n")
    mk(root, "bad-split", toml='[metadata]\nsplit = "holdout"\n')
    d = root / "multi-step-no-reward"  # Harbor's layout: no instruction.md or tests/ at the top, one folder per step
    (d / "environment").mkdir(parents=True)
    (d / "environment" / "Dockerfile").write_text("FROM python:3.11-slim\nWORKDIR /app\n")
    (d / "task.toml").write_text('[[steps]]\nname = "one"\n[[steps]]\nname = "two"\n')
    for step in ("one", "two"):
        (d / "steps" / step / "tests").mkdir(parents=True)
        (d / "steps" / step / "instruction.md").write_text(f"Step {step}.\n")
        (d / "steps" / step / "tests" / "test.sh").write_text("#!/bin/bash\nexit 0\n")


def test_one_bad_task_never_stops_a_run(tmp_path, capsys):
    """A folder of two good tasks and five bad ones (a RUN before WORKDIR the sandbox cannot carry
    out, a ${VAR} env whose variable is not set, a multi-step task whose tests write no reward, a
    malformed task.toml, an unknown split): the run scores
    the good ones, and each bad one is named with its status and reason, once, never scored."""
    root = tmp_path / "tasks"
    _folder_with_bad_tasks(root)
    r = subprocess.run(
        [sys.executable, "-m", "evolve", "harbor", "check", "--json", "-e", "sandbox", str(root)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr + r.stdout, r.stderr[-3000:]
    rows = {row["id"]: row for row in map(json.loads, r.stdout.splitlines())}
    assert {k: v["status"] for k, v in rows.items()} == {
        "good-a": "ok",
        "good-b": "ok",
        **{k: v[0] for k, v in BAD.items()},
    }
    for tid, (_, why) in BAD.items():
        assert why in rows[tid]["why"], (tid, rows[tid]["why"])
    assert "docker backend" in rows["run-before-workdir"]["why"]
    # the dataset leaves them out, says why once per process, and a second load repeats nothing
    data = dataset(source=root, splits={"train": ["good-a"], "val": ["good-b"]})
    assert sorted(t["id"] for ts in data.values() for t in ts) == ["good-a", "good-b"]
    err = capsys.readouterr().err
    assert "harbor: 5 task(s) left out (not scored):" in err
    for tid, (status, why) in BAD.items():
        assert err.count(f"  - {tid} ({status}): ") == 1 and why in err, (tid, err)
    dataset(source=root, splits={"train": ["good-a"], "val": ["good-b"]})
    assert "left out" not in capsys.readouterr().err
    # a whole run: the good tasks are scored, the bad ones reported, no traceback
    reply = {"Create /app/out.txt": "```bash\necho ok > /app/out.txt\n```", "default": "DONE"}
    (tmp_path / "task.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "h",
                "world": "harbor",
                "dataset": {
                    "source": "tasks",
                    "params": {"environment": "sandbox", "splits": {"train": ["good-a"], "val": ["good-b"]}},
                },
                "models": {"policy": {"backend": "scripted", "name": "m", "params": {"responses": reply}}},
                "budget": {"generations": 0},
            }
        )
    )
    r = subprocess.run(
        [sys.executable, "-m", "evolve", "run", str(tmp_path / "task.yaml"), "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    for tid, (status, why) in BAD.items():
        assert f"  - {tid} ({status}): " in r.stderr and why in r.stderr, tid
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    assert rep["baseline"]["val"]["n"] == 1 and rep["baseline"]["val"]["score"] == 1.0, rep["baseline"]


# ----------------------------------------------------------------------------- the environment


def test_an_episode_runs_commands_in_the_tasks_environment_and_its_tests_score_it(tmp_path):
    d = mk(
        tmp_path,
        files={"seed.txt": "from the image\n"},
        dockerfile="FROM python:3.11-slim\nWORKDIR /app\nCOPY seed.txt /app/\nRUN cp seed.txt copied.txt\n",
    )
    t = load_task(d)
    traj = play(t, ["```bash\ncat copied.txt\n```", "```bash\necho ok > /app/out.txt\n```", "DONE"])
    assert traj.error is None and traj.score == 1.0, (traj.error, traj.reward)
    shell = [s for s in traj.steps if getattr(s, "name", None) == "shell"]
    assert [s.args["command"] for s in shell] == ["cat copied.txt", "echo ok > /app/out.txt"]
    assert shell[0].result["stdout"] == "from the image\n" and shell[0].result["exit_code"] == 0
    assert traj.output["commands"] == ["cat copied.txt", "echo ok > /app/out.txt"] and traj.output["done"]
    assert [s for s in traj.steps if getattr(s, "name", None) == "harbor.verify"]
    wrong = play(t, ["```bash\necho nope > /app/out.txt\n```", "DONE"])
    assert wrong.score == 0.0 and "out.txt is wrong" in wrong.reward.feedback
    # the model saw each command's output, as the next message
    calls = [s for s in traj.steps if s.kind == "llm"]
    assert calls[1].messages[-1].content == "exit code 0\nfrom the image"


def test_a_process_that_built_environments_leaves_nothing_in_tmp(tmp_path):
    # the built environment is kept for the process's later episodes of the task; it went to /tmp for good
    d = mk(
        tmp_path,
        files={"seed.txt": "x\n"},
        dockerfile="FROM python:3.11-slim\nWORKDIR /app\nCOPY seed.txt /app/\nRUN cp seed.txt copied.txt\n",
    )
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    code = (
        "import sys\nfrom evolve.worlds.harbor import load_task\n"
        "from evolve.worlds.harbor.environment import open_environment\n"
        "t = load_task(sys.argv[1])\n"
        "for _ in range(2):\n    e = open_environment(t, 'sandbox')\n"
        "    assert e.exec('cat copied.txt', timeout=30).stdout == 'x\\n'\n    e.close()\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(d)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**__import__("os").environ, "TMPDIR": str(tmp)},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    assert list(tmp.iterdir()) == []


def test_the_agent_never_sees_the_solution_or_the_tests(tmp_path):
    d = mk(tmp_path, solve="echo ok > /app/out.txt  # SOLUTION-MARKER")
    (d / "tests" / "secret.txt").write_text("TESTS-MARKER\n")
    look = (
        "ls -a /solution /tests 2>&1; find / -path /proc -prune -o \\( -name solve.sh -o -name secret.txt \\) -print 2>/dev/null; "
        "grep -rs -e SOLUTION-MARKER -e TESTS-MARKER /app /logs /tmp /etc /root /home /work /opt /srv /mnt /var "
        "2>/dev/null | head -3; echo searched"
    )
    traj = play(load_task(d), [f"```bash\n{look}\n```", "DONE"], {"max_tokens": 1000})
    out = [s for s in traj.steps if getattr(s, "name", None) == "shell"][0].result["stdout"]
    assert "searched" in out and "MARKER" not in out, out
    assert "cannot access '/solution'" in out and "cannot access '/tests'" in out


def test_nothing_escapes_the_sandbox(tmp_path):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    d = mk(tmp_path)
    env = open_environment(load_task(d), "sandbox")
    try:
        r = env.exec(
            f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2)\"", timeout=10
        )
        assert r.exit_code != 0, r  # no network, not even loopback
        r = env.exec(f"touch /usr/evil; touch {REPO}/evil; touch /etc/evil; echo $?", timeout=10)
        assert not (REPO / "evil").exists() and not Path("/usr/evil").exists() and not Path("/etc/evil").exists()
        env.exec("sleep 300 & echo started", timeout=10)
        r = env.exec("ps -eo comm | grep -c '^sleep' || true", timeout=10)
        assert r.stdout.strip() == "0", r  # a background process does not outlive its command
    finally:
        env.close()
        listener.close()


def test_a_hung_command_is_killed_at_the_tasks_timeout_and_the_episode_still_scores(tmp_path):
    d = mk(tmp_path, toml="[verifier]\ntimeout_sec = 10\n[agent]\ntimeout_sec = 3\n")
    t0 = time.monotonic()
    traj = play(load_task(d), ["```bash\nsleep 600\n```", "```bash\necho ok > /app/out.txt\n```"])
    took = time.monotonic() - t0
    assert took < 15, took
    (shell,) = [s for s in traj.steps if getattr(s, "name", None) == "shell"]
    assert shell.result["timed_out"] and shell.result["exit_code"] is None
    assert traj.output["agent_timed_out"] and traj.score == 0.0 and traj.infra is None
    assert "ran out of its 3 s" in traj.reward.feedback


def test_a_test_script_that_never_exits_is_the_world_failing_not_a_score(tmp_path):
    d = mk(tmp_path, toml="[verifier]\ntimeout_sec = 2\n[agent]\ntimeout_sec = 30\n", test="#!/bin/bash\nsleep 600\n")
    t0 = time.monotonic()
    traj = play(load_task(d), ["DONE"])
    assert time.monotonic() - t0 < 20
    assert traj.infra is not None and traj.infra.category == "environment" and not traj.infra.retryable
    assert "did not finish within the verifier's timeout_sec (2 s)" in traj.infra.message


def test_the_reward_is_harbors_and_no_reward_file_is_the_world_failing():
    """Harbor's verifier: reward.json (an object; every key kept) before reward.txt (``reward``);
    the score is the ``reward`` key, else the only key; no reward file, an empty one or one that is
    not numbers is the verifier failing (the exception type Harbor records), never 0.0 or 1.0."""
    t = {"id": "x"}
    assert parse_reward(t, b'{"reward": 0.5, "style": 1}', b"1") == (0.5, {"reward": 0.5, "style": 1.0}, "reward.json")
    assert parse_reward(t, b'{"passed": 0.25}', None) == (0.25, {"passed": 0.25}, "reward.json")
    score, comps, source = parse_reward(t, b'{"a": 1, "b": 0}', None)
    assert (score, comps) == (0.5, {"a": 1.0, "b": 0.0}) and "no 'reward' key: the mean of its 2 keys" in source
    assert parse_reward(t, None, b" 1\n") == (1.0, {"reward": 1.0}, "reward.txt")
    for bad, kind in (
        ((None, None), "RewardFileNotFoundError"),
        ((b"", None), "RewardFileEmptyError"),
        ((None, b""), "RewardFileEmptyError"),
        ((b"{not json", None), "VerifierOutputParseError"),
        ((b'{"reward": "high"}', None), "VerifierOutputParseError"),
        ((b"1", None), "VerifierOutputParseError"),
        ((b"{}", None), "VerifierOutputParseError"),
        ((None, b"passed"), "VerifierOutputParseError"),
        ((None, b"nan"), "VerifierOutputParseError"),
    ):
        with pytest.raises(InfraError) as e:
            parse_reward(t, *bad)
        assert e.value.category == "environment" and "Harbor task x" in str(e.value) and e.value.kind == kind, bad


def test_a_test_that_writes_no_reward_is_the_world_failing_never_a_score(tmp_path):
    for name, test in (
        ("exit-0", "#!/bin/bash\necho all good\nexit 0\n"),
        ("exit-1", "#!/bin/bash\necho failed\nexit 1\n"),
    ):
        traj = play(load_task(mk(tmp_path, name, test=test)), ["DONE"])
        assert traj.infra is not None and traj.infra.category == "environment", (name, traj.score)
        assert "wrote no reward file" in traj.infra.message and "Its output: " in traj.infra.message


def test_an_environment_the_sandbox_cannot_build_is_named(tmp_path):
    d = mk(tmp_path, dockerfile="FROM python:3.11-slim\nWORKDIR /app\nRUN pip install requests\n")
    traj = play(load_task(d), ["DONE"])
    assert traj.infra is not None and traj.infra.category == "environment"
    assert "RUN 'pip install requests'" in traj.infra.message and "docker backend" in traj.infra.message


def test_the_docker_backend_where_an_engine_answers(docker_engine):
    """Two example tasks on a real engine, their python:3.11-slim base a local stand-in (the image map)."""
    tasks = [docker_engine.task(p) for p in find_tasks(EXAMPLES)][:2]
    for t in tasks:
        env = DockerEnvironment(t, docker_engine.client)
        try:
            assert env.verify()["score"] == 0.0
            env.solve()
            assert env.verify()["score"] == 1.0
        finally:
            env.close()


# ----------------------------------------------------------------------------- the dataset


def test_a_broken_task_is_reported_and_left_out_never_scored(tmp_path, capsys):
    root = tmp_path / "tasks"
    for i in range(6):
        mk(root, f"ok-{i}")
    mk(root, "wrong-solution", solve="echo no > /app/out.txt")
    mk(root, "passes-untouched", test="#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    mk(root, "no-solution", solve=None)
    data = dataset(source=root, val=0.3, test=0.3)
    ids = {t["id"] for s in data.values() for t in s}
    assert "wrong-solution" not in ids and "passes-untouched" not in ids and "no-solution" in ids
    err = capsys.readouterr().err
    assert "2 task(s) left out" in err and "wrong-solution (broken): its own solution/solve.sh does not pass" in err
    assert "passes-untouched (broken): tests/test.sh passes on the untouched environment" in err
    (t,) = [t for s in data.values() for t in s if t["id"] == "no-solution"]
    assert t["checked"] == "unverified"
    assert check_task(load_task(root / "wrong-solution"), "sandbox")["status"] == "broken"


def test_splits_are_stable_by_folder_name(tmp_path):
    root = tmp_path / "tasks"
    for i in range(12):
        mk(root, f"task-{i}")
    a = dataset(source=root, check=False)
    b = dataset(seed=7, source=[str(root)], check=False)
    split = {t["id"]: s for s, ts in a.items() for t in ts}
    assert split == {t["id"]: s for s, ts in b.items() for t in ts}  # the seed moves nothing
    assert all(split[i] == split_of(i, 0.25, 0.25) for i in split)
    mk(root, "task-new")
    c = dataset(source=root, check=False)
    assert {t["id"]: s for s, ts in c.items() for t in ts if t["id"] != "task-new"} == split  # adding moves none
    pinned = dataset(source=root, check=False, splits={"test": ["task-0"]})
    assert [t["split"] for s in pinned.values() for t in s if t["id"] == "task-0"] == ["test"]
    with pytest.raises(ConfigError, match="names task 'task-99'"):
        dataset(source=root, check=False, splits={"test": ["task-99"]})
    with pytest.raises(ConfigError, match="needs its tasks"):
        dataset()


def test_solution_commands_and_demos(tmp_path):
    d = mk(
        tmp_path,
        solve="set -euo pipefail\n# make it\ncd /app\ncat > x.py <<'EOF'\nprint(1)\nEOF\necho a \\\n  b > out.txt",
    )
    t = load_task(d)
    assert solution_commands(t) == ["cd /app", "cat > x.py <<'EOF'\nprint(1)\nEOF", "echo a \\\n  b > out.txt"]
    from evolve.worlds.harbor import demos

    (chat,) = demos([t])
    assert chat[0]["role"] == "system" and chat[1]["content"].endswith(t["instruction"])
    assert chat[2]["content"] == "```bash\ncd /app\n```" and chat[-1]["content"] == "DONE"
    assert parse_reply(chat[2]["content"]) == ("cd /app", False)
    assert parse_reply("Sure:\n```bash\nls\n```\nThen DONE") == ("ls", True)
    assert parse_reply("```bash\nls -la /ap") == ("ls -la /ap", False)  # cut at max_tokens
    assert parse_reply("DONE") == (None, True) and parse_reply("$ ls -la") == ("ls -la", False)


def test_every_example_task_is_sound():
    tasks = [load_task(p) for p in find_tasks(EXAMPLES)]
    assert len(tasks) >= 12
    verdicts = {t["id"]: check_task(t, "sandbox", cache=False) for t in tasks}
    assert {k: v["status"] for k, v in verdicts.items()} == dict.fromkeys(verdicts, "ok"), {
        k: v["why"] for k, v in verdicts.items() if v["status"] != "ok"
    }


# ----------------------------------------------------------------------------- end to end over loopback


def test_a_served_model_is_lifted_by_the_prompt_and_memory_layers_on_held_out_tasks(tmp_path, loopback_env):
    """examples/harbor/task.yaml with its policy pointed at an OpenAI-compatible server on loopback
    (through litellm) that plays generated task families: the reflective operator carries the
    tests' feedback ("must end with a newline") into the instruction, the memory operator stores
    solved episodes' commands, and held-out tasks of both families are solved by the evolved system
    and not by the baseline."""
    from tests.helpers.servers import FakeOpenAI

    fams = make_tasks(tmp_path / "tasks", 12)
    splits = {
        "train": [f"{f}-{i}" for f in fams for i in range(6)],
        "val": [f"{f}-{i}" for f in fams for i in (7, 9)],
        "test": [f"{f}-{i}" for f in fams for i in (6, 8, 10, 11)],
    }
    srv = FakeOpenAI(respond=respond)
    policy = {
        "backend": "litellm",
        "name": "openai/scripted",
        "params": {"api_base": srv.base, "max_retries": 0, "timeout": 10, "temperature": 0.0},
    }
    try:
        rep = evolve.run(
            REPO / "examples" / "harbor" / "task.yaml",
            out=tmp_path / "run",
            overrides=[
                f"models.policy={json.dumps(policy)}",
                f"dataset.source={tmp_path / 'tasks'}",
                f"dataset.params.splits={json.dumps(splits)}",
                "prompts={}",
                "workflow={max_turns: 4, max_tokens: 256}",
                "operators.0.params.embedder=hashing",
                "operators.1.params.minibatch=6",
                "runner.workers=4",
                "engine.minibatch=18",
            ],
        )
    finally:
        srv.close()
    test = splits["test"]
    assert rep["best"]["test"]["score"] == 1.0 and rep["baseline"]["test"]["score"] == pytest.approx(7 / 12, abs=1e-3)
    paired = rep["paired"]["test"]
    assert paired["b_only"] == 5 and paired["a_only"] == 0 and paired["diff"] - paired["ci95"] > 0
    from evolve.archive import Archive

    archive = Archive(tmp_path / "run")
    best = archive.get_system(rep["best"]["system_id"])
    assert LESSON in best.prompts["instruction"] and best.memory.get("store")
    assert {"reflective", "memory"} <= {r.operator for r in archive.records()}
    # every held-out episode was scored by its own tests, none failed under the world
    trajs = archive.trajectories(rep["best"]["system_id"], "test")
    assert sorted(t.task_id for t in trajs) == sorted(test) and all(t.infra is None and t.score == 1.0 for t in trajs)
    base = archive.task_scores(rep["baseline"]["system_id"], "test")
    assert {k for k, v in base.items() if v < 1} == {"word-6", "word-8", "word-10", "word-11", "secret-11"}


@pytest.mark.slow
def test_the_offline_default_runs_over_the_example_tasks(tmp_path):
    """`evolve run examples/harbor/task.yaml`: the tiny model, cold-started on the train tasks'
    solutions, runs over the example tasks; whatever it scores comes from the tests, the world never
    failed under it, and the report is written."""
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "evolve",
            "run",
            str(REPO / "examples" / "harbor" / "task.yaml"),
            "--out",
            str(tmp_path / "run"),
            "--set",
            "budget.generations=1",
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads((tmp_path / "run" / "report.json").read_text())
    assert rep["baseline"]["test"]["n"] == 4 and "held-out test gain" in r.stdout
    from evolve.archive import Archive

    trajs = Archive(tmp_path / "run").trajectories()
    assert trajs and all(t.infra is None for t in trajs)
    assert all(t.output and "verifier" in t.output for t in trajs if t.error is None)
