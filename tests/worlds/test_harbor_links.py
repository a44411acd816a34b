"""world: harbor on the sandbox backend: nothing a task or an agent writes reaches the host.

The host runs as root here, and each stage that can plant a symbolic link does: the task's own
files (and the Dockerfile's COPY), the build's RUN lines, the agent's commands, solve.sh and
test.sh. Each link points at a canary folder outside the task, and each test then drives the host
through every operation it does on the workspace: copying in, making folders, removing stale
reward files, handing files to the sandbox's uid, reading the reward file, cleaning up. After
each, the canary is exactly as it was (names, bytes, owners), no score came from it, and none of
its bytes reached a message or the agent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from evolve.errors import InfraError
from evolve.worlds.harbor import load_task
from evolve.worlds.harbor.check import check_task
from evolve.worlds.harbor.environment import open_environment
from evolve.worlds.harbor.task import TaskError
from tests.helpers.harbor import use_sandbox
from tests.worlds.test_harbor import mk, play

SECRET = "CANARY-SECRET-3f9a"
# copies the agent's result file as it is (cp -P keeps a link a link), as a test that collects an
# output file might; without one, writes 0
COLLECT = (
    "#!/bin/bash\nmkdir -p /logs/verifier\ncp -P /app/result.txt /logs/verifier/reward.txt 2>/dev/null "
    "|| echo 0 > /logs/verifier/reward.txt\n"
)


@pytest.fixture(autouse=True)
def sandbox_backend(monkeypatch):
    use_sandbox(monkeypatch)


def _snapshot(root: Path) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in ["", *dirnames, *filenames]:
            p = Path(dirpath) / name
            st = os.lstat(p)
            body = os.readlink(p) if p.is_symlink() else p.read_bytes() if p.is_file() else None
            out[str(p.relative_to(root))] = (st.st_uid, st.st_gid, st.st_mode, body)
    return out


@pytest.fixture
def canary(tmp_path):
    """A folder outside every task, owned by root, that no stage may write, read, delete or chown."""
    d = tmp_path / "canary"
    (d / "sub").mkdir(parents=True)
    (d / "secret.txt").write_text(SECRET + "\n")
    (d / "one.txt").write_text("1\n")
    (d / "reward.txt").write_text("1\n")
    (d / "reward.json").write_text('{"reward": 1}\n')
    (d / "sub" / "deep.txt").write_text("deep\n")
    _BEFORE[d] = _snapshot(d)
    assert {v[0] for v in _BEFORE[d].values()} == {os.geteuid()}
    return d


_BEFORE: dict[Path, dict] = {}


def untouched(canary: Path) -> None:
    assert _snapshot(canary) == _BEFORE[canary], "the host wrote, deleted or chowned through a link into the canary"


def _no_secret(*texts) -> None:
    for t in texts:
        assert SECRET not in str(t), "a canary file's bytes reached a message"


def _world_failed(traj, needle: str) -> None:
    assert traj.infra is not None and traj.infra.category == "environment", (traj.infra, traj.score)
    assert needle in traj.infra.message, traj.infra.message
    _no_secret(traj.infra.message)


# ----------------------------------------------------------------------------- the task's own files


def test_links_in_a_tasks_files_are_never_followed(tmp_path, canary):
    # instruction.md, task.toml or the Dockerfile as a link to a host file: refused, never read
    for i, name in enumerate(("instruction.md", "task.toml", "environment/Dockerfile")):
        d = mk(tmp_path / "t", f"linked-{i}")
        (d / name).unlink()
        (d / name).symlink_to(canary / "secret.txt")
        if name != "environment/Dockerfile":
            with pytest.raises(TaskError) as e:
                load_task(d)
            assert f"{name} is a symbolic link" in str(e.value) and e.value.status == "invalid"
            _no_secret(e.value)
            continue
        with pytest.raises(InfraError) as e:
            open_environment(load_task(d), "sandbox")
        assert "Dockerfile is a symbolic link" in str(e.value) and e.value.status == "unsupported"
        _no_secret(e.value)
    # a COPY source that is a link out of the build context
    d = mk(tmp_path / "t", "copy-link", dockerfile="FROM python:3.11-slim\nWORKDIR /app\nCOPY leak /app/\n")
    (d / "environment" / "leak").symlink_to(canary / "secret.txt")
    with pytest.raises(InfraError, match="COPY source environment/leak is a symbolic link") as e:
        open_environment(load_task(d), "sandbox")
    _no_secret(e.value)
    # a folder the task copies holds a link; a later COPY writes through it
    d = mk(
        tmp_path / "t",
        "copy-through",
        files={"f.txt": "payload\n"},
        dockerfile="FROM python:3.11-slim\nWORKDIR /app\nCOPY dir/ /app/dir/\nCOPY f.txt /app/dir/evil/\n",
    )
    (d / "environment" / "dir").mkdir()
    (d / "environment" / "dir" / "evil").symlink_to(canary)
    with pytest.raises(InfraError, match="COPY to /app/dir/evil/f.txt: /app/dir/evil is a symbolic link") as e:
        open_environment(load_task(d), "sandbox")
    assert "docker backend" in str(e.value) and e.value.status == "unsupported"
    # the task ships /logs/verifier as a link: the host deletes stale reward files and hands the
    # folder to the sandbox's uid before the tests run
    d = mk(tmp_path / "t", "logs-link", dockerfile="FROM python:3.11-slim\nWORKDIR /app\nCOPY logs/ /logs/\n")
    (d / "environment" / "logs").mkdir()
    (d / "environment" / "logs" / "verifier").symlink_to(canary)
    traj = play(load_task(d), ["```bash\necho ok > /app/out.txt\n```", "DONE"])
    assert traj.infra is None and traj.score == 1.0, (traj.infra, traj.score)  # scored by its own tests
    untouched(canary)


# ----------------------------------------------------------------------------- the build's RUN lines


def test_links_the_build_plants_are_never_followed(tmp_path, canary):
    df = "FROM python:3.11-slim\nWORKDIR /app\n"
    d = mk(
        tmp_path / "t",
        "copy-into-link",
        files={"f.txt": "payload\n"},
        dockerfile=df + f"RUN ln -s {canary} /app/evil\nCOPY f.txt /app/evil/\n",
    )
    with pytest.raises(InfraError, match="COPY to /app/evil/f.txt: /app/evil is a symbolic link") as e:
        open_environment(load_task(d), "sandbox")
    assert e.value.status == "unsupported" and "docker backend" in str(e.value)
    d = mk(
        tmp_path / "t",
        "workdir-through-link",
        dockerfile=df
        + f"WORKDIR /app/w/made\nRUN mv /app/w /app/w.orig && ln -s {canary} /app/w\nWORKDIR /app/w/made\n"
        "RUN true\n",
    )
    with pytest.raises(InfraError, match="/app/w is a symbolic link"):
        open_environment(load_task(d), "sandbox")
    d = mk(tmp_path / "t", "verifier-link", dockerfile=df + f"RUN ln -s {canary} /logs/verifier\n")
    traj = play(load_task(d), ["```bash\necho ok > /app/out.txt\n```", "DONE"])
    assert traj.infra is None and traj.score == 1.0, (traj.infra, traj.score)
    d = mk(
        tmp_path / "t", "reward-link", test=COLLECT, dockerfile=df + f"RUN ln -s {canary / 'one.txt'} /app/result.txt\n"
    )
    _world_failed(play(load_task(d), ["DONE"]), "/logs/verifier/reward.txt is a symbolic link")
    untouched(canary)


# ----------------------------------------------------------------------------- the agent's commands


def test_links_the_agent_plants_are_never_followed(tmp_path, canary):
    t = load_task(mk(tmp_path, "t", test=COLLECT))
    # /logs/verifier made a link: the host must neither delete the canary's reward files nor chown it
    traj = play(
        t, [f"```bash\nrm -rf /logs/verifier && ln -s {canary} /logs/verifier && ln -s {canary} /app/x\n```", "DONE"]
    )
    assert traj.infra is None and traj.score == 0.0, (traj.infra, traj.score)
    # the agent's result file a link to a host file holding 1: never read as the score
    _world_failed(
        play(t, [f"```bash\nln -s {canary / 'one.txt'} /app/result.txt\n```", "DONE"]),
        "/logs/verifier/reward.txt is a symbolic link",
    )
    # ... nor a host file's bytes into the error the reflective operator reads
    _world_failed(
        play(t, [f"```bash\nln -s {canary / 'secret.txt'} /app/result.txt\n```", "DONE"]), "is a symbolic link"
    )
    untouched(canary)


# ----------------------------------------------------------------------------- solve.sh and test.sh


def test_links_solve_sh_plants_are_never_followed(tmp_path, canary):
    t = load_task(
        mk(
            tmp_path,
            "t",
            test=COLLECT,
            solve=f"rm -rf /logs/verifier; ln -s {canary} /logs/verifier\nln -s {canary / 'one.txt'} /app/result.txt",
        )
    )
    verdict = check_task(t, "sandbox", cache=False)
    assert verdict["status"] == "broken" and "reward.txt is a symbolic link" in verdict["why"], verdict
    _no_secret(verdict)
    untouched(canary)


def test_links_test_sh_plants_are_never_followed(tmp_path, canary):
    for target in ("one.txt", "secret.txt"):
        t = load_task(
            mk(
                tmp_path / target,
                "t",
                test=f"#!/bin/bash\nmkdir -p /logs/verifier\n"
                f"ln -s {canary / target} /logs/verifier/reward.txt\nln -s {canary} /app/x\n",
            )
        )
        _world_failed(play(t, ["DONE"]), "/logs/verifier/reward.txt is a symbolic link")
    t = load_task(
        mk(
            tmp_path,
            "json",
            test=f"#!/bin/bash\nmkdir -p /logs\nrm -rf /logs/verifier\nln -s {canary} /logs/verifier\nexit 1\n",
        )
    )
    env = open_environment(t, "sandbox")
    try:
        for _ in range(2):  # a second verification finds the link the first test.sh left
            with pytest.raises(InfraError, match="reward.json is a symbolic link|verifier is a symbolic link"):
                env.verify()
    finally:
        env.close()
    untouched(canary)


# ----------------------------------------------------------------------------- the docker backend

BASE = "debian:bookworm"  # built on the tests' local stand-in (the image map, docs/worlds.md)


def test_on_docker_files_come_out_through_the_engine_and_a_tasks_links_stay_links(tmp_path, canary, docker_engine):
    """Files leave the container only through the engine's API: a reward file that is a link is the
    world failing, never a score by exit code; the task's tests/ goes in with its links as links and
    no FIFO; a .dockerignore that is a link is never read by the host."""
    from evolve.worlds.harbor.environment import DockerEnvironment

    client = docker_engine.client

    toml = f'[environment]\ndocker_image = "{BASE}"\n[verifier]\ntimeout_sec = 30\n'
    d = mk(
        tmp_path,
        "t",
        toml=toml,
        dockerfile=f"FROM {BASE}\nWORKDIR /app\n",
        test="#!/bin/bash\nmkdir -p /logs/verifier\nln -s /etc/hostname /logs/verifier/reward.txt\nexit 0\n",
    )
    (d / "tests" / "canary").symlink_to(canary)
    os.mkfifo(d / "tests" / "fifo")
    env = DockerEnvironment(docker_engine.task(d), client)
    try:
        with pytest.raises(InfraError, match="reward.txt is not a regular file"):
            env.verify()
        r = env.exec("readlink /tests/canary; test -e /tests/fifo || echo no-fifo", timeout=30)
        assert r.stdout == f"{canary}\nno-fifo\n", r
    finally:
        env.close()
    d = mk(tmp_path, "ignore", dockerfile=f"FROM {BASE}\nWORKDIR /app\n")
    (d / "environment" / ".dockerignore").symlink_to(canary / "secret.txt")
    with pytest.raises(InfraError, match=".dockerignore is not a regular file"):
        DockerEnvironment(docker_engine.task(d), client)
    untouched(canary)
