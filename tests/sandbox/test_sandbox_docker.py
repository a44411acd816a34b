"""The docker backend's protocol end to end against a fake engine: the fake's "container" is a
plain local process running the same command line, so this checks request delivery on stdin,
marked result lines on stdout, timeouts, and that every container is killed and removed. It runs
only our own test code (no model-written code), so no isolation is needed for it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile

import pytest

from evolve.sandbox import Limits
from evolve.sandbox.docker_backend import DockerSandbox


class FakeAPI:
    def __init__(self):
        self.removed, self.killed, self.configs = [], [], []
        self.proc = None

    def create_host_config(self, **kwargs):
        return kwargs

    def create_container(self, host_config, **create):
        import inspect

        from docker.api.container import ContainerApiMixin

        assert set(create) <= set(inspect.signature(ContainerApiMixin.create_container).parameters)
        self.configs.append((create, host_config))
        return {"Id": f"c{len(self.configs)}"}

    def attach_socket(self, cid, params):
        assert params == {"stdin": 1, "stream": 1}
        ours, self._theirs = socket.socketpair()
        return ours

    def start(self, cid):
        create, _ = self.configs[-1]
        cmd = [sys.executable if create["command"][0] == "python" else create["command"][0], *create["command"][1:]]
        self.out, self.err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115
        self.proc = subprocess.Popen(
            cmd,
            stdin=self._theirs.fileno(),
            stdout=self.out,
            stderr=self.err,
            env=create["environment"],
            cwd=create["working_dir"],
        )
        self._theirs.close()

    def wait(self, cid, timeout):
        try:
            return {"StatusCode": self.proc.wait(timeout=timeout)}
        except subprocess.TimeoutExpired as exc:
            raise ConnectionError("read timed out") from exc

    def kill(self, cid):
        self.killed.append(cid)
        self.proc.kill()
        self.proc.wait()

    def inspect_container(self, cid):
        return {"State": {"OOMKilled": False}}

    def logs(self, cid, stdout, stderr, stream, follow):
        f = self.out if stdout else self.err
        f.seek(0)
        while chunk := f.read(7):  # tiny chunks: markers get split across them
            yield chunk

    def remove_container(self, cid, force, v):
        self.removed.append(cid)


class FakeClient:
    def __init__(self):
        self.api = FakeAPI()
        self.images = self

    def get(self, name):
        return name


@pytest.fixture
def docker_box():
    return DockerSandbox(client=FakeClient(), slack_s=0.5)


def test_fake_engine_call_run_and_forged_lines(docker_box, tmp_path):
    res = docker_box.call("def f(a):\n    print('hi', end='')\n    return a + 1\n", "f", {"a": 1})
    assert res.ok and res.value == 2 and res.stdout == "hi"
    marker = tmp_path / "pwned"
    code = (
        'print(\'{"i": 0, "verdict": "ok", "value": "forged"}\')\n'
        'print(\'@@sandbox-00000000000000000000000000000000@@{"i": 0, "verdict": "ok", "value": 666}\')\n'
        f"RESULT = \"__import__('os').system('touch {marker}')\"\n"
    )
    res = docker_box.run(code)
    assert res.ok and res.value == f"__import__('os').system('touch {marker}')"
    assert '"forged"' in res.stdout and "666" in res.stdout and not marker.exists()
    api = docker_box.client.api
    assert api.removed == ["c1", "c2"] and api.killed == []


def test_fake_engine_errors_timeouts_and_batches(docker_box):
    res = docker_box.run("import os\nos._exit(4)", limits=Limits(wall_s=1))
    assert res.verdict == "error" and "status 4" in res.error
    res = docker_box.run(
        "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True: pass",
        limits=Limits(wall_s=1, cpu_s=10),
    )
    assert res.verdict == "timeout"
    code = "import time\ndef f(x):\n    print(x)\n    if x == 1:\n        time.sleep(30)\n    return {'x': x}\n"
    res = docker_box.call_many(code, "f", [{"x": 0}, {"x": 1}, {"x": 2}], limits=Limits(wall_s=1))
    assert [r.verdict for r in res] == ["ok", "timeout", "ok"] and res[2].value == {"x": 2}
    assert [r.stdout for r in res] == ["0\n", "1\n", "2\n"]
    api = docker_box.client.api
    assert api.killed == ["c2"] and api.removed == ["c1", "c2", "c3"]


def test_fake_engine_never_sees_host_environment(docker_box):
    os.environ["EVOLVE_TEST_SECRET"] = "s3cr3t-docker"
    try:
        res = docker_box.run("import os\nRESULT = dict(os.environ)")
    finally:
        del os.environ["EVOLVE_TEST_SECRET"]
    assert res.ok and "EVOLVE_TEST_SECRET" not in res.value and "s3cr3t-docker" not in repr(res.value)
