"""What a Harbor task (someone else's code) never gets from the host, on a real Docker engine (the
``docker_engine`` fixture): the host's network during its build (a loopback service a task's
``RUN`` line tries to reach sees nothing, unless the user opted in), Docker's raw sockets in its
containers, and the host's environment variables unless the user allowed each by name, whose
values are then masked in everything the run stores."""

from __future__ import annotations

import json
import logging
import socket
from pathlib import Path

import pytest

from evolve.worlds.harbor.environment.outcome import EnvironmentError_
from evolve.worlds.harbor.task import UnsupportedTask, load_task
from tests.helpers.docker_engine import ours
from tests.helpers.harbor import play, shells

SECRET = "sk-evolvekit-canary-5f1e9a"


@pytest.fixture
def engine(docker_engine):
    yield docker_engine
    for c in docker_engine.client.containers.list(all=True, filters=ours(docker_engine)):
        c.remove(force=True)


def mk(
    root: Path,
    name: str,
    *,
    dockerfile: str = "FROM python:3.11-slim\nWORKDIR /app\n",
    toml: str = "",
    test: str = "echo 1 > /logs/verifier/reward.txt\n",
    solve: str = "true",
) -> Path:
    d = root / name
    for sub in ("environment", "tests", "solution"):
        (d / sub).mkdir(parents=True)
    (d / "instruction.md").write_text("Do the task.\n")
    (d / "task.toml").write_text("[agent]\ntimeout_sec = 60\n" + toml)
    (d / "environment" / "Dockerfile").write_text(dockerfile)
    (d / "tests" / "test.sh").write_text("#!/bin/bash\n" + test)
    (d / "solution" / "solve.sh").write_text("#!/bin/bash\n" + solve + "\n")
    return d


def _episode(task: dict, client) -> dict:
    from evolve.worlds.harbor.environment.docker import DockerEnvironment

    env = DockerEnvironment(task, client)
    try:
        return env.verify()
    finally:
        env.close()


def _accepted(srv: socket.socket) -> bytes | None:
    """What a connection to the listener sent, or None when nothing connected."""
    srv.settimeout(0.5)
    try:
        conn, _ = srv.accept()
    except OSError:
        return None
    with conn:
        conn.settimeout(5)
        return conn.recv(100)


# ----------------------------------------------------------------------------- item 1: the build's network


def test_a_tasks_build_never_reaches_a_service_on_the_hosts_loopback(engine, tmp_path, caplog):
    """A RUN line that connects to a loopback service (what a gateway holding a key, evolve mcp
    --http or the dashboard would be) reaches nothing: the build has no network, fails as the world
    failing naming the image map and the opt-in; with build_network: host (the user's explicit
    choice, logged as a warning) the same build reaches it."""
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        d = mk(
            tmp_path,
            "reach-loopback",
            dockerfile=(
                "FROM python:3.11-slim\nRUN python3 -c \"import socket; socket.create_connection(('127.0.0.1', "
                f"{port}), 5).sendall(b'from-the-build')\"\nWORKDIR /app\n"
            ),
        )
        task = engine.task(d)
        with pytest.raises(EnvironmentError_, match="docker build of environment/ failed") as e:
            _episode(task, engine.client)
        assert _accepted(srv) is None, "a task's build reached a service on the host's loopback"
        if "bridge" not in {n.name for n in engine.client.networks.list()}:  # --bridge=none, as the tests start it
            assert "the build ran without a network" in e.value.reason
            assert "dataset.params.images" in e.value.reason and "build_network: host" in e.value.reason
        with caplog.at_level(logging.WARNING, logger="evolve.worlds.harbor"):
            assert _episode({**task, "build_network": "host"}, engine.client)["score"] == 1.0
        assert _accepted(srv) == b"from-the-build"
        assert any("HOST network" in r.getMessage() and "reach-loopback" in r.getMessage() for r in caplog.records)


def test_a_task_folder_cannot_ask_for_the_host_network_and_a_bad_setting_is_named(tmp_path):
    from evolve.errors import ConfigError
    from evolve.worlds.harbor.dataset import dataset

    d = mk(tmp_path, "asks", toml='[environment]\nbuild_network = "host"\n')
    with pytest.raises(ConfigError, match="unknown key 'build_network' at the \\[environment\\]"):
        load_task(d)
    with pytest.raises(ConfigError, match="build_network 'hostt' is not one of auto, none, host"):
        dataset(source=str(tmp_path), build_network="hostt", environment="docker")


def test_containers_have_no_raw_sockets_unless_docker_defaults_are_asked_for(engine, tmp_path):
    from evolve.worlds.harbor.environment.docker import DockerEnvironment

    raw = "python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)'"
    task = engine.task(mk(tmp_path, "raw"))
    for setting, code in (("reduced", 1), ("docker", 0)):
        env = DockerEnvironment({**task, "capabilities": setting}, engine.client)
        try:
            r = env.sh(raw, timeout=30, user="0")
            assert r.exit_code == code, (setting, r.stdout, r.stderr)
            assert code == 0 or "PermissionError" in r.stderr
        finally:
            env.close()


# ----------------------------------------------------------------------------- item 2: ${VAR}


def test_a_task_reads_a_host_variable_only_when_the_user_allowed_it_and_its_value_is_masked(
    engine, tmp_path, monkeypatch
):
    monkeypatch.setenv("EVOLVEKIT_TEST_SECRET", SECRET)
    leak = mk(
        tmp_path,
        "leak",
        toml='[verifier]\nenv = { TOKEN = "${EVOLVEKIT_TEST_SECRET}" }\n',
        test='echo "token: $TOKEN"; echo 1 > /logs/verifier/reward.txt\n',
    )
    with pytest.raises(UnsupportedTask) as e:  # not allowed: never read, and the run says how to allow it
        engine.task(leak)
    assert (
        "EVOLVEKIT_TEST_SECRET" in e.value.reason
        and "dataset.params.allow_env: [EVOLVEKIT_TEST_SECRET]" in e.value.reason
        and "--allow-env EVOLVEKIT_TEST_SECRET" in e.value.reason
    )
    quiet = mk(
        tmp_path,
        "quiet",
        toml='[verifier]\nenv = { TOKEN = "${EVOLVEKIT_TEST_SECRET:-none}" }\n',
        test='echo "token: $TOKEN"; [ "$TOKEN" = none ] && echo 1 > /logs/verifier/reward.txt\n',
    )
    t = engine.task(quiet, backend="docker")  # not allowed, with a default: the default, and a note
    assert any("EVOLVEKIT_TEST_SECRET is not passed to tasks" in n for n in t["notes"])
    traj = play(t, ["DONE"])
    assert traj.score == 1.0 and SECRET not in traj.model_dump_json()

    # allowed: the tests and the agent's commands get it; its value is masked in all the run keeps
    both = mk(
        tmp_path,
        "both",
        toml=(
            '[verifier]\nenv = { TOKEN = "${EVOLVEKIT_TEST_SECRET}" }\n'
            '[environment]\nenv = { API = "${EVOLVEKIT_TEST_SECRET}" }\n'
        ),
        test=f'echo "token: $TOKEN"; [ "$TOKEN" = {SECRET} ] && echo 1 > /logs/verifier/reward.txt\n',
    )
    t = engine.task(both, allow_env=["EVOLVEKIT_TEST_SECRET"], backend="docker")
    assert t["allow_env"] == ["EVOLVEKIT_TEST_SECRET"] and SECRET not in json.dumps(t)
    traj = play(t, ['```bash\necho "api=$API"; echo "$API" > /app/copy.txt\n```', "DONE"])
    assert traj.score == 1.0, traj.reward  # the tests saw the real value
    assert shells(traj)[0]["stdout"] == "api=***\n"
    assert "token: ***" in traj.reward.feedback and SECRET not in traj.reward.feedback
    stored = traj.model_dump_json()  # the trajectory as the archive keeps it: messages, tool results, reward
    assert SECRET not in stored and "api=***" in stored

    from evolve.worlds.harbor.check import check_task

    verdict = check_task(t, "docker", cache=False)
    assert verdict["host_env"] == {"EVOLVEKIT_TEST_SECRET": "allowed"} and SECRET not in json.dumps(verdict)


def test_a_failing_verifier_that_prints_the_secret_is_masked_in_the_error(engine, tmp_path, monkeypatch):
    monkeypatch.setenv("EVOLVEKIT_TEST_SECRET", SECRET)
    d = mk(
        tmp_path,
        "crash",
        toml='[verifier]\nenv = { TOKEN = "${EVOLVEKIT_TEST_SECRET}" }\n',
        test='echo "the token is $TOKEN"; exit 1\n',
    )  # no reward file: the world failing, its output quoted
    from evolve.worlds.harbor.environment import open_environment

    env = open_environment(engine.task(d, allow_env=["EVOLVEKIT_TEST_SECRET"]), "docker")
    try:
        with pytest.raises(EnvironmentError_, match="RewardFileNotFoundError|wrote no reward file") as e:
            env.verify()
    finally:
        env.close()
    assert "the token is ***" in str(e.value) and SECRET not in str(e.value)


def test_the_check_command_lists_the_host_variables_each_task_reads(tmp_path, monkeypatch):
    """``evolve harbor check`` says which host variables a task's ${VAR} values read and whether each
    was allowed (--allow-env); an allowed value never appears in what it prints."""
    import subprocess
    import sys

    from tests.helpers.harbor import use_sandbox

    use_sandbox(monkeypatch)
    monkeypatch.setenv("EVOLVEKIT_GREETING_NAME", SECRET)
    folder = Path(__file__).parents[2] / "examples" / "harbor_shapes" / "host-var-greeting"
    rows = {}
    for flags in ([], ["--allow-env", "EVOLVEKIT_GREETING_NAME"]):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "evolve",
                "harbor",
                "check",
                "-e",
                "sandbox",
                "--no-cache",
                "--json",
                *flags,
                str(folder),
            ],
            capture_output=True,
            text=True,
            timeout=300,
            env={**__import__("os").environ, "EVOLVE_CACHE_DIR": str(tmp_path / "cache")},
        )
        assert SECRET not in r.stdout + r.stderr
        rows[bool(flags)] = json.loads(r.stdout.strip().splitlines()[-1])
    assert rows[False]["host_env"] == {"EVOLVEKIT_GREETING_NAME": "not allowed"} and rows[False]["status"] == "ok"
    assert any("--allow-env EVOLVEKIT_GREETING_NAME" in n for n in rows[False]["notes"])
    assert rows[True]["host_env"] == {"EVOLVEKIT_GREETING_NAME": "allowed"} and rows[True]["status"] == "ok", rows[True]
