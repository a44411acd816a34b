"""world: harbor on a real Docker engine (the ``docker_engine`` fixture: one that answers, or one the
tests start where the machine allows; else these skip with the reason): Harbor's semantics as its
own source defines them. The shaped example tasks (examples/harbor_shapes) score 1.0 under the
oracle and 0.0 under nop, the one whose verifier crashes is the world failing; one persistent shell
per episode; ``${VAR}`` env from the host; users; the network a task asks for; ``agent: oracle`` and
``agent: nop`` in a run. Every container these tests start is removed, even when one fails."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from evolve.worlds.harbor.check import check_task
from evolve.worlds.harbor.task import find_tasks
from tests.helpers.docker_engine import ours
from tests.helpers.harbor import play, shells

REPO = Path(__file__).parents[2]
SHAPES = REPO / "examples" / "harbor_shapes"
EXAMPLES = REPO / "examples" / "harbor_tasks"
CRASHES = {"verifier-crashes"}  # tasks whose verifier fails on purpose: the world failing, never a score


@pytest.fixture
def engine(docker_engine):
    """The engine, and after each test: no container of the harbor world's left behind."""
    yield docker_engine
    left = docker_engine.client.containers.list(all=True, filters=ours(docker_engine))
    for c in left:
        c.remove(force=True)
    assert not left, f"containers left behind: {[c.name for c in left]}"


def task_of(engine, folder: Path, **more) -> dict:
    return engine.task(folder, backend="docker", **more)


def mk(
    root: Path,
    name: str,
    *,
    toml: str = "",
    test: str,
    solve: str | None = None,
    dockerfile: str = "FROM python:3.11-slim\nWORKDIR /app\n",
    instruction: str = "Do the task.",
) -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "instruction.md").write_text(instruction + "\n")
    (d / "task.toml").write_text(toml or "[verifier]\ntimeout_sec = 30\n[agent]\ntimeout_sec = 60\n")
    (d / "environment" / "Dockerfile").write_text(dockerfile)
    (d / "tests" / "test.sh").write_text(test)
    if solve is not None:
        (d / "solution").mkdir()
        (d / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve + "\n")
    return d


# ----------------------------------------------------------------------------- the shaped tasks


@pytest.mark.parametrize("folder", sorted(find_tasks(SHAPES)) + sorted(find_tasks(EXAMPLES)), ids=lambda p: p.name)
def test_each_example_task_scores_1_under_the_oracle_and_0_under_nop(engine, folder):
    """What Harbor's trial result would say of each task's oracle and nop trials (``evolve harbor
    check``), for the shaped tasks and the twelve of examples/harbor_tasks: rewards 1.0 and 0.0
    (every key of a multi-key reward.json), and for the task whose verifier crashes,
    RewardFileNotFoundError and no reward under both: the world failing."""
    name = folder.name
    verdict = check_task(task_of(engine, folder), "docker", cache=False)
    nop = verdict["trials"]["nop"]
    if name in CRASHES:
        assert verdict["status"] == "broken" and nop["exception_type"] == "RewardFileNotFoundError", verdict
        assert nop["reward"] is None and nop["rewards"] is None and "status-checker" in nop["exception_message"]
        return
    assert verdict["status"] == "ok", verdict["why"]
    oracle = verdict["trials"]["oracle"]
    assert nop["exception_type"] is None and oracle["exception_type"] is None
    assert nop["reward"] == 0.0 and oracle["reward"] == 1.0
    assert set(nop["rewards"]) == set(oracle["rewards"]) and all(v == 1.0 for v in oracle["rewards"].values())
    if name == "stats-module-rewards":
        assert oracle["rewards"] == {"reward": 1.0, "correctness": 1.0, "docs": 1.0}
        assert "FAIL" in nop["verdict"]["output"]  # the tests' output, kept in /logs/verifier/test-stdout.txt


def test_the_check_command_reports_harbors_trial_results(engine, tmp_path):
    """``evolve harbor check --json --image NAME=LOCAL``: per task, its nop and oracle trials as
    Harbor's result says them (rewards, exception type), the crash named, exit 1 for it."""
    images = [a for k, v in engine.images.items() for a in ("--image", f"{k}={v}")]
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "evolve",
            "harbor",
            "check",
            "--json",
            "--no-cache",
            "-e",
            "docker",
            *images,
            str(SHAPES / "verifier-crashes"),
            str(SHAPES / "stats-module-rewards"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr[-2000:]
    rows = {row["id"]: row for row in map(json.loads, r.stdout.splitlines())}
    crash = rows["verifier-crashes"]
    assert crash["status"] == "broken" and crash["trials"]["nop"]["exception_type"] == "RewardFileNotFoundError"
    stats = rows["stats-module-rewards"]["trials"]
    assert stats["oracle"]["rewards"] == {"reward": 1.0, "correctness": 1.0, "docs": 1.0}
    assert stats["nop"]["reward"] == 0.0 and stats["nop"]["exception_type"] is None


# ----------------------------------------------------------------------------- one shell per episode


SHELL_TEST = """#!/bin/bash
# the agent's shell left a file in /tmp, and a service it started is still up
mkdir -p /logs/verifier
python3 - <<'PY'
import urllib.request
try:
    served = urllib.request.urlopen("http://127.0.0.1:8799/state.txt", timeout=3).read().decode().strip()
except Exception as e:
    served = f"nothing served: {e}"
state = open("/tmp/work/state.txt").read().strip() if __import__("os").path.exists("/tmp/work/state.txt") else None
ok = state == "abc" and served == "abc"
print("PASS" if ok else f"FAIL: state={state!r} served={served!r}")
open("/logs/verifier/reward.txt", "w").write("1" if ok else "0")
PY
"""


def test_one_persistent_shell_per_episode(engine, tmp_path):
    """A cd, an exported variable, a file in /tmp and a background service started by one command
    are there for the next command and for the tests; a hung command is killed without losing the
    shell; a shell that does not come back (a loop in the shell itself) or exits is started again,
    and the episode says so."""
    t = task_of(engine, mk(tmp_path, "shell", test=SHELL_TEST), agent_timeout=120.0)
    replies = [
        "```bash\nmkdir -p /tmp/work && cd /tmp/work\n```",
        "```bash\nexport TOKEN=abc\n```",
        "```bash\necho $TOKEN > state.txt; pwd\n```",
        "```bash\npython3 -m http.server 8799 --bind 127.0.0.1 >/dev/null 2>&1 &\nsleep 1; echo started\n```",
        "```bash\nsleep 300; echo after-the-kill\n```",
        "```bash\necho $TOKEN; pwd\n```",
        "```bash\nwhile :; do :; done\n```",
        "```bash\necho ${TOKEN:-gone}; pwd\n```",
        "```bash\nexit 3\n```",
        "```bash\ncat /tmp/work/state.txt\n```",
        "DONE",
    ]
    traj = play(t, replies, {"command_timeout": 3, "max_turns": 12, "max_tokens": 400})
    assert traj.infra is None and traj.score == 1.0, (traj.infra, traj.reward)
    r = shells(traj)
    assert r[2]["stdout"] == "/tmp/work\n" and r[3]["stdout"].strip() == "started"
    assert r[4]["timed_out"] and r[4]["exit_code"] is None and "note" not in r[4]  # killed; the shell kept
    assert r[5]["stdout"] == "abc\n/tmp/work\n"
    assert r[6]["timed_out"] and "a new shell was started in /app" in r[6]["note"]
    assert r[7]["stdout"] == "gone\n/app\n"  # the new shell: no export, back in the working directory
    assert r[8]["exit_code"] is None and "the shell exited" in r[8]["note"]
    assert r[9]["stdout"] == "abc\n" and traj.output["shell_restarts"] == 2
    seen = [s for s in traj.steps if s.kind == "llm"][7].messages[-1].content
    assert seen.startswith("killed") and "(the shell did not come back" in seen  # the model is told


# ----------------------------------------------------------------------------- task.toml's sections


def test_env_values_come_from_the_host_and_never_reach_the_task(engine, tmp_path, monkeypatch):
    """``${VAR}`` / ``${VAR:-default}`` in [environment], [verifier] and [solution] env are read from
    the host when the environment opens, for a variable the user allowed (the task dict keeps the
    template, so no value reaches a run's files, and the value is masked in what comes back); one
    not allowed takes its default."""
    folder = SHAPES / "host-var-greeting"
    monkeypatch.setenv("EVOLVEKIT_GREETING_NAME", "Grace")
    t = task_of(engine, folder, allow_env=["EVOLVEKIT_GREETING_NAME"])
    assert t["verifier_env"] == {"EXPECTED_NAME": "${EVOLVEKIT_GREETING_NAME:-harbor}"}
    assert "Grace" not in json.dumps(t)
    good = play(t, ['```bash\necho "hello, $GREETING_NAME" > /app/hello.txt; cat /app/hello.txt\n```', "DONE"])
    assert good.score == 1.0 and shells(good)[0]["stdout"] == "hello, ***\n", good.reward  # Grace, masked
    wrong = play(t, ["```bash\necho 'hello, harbor' > /app/hello.txt\n```", "DONE"])
    assert wrong.score == 0.0  # the verifier's EXPECTED_NAME is the host's value too
    assert check_task(t, "docker", cache=False)["status"] == "ok"  # [solution] env reached solve.sh
    unallowed = task_of(engine, folder)  # set, but not allowed: the default
    assert play(unallowed, ['```bash\necho "hello, $GREETING_NAME" > /app/hello.txt\n```', "DONE"]).score == 1.0
    monkeypatch.delenv("EVOLVEKIT_GREETING_NAME")
    assert check_task(task_of(engine, folder), "docker", cache=False)["trials"]["oracle"]["reward"] == 1.0


def test_users_as_task_toml_names_them(engine):
    """[agent] user runs the agent's shell (and solve.sh) as that user; [verifier] user runs the
    tests (here root: they read a root-only file)."""
    t = task_of(engine, SHAPES / "count-errors-as-agent")
    traj = play(t, ["```bash\nid -un; grep -c ERROR /app/events.log > /app/errors.txt\n```", "DONE"])
    assert shells(traj)[0]["stdout"].startswith("agent\n") and traj.score == 1.0, traj.reward
    root_wrote = play(t, ["```bash\ncat /root/expected-errors\n```", "DONE"])  # the agent cannot read it
    assert shells(root_wrote)[0]["exit_code"] != 0 and root_wrote.score == 0.0


def test_the_network_a_task_asks_for(engine, tmp_path):
    """network_mode is honoured with the engine's own networks: no-network gets none; a phase
    that asks for the network where the engine has none for containers (here: only none and host,
    and host is never given to a task) is unsupported, said so, never scored; Harbor's default
    (public, unset) runs without and the verdict says so."""
    bridge = "bridge" in {n.name for n in engine.client.networks.list()}
    probe = (
        "#!/bin/bash\nif python3 -c \"import socket; socket.create_connection(('1.1.1.1', 53), timeout=2)\" "
        "2>/dev/null; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi\n"
    )
    none = check_task(
        task_of(
            engine, mk(tmp_path, "none", toml='[environment]\nnetwork_mode = "no-network"\n', test=probe, solve="true")
        ),
        "docker",
        cache=False,
    )
    assert none["trials"]["nop"]["reward"] == 0.0 and "network" not in none["untouched"]
    asks = check_task(
        task_of(
            engine,
            mk(
                tmp_path,
                "asks",
                toml='[verifier]\ntimeout_sec = 30\nnetwork_mode = "public"\n',
                test=probe,
                solve="true",
            ),
        ),
        "docker",
        cache=False,
    )
    default = check_task(task_of(engine, mk(tmp_path, "default", test=probe, solve="true")), "docker", cache=False)
    if bridge:  # an engine with its default network gives it
        assert asks["trials"]["nop"]["exception_type"] is None and "network" not in default["untouched"]
        return
    assert asks["status"] == "unsupported" and asks["trials"]["nop"]["rewards"] is None
    assert "its verifier needs the network (network_mode = 'public' in task.toml)" in asks["why"]
    assert "host network, the machine's own, is never given to a task" in asks["why"]
    assert default["untouched"]["network"].startswith("none: the task leaves network_mode at Harbor's default")


def test_a_separate_verifier_sees_only_the_artifacts(engine, tmp_path):
    """environment_mode = 'separate': the tests run in a fresh container of the task's image, with
    the declared artifacts copied in through the engine; what else the agent did is not there."""
    t = task_of(engine, SHAPES / "primes-separate-verifier")
    cmd = (
        "python3 -c \"import json; json.dump({'primes': [p for p in range(2, 50) if all(p % d for d in range(2, p))]}, "
        "open('/app/result.json', 'w'))\""
    )
    assert play(t, [f"```bash\n{cmd}\n```", "DONE"]).score == 1.0
    messy = play(t, [f"```bash\n{cmd}; touch /app/scratch.txt\n```", "DONE"])
    assert messy.score == 1.0  # /app/scratch.txt stayed in the agent's container
    shared = play({**t, "verifier_mode": "shared"}, [f"```bash\n{cmd}; touch /app/scratch.txt\n```", "DONE"])
    assert shared.score == 0.0 and "not running in a separate environment" in shared.reward.feedback


# ----------------------------------------------------------------------------- oracle and nop in a run


@pytest.mark.parametrize("which, want", [("oracle", 1.0), ("nop", 0.0)])
def test_agent_oracle_and_nop_in_a_run(engine, tmp_path, which, want):
    """``agent: oracle`` / ``agent: nop`` in a task file select Harbor's own agents: every scored
    episode is the task's solution (1.0) or nothing (0.0), on the docker backend."""
    names = ["tool-config-port", "greet-in-steps", "stats-module-rewards", "serve-status-page"]
    (tmp_path / "task.yaml").write_text(
        yaml.safe_dump(
            {
                "name": which,
                "world": "harbor",
                "agent": which,
                "dataset": {
                    "source": [str(SHAPES / n) for n in names],
                    "params": {
                        "environment": "docker",
                        "images": engine.images,
                        "check": False,
                        "splits": {"train": names[:2], "val": names[2:3], "test": names[3:]},
                    },
                },
                "models": {"policy": {"backend": "scripted", "name": "unused"}},
                "budget": {"generations": 0},
            }
        )
    )
    r = subprocess.run(
        [sys.executable, "-m", "evolve", "run", str(tmp_path / "task.yaml"), "--out", str(tmp_path / "r")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-3000:]
    rep = json.loads((tmp_path / "r" / "report.json").read_text())
    assert rep["baseline"]["val"] == {"score": want, "n": 1} and rep["baseline"]["test"] == {"score": want, "n": 1}
