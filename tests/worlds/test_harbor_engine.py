"""The docker tests leave a user's engine alone (tests/helpers/docker_engine.py): their teardown
removes only the containers and images this session made (its id in a label), never a user's own
harbor run or image on the same engine; a dockerd an earlier, killed session started is found by
its record and stopped, while a process that merely has its pid now is left alone; and in CI as
root with apt a missing engine is a failure, not a silent skip."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import subprocess
import tarfile

from tests.helpers import docker_engine as de


def _image(client, tag: str, labels: dict) -> str:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = f"FROM {de.DEBIAN}\nRUN echo {tag} > /made\n".encode()
        info = tarfile.TarInfo("Dockerfile")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    buf.seek(0)
    img, _ = client.images.build(
        fileobj=buf, custom_context=True, tag=tag, labels=labels, network_mode="none", rm=True, forcerm=True
    )
    return img.id


def test_teardown_removes_what_this_session_made_and_nothing_of_a_users(docker_engine, tmp_path, monkeypatch):
    from evolve.worlds.harbor.environment.docker import DockerEnvironment

    c = docker_engine.client
    # a session of its own, so that its teardown here leaves the other tests' images alone
    name = getattr(de, "SESSION_ENV", "EVOLVE_HARBOR_SESSION")
    monkeypatch.setenv(name, "tests-teardown-" + os.urandom(4).hex())
    session = dataclasses.replace(docker_engine, started=None)
    if hasattr(session, "session"):
        session = dataclasses.replace(session, session=os.environ[name])
    # a user's own harbor run on the same engine, made while the tests run: labelled as the world labels it
    users_ct = c.containers.run(
        de.DEBIAN, ["sleep", "300"], detach=True, labels={"evolvekit": "harbor"}, network_mode="none"
    )
    users_img = _image(c, "users-own/harbor-task:1", {"evolvekit": "harbor"})
    # what this session makes: a task's image and an episode's container
    d = tmp_path / "ours"
    for sub in ("environment", "tests"):
        (d / sub).mkdir(parents=True)
    (d / "instruction.md").write_text("Do it.\n")
    (d / "environment" / "Dockerfile").write_text("FROM python:3.11-slim\nRUN echo ours > /ours\nWORKDIR /app\n")
    (d / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    env = DockerEnvironment(docker_engine.task(d), c)
    ours_ct, ours_img = env.container.id, env.image
    try:
        de.tear_down(session)  # the session's teardown, the engine kept (the variable is restored after the test)
        left = {x.id for x in c.containers.list(all=True)}
        assert users_ct.id in left, "the teardown removed a user's harbor container"
        assert users_img in {i.id for i in c.images.list()}, "the teardown removed a user's image"
        assert ours_ct not in left and not [i for i in c.images.list() if ours_img in i.tags]
    finally:
        env.close()
        with contextlib.suppress(Exception):  # (gone already where a teardown took it)
            users_ct.remove(force=True)
            c.images.remove(users_img, force=True)


def test_a_dockerd_a_killed_session_left_is_found_and_stopped_and_nothing_else_is(tmp_path, monkeypatch):
    monkeypatch.setattr(de, "PIDFILE", tmp_path / "dockerd.json")
    left = subprocess.Popen(["sleep", "300"], start_new_session=True)  # stands for the dockerd a killed session left
    try:
        de.record(left.pid)
        assert de.orphan() == left.pid, de.PIDFILE.read_text()
        assert de.stop_orphan() == left.pid
        assert left.wait(timeout=30) is not None and not de.PIDFILE.exists()
    finally:
        if left.poll() is None:
            left.kill()
    other = subprocess.Popen(["sleep", "300"], start_new_session=True)  # a process that has the recorded pid now
    try:
        de.record(other.pid)
        rec = de.PIDFILE.read_text().replace('"start": "', '"start": "9')  # recorded when another process had it
        de.PIDFILE.write_text(rec)
        assert de.orphan() is None and de.stop_orphan() is None
        assert other.poll() is None and not de.PIDFILE.exists()
    finally:
        other.kill()
        other.wait()


def test_in_ci_as_root_with_apt_a_missing_engine_fails_instead_of_skipping(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    assert not de.must_have_engine()
    monkeypatch.setenv("CI", "true")
    assert de.must_have_engine() == (os.geteuid() == 0 and __import__("shutil").which("apt-get") is not None)
