"""The sandbox's API on the `process` backend (normal use), path vetting, and the docker backend
without an engine (its container config and its error). The escape suite is
tests/sandbox/test_sandbox_escape.py; the docker protocol through a fake engine, tests/sandbox/test_sandbox_docker.py."""

from __future__ import annotations

import os
import socket
import sys
import time

import pytest

from evolve.sandbox import (
    Limits,
    Sandbox,
    SandboxResult,
    SandboxUnavailable,
    get_sandbox,
)
from tests.helpers.sandbox_leftovers import assert_no_leftovers

FAST = Limits(wall_s=2, cpu_s=2)


@pytest.fixture(scope="module")
def box():
    try:
        return get_sandbox("process")
    except SandboxUnavailable as exc:  # pragma: no cover - machines without user namespaces or bwrap
        pytest.skip(f"process sandbox unavailable here: {exc}")


@pytest.fixture(autouse=True)
def _nothing_left_behind():
    yield
    assert_no_leftovers()


ADD = "def add(a, b):\n    return a + b\n"


def test_call_returns_json_value(box):
    assert isinstance(box, Sandbox) and box.name == "process"
    res = box.call(ADD, "add", {"a": 2, "b": 3}, limits=FAST)
    assert res == SandboxResult("ok", 5, "", "", None, res.duration_s)
    assert res.ok and 0 < res.duration_s < 2
    res = box.call("def f(**kw):\n    return {'echo': kw, 't': (1, 2), 'n': None}\n", "f", {"x": [1, "é", {"y": 1.5}]})
    assert res.value == {"echo": {"x": [1, "é", {"y": 1.5}]}, "t": [1, 2], "n": None}


def test_run_sees_inputs_and_returns_result(box):
    res = box.run("RESULT = {'sum': sum(INPUTS['xs']), 'name': __name__}", inputs={"xs": [1, 2, 3]}, limits=FAST)
    assert res.ok and res.value == {"sum": 6, "name": "__main__"}
    assert box.run("x = 1", limits=FAST).value is None  # RESULT unset
    assert box.run("RESULT = INPUTS", limits=FAST).value == {}
    assert box.run("import sys\nRESULT = 7\nsys.exit(0)", limits=FAST).value == 7  # a normal end of a script


def test_stdout_and_stderr_are_captured(box):
    code = "import sys, os\nprint('to out', flush=True)\nprint('to err', file=sys.stderr)\nos.system('echo from a child')\nRESULT = 1"
    res = box.run(code, limits=FAST)
    assert res.ok and res.stdout == "to out\nfrom a child\n" and res.stderr == "to err\n"


def test_user_exception_gives_error_with_traceback(box):
    res = box.call("def f():\n    return 1 / 0\n", "f", limits=FAST)
    assert res.verdict == "error" and res.value is None
    assert "ZeroDivisionError" in res.error and 'File "<sandbox>", line 2, in f' in res.error
    assert "<string>" not in res.error  # the bootstrap's own frames are hidden
    assert box.call("x = 1\n", "missing", limits=FAST).error.endswith("no function named 'missing'\n")
    assert "SyntaxError" in box.run("def (", limits=FAST).error
    assert "sys.exit(3)" in box.run("import sys\nsys.exit(3)", limits=FAST).error


@pytest.mark.parametrize(
    "code, fragment",
    [
        ("RESULT = {1, 2}", "Object of type set is not JSON serializable"),
        ("RESULT = float('nan')", "Out of range float"),
        ("RESULT = [float('inf')]", "Out of range float"),
        ("RESULT = object()", "Object of type object is not JSON serializable"),
        ("RESULT = b'bytes'", "Object of type bytes is not JSON serializable"),
        ("RESULT = []\nRESULT.append(RESULT)", "Circular reference"),
        ("RESULT = {(1, 2): 3}", "keys must be str"),
    ],
)
def test_a_result_that_is_not_json_is_an_error(box, code, fragment):
    res = box.run(code, limits=FAST)
    assert res.verdict == "error" and res.value is None
    assert "not JSON-serialisable" in res.error and fragment in res.error


def test_a_result_over_the_cap_is_an_error(box):
    res = box.run("RESULT = 'x' * 5000", limits=Limits(wall_s=2, output_bytes=1000))
    assert res.verdict == "error" and "over the cap of 1000" in res.error


def test_inputs_must_be_json(box):
    with pytest.raises(TypeError, match="JSON-serialisable"):
        box.run("RESULT = 1", inputs={"s": {1, 2}})
    with pytest.raises(TypeError, match="code must be a str"):
        box.run(b"RESULT = 1")  # type: ignore[arg-type]


def test_call_many_each_call_has_its_own_result_and_a_hanging_case_times_out(box):
    code = (
        "import time\n"
        "def f(x):\n"
        "    print('case', x)\n"
        "    if x == 2:\n"
        "        time.sleep(60)\n"
        "    if x == 3:\n"
        "        raise ValueError('bad case')\n"
        "    return x * 10\n"
    )
    t0 = time.monotonic()
    res = box.call_many(code, "f", [{"x": i} for i in range(5)], limits=Limits(wall_s=1, cpu_s=2))
    assert time.monotonic() - t0 < 4
    assert [r.verdict for r in res] == ["ok", "ok", "timeout", "error", "ok"]
    assert [r.value for r in res] == [0, 10, None, None, 40]
    assert [r.stdout for r in res] == [f"case {i}\n" for i in range(5)]
    assert "ValueError: bad case" in res[3].error and "wall-clock" in res[2].error
    assert box.call_many(code, "f", [], limits=FAST) == []


def test_call_many_case_that_defeats_the_alarm_is_killed_and_the_rest_run(box):
    code = (
        "import signal\n"
        "def f(x):\n"
        "    if x == 1:\n"
        "        signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "        while True:\n"
        "            pass\n"
        "    return x\n"
    )
    res = box.call_many(code, "f", [{"x": i} for i in range(4)], limits=Limits(wall_s=1, cpu_s=5))
    assert [r.verdict for r in res] == ["ok", "timeout", "ok", "ok"]
    assert [r.value for r in res] == [0, None, 2, 3]


def test_call_many_load_failure_and_process_death(box):
    res = box.call_many("import nonexistent_module_xyz\ndef f():\n    return 1\n", "f", [{}, {}], limits=FAST)
    assert [r.verdict for r in res] == ["error", "error"] and "loading the code failed" in res[0].error
    code = "import os\ndef f(x):\n    if x == 1:\n        os._exit(9)\n    return x\n"
    res = box.call_many(code, "f", [{"x": 0}, {"x": 1}, {"x": 2}], limits=FAST)
    assert [r.verdict for r in res] == ["ok", "error", "error"]
    assert "status 9" in res[1].error and res[2].error.startswith("not run: the sandbox died during call #1")


def test_call_many_memory_error_is_per_call(box):
    code = "def f(n):\n    return len(bytearray(n))\n"
    res = box.call_many(code, "f", [{"n": 10}, {"n": 4 * 1024**3}, {"n": 20}], limits=Limits(wall_s=2, memory_mb=256))
    assert [r.verdict for r in res] == ["ok", "memory", "ok"] and res[2].value == 20


def test_ro_paths_are_readable_not_writable(box, tmp_path):
    db = tmp_path / "data" / "facts.txt"
    db.parent.mkdir()
    db.write_text("the answer is 42\n")
    db.chmod(0o644)
    code = (
        "import os\n"
        "RESULT = {'text': open(INPUTS['p']).read()}\n"
        "for probe in (lambda: open(INPUTS['p'], 'a').write('x'), lambda: os.remove(INPUTS['p']),\n"
        "              lambda: open(os.path.join(os.path.dirname(INPUTS['p']), 'new'), 'w')):\n"
        "    try:\n"
        "        probe()\n"
        "        RESULT.setdefault('wrote', []).append(1)\n"
        "    except OSError as exc:\n"
        "        RESULT.setdefault('refused', []).append(exc.errno)\n"
    )
    res = box.run(code, inputs={"p": str(db)}, ro_paths=[db], limits=FAST)
    assert res.ok, res.error
    assert res.value["text"] == "the answer is 42\n" and "wrote" not in res.value and len(res.value["refused"]) == 3
    assert db.read_text() == "the answer is 42\n" and sorted(p.name for p in db.parent.iterdir()) == ["facts.txt"]
    res = box.run(
        "RESULT = sorted(__import__('os').listdir(INPUTS['d']))",
        inputs={"d": str(db.parent)},
        ro_paths=str(db.parent),
        limits=FAST,
    )  # a single path is accepted too
    assert res.value == ["facts.txt"]
    # without ro_paths the same file is not there
    assert box.run("open(INPUTS['p'])", inputs={"p": str(db)}, limits=FAST).verdict == "error"


@pytest.mark.parametrize(
    "path, reason",
    [
        ("/nonexistent/file.db", "does not exist"),
        ("/etc/shadow", "sensitive host path"),
        ("/etc", "sensitive host path"),
        ("/", "root directory"),
        ("/var", "sensitive host path"),
        (os.path.expanduser("~"), "home directory"),
        ("/proc/self/environ", "sensitive host path"),
    ],
)
def test_ro_paths_refused(box, path, reason):
    res = box.run("RESULT = 1", ro_paths=[path], limits=FAST)
    assert res.verdict == "denied" and reason in res.error and res.value is None
    many = box.call_many(ADD, "add", [{"a": 1, "b": 2}] * 2, ro_paths=[path], limits=FAST)
    assert [r.verdict for r in many] == ["denied", "denied"]


def test_ro_paths_refuses_secrets_and_unreadable_files(box, tmp_path):
    ssh = tmp_path / ".ssh"
    ssh.mkdir()
    (ssh / "config").write_text("x")
    res = box.run("RESULT = 1", ro_paths=[ssh / "config"], limits=FAST)
    assert res.verdict == "denied" and "credentials" in res.error
    chan = tmp_path / "chan"
    chan.mkdir()
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(chan / "host.sock"))
    try:
        res = box.run("RESULT = 1", ro_paths=[chan], limits=FAST)
    finally:
        srv.close()
    assert res.verdict == "denied" and "socket or FIFO" in res.error
    link = tmp_path / "innocent"
    link.symlink_to("/etc/passwd")
    assert box.run("RESULT = 1", ro_paths=[link], limits=FAST).verdict == "denied"  # judged by its target
    if os.geteuid() == 0:
        private = tmp_path / "private.db"
        private.write_text("x")
        private.chmod(0o600)
        res = box.run("RESULT = 1", ro_paths=[private], limits=FAST)
        assert res.verdict == "denied" and "world-readable" in res.error


def test_limits_are_validated():
    with pytest.raises(ValueError, match="wall_s"):
        Limits(wall_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        Limits(memory_mb=8)
    assert Limits().output_bytes == 1_000_000 and Limits().max_procs == 32


def test_unknown_backend_lists_the_names():
    with pytest.raises(ValueError, match="process, docker"):
        get_sandbox("firecracker")


def test_sandboxed_python_is_isolated(box):
    res = box.run(
        "import sys\nRESULT = [sys.flags.isolated, sys.flags.no_site, sys.flags.dont_write_bytecode, "
        "sys.prefix, __import__('os').getcwd()]",
        limits=FAST,
    )
    assert res.value[:3] == [1, 1, 1] and res.value[4] == "/tmp"
    assert os.path.realpath(sys.base_prefix) == res.value[3]


# -- docker backend, no engine here ---------------------------------------------------------------


def _engine_reachable() -> str | None:
    try:
        import docker

        docker.from_env().ping()
        return None
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"


NO_ENGINE = _engine_reachable()


@pytest.mark.skipif(NO_ENGINE is None, reason="a Docker engine is reachable here")
def test_docker_unavailable_says_why_and_what_works(box):
    with pytest.raises(SandboxUnavailable) as err:
        get_sandbox("docker")
    msg = str(err.value)
    assert msg.startswith("docker: no engine reachable at ") and "the 'process' backend works here" in msg


def test_docker_container_config_is_locked_down():
    from evolve.sandbox.docker_backend import DockerSandbox

    class Images:
        def get(self, name):
            return name

    class Client:
        images = Images()

    sb = DockerSandbox(client=Client())
    create, host = sb.container_config(Limits(memory_mb=256, max_procs=16, tmp_mb=32), [("/data/x.db", "/data/x.db")])
    assert create["user"] == "65534:65534" and create["network_disabled"] is True
    assert create["stdin_open"] and not create["detach"] and not create["tty"] and not create["use_config_proxy"]
    assert set(create["environment"]) == {"PATH", "HOME", "LANG", "PYTHONDONTWRITEBYTECODE"}
    assert create["command"][:5] == ["python", "-I", "-S", "-B", "-c"] and create["command"][-2:] == ["-", "marker"]
    assert host["network_mode"] == "none" and host["read_only"] is True
    assert host["cap_drop"] == ["ALL"] and host["security_opt"] == ["no-new-privileges"]
    assert host["mem_limit"] == host["memswap_limit"] == 256 * 1024 * 1024
    assert host["pids_limit"] == 16 and host["nano_cpus"] == 10**9 and host["init"] is True
    assert host["tmpfs"] == {"/tmp": "rw,nosuid,nodev,size=32m,mode=1777"}
    assert host["binds"] == {"/data/x.db": {"bind": "/data/x.db", "mode": "ro"}}
    assert {u["Name"] for u in host["ulimits"]} == {"cpu", "fsize", "nofile", "core"}
    os.environ["EVOLVE_TEST_SECRET"] = "s3cr3t"
    try:
        create, _ = sb.container_config(Limits())
        assert "s3cr3t" not in repr(create)
    finally:
        del os.environ["EVOLVE_TEST_SECRET"]
    # the real SDK accepts exactly these arguments and builds the documented engine config from them
    import docker

    api = docker.APIClient(base_url="unix:///nonexistent/docker.sock", version="1.43")
    hc = api.create_host_config(**host)
    assert hc["NetworkMode"] == "none" and hc["ReadonlyRootfs"] and hc["CapDrop"] == ["ALL"] and hc["Init"]
    assert hc["PidsLimit"] == 16 and hc["Binds"] == ["/data/x.db:/data/x.db:ro"]
    cfg = api.create_container_config(
        create["image"],
        create["command"],
        create["hostname"],
        create["user"],
        create["detach"],
        create["stdin_open"],
        create["tty"],
        environment=create["environment"],
        network_disabled=True,
        host_config=hc,
    )
    assert cfg["StdinOnce"] and cfg["OpenStdin"] and cfg["NetworkDisabled"] and cfg["User"] == "65534:65534"


def test_docker_live_run(docker_engine):
    """The docker backend on a real engine, its image a stand-in for python:3.11-slim (the image map)."""
    sb = get_sandbox("docker", image=docker_engine.images["python:3.11-slim"])
    res = sb.call(ADD, "add", {"a": 1, "b": 2}, limits=FAST)
    assert res.ok and res.value == 3
    res = sb.run("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)", limits=FAST)
    assert res.verdict == "error"
    assert sb.run("while True: pass", limits=FAST).verdict == "timeout"


def test_data_roots_admit_files_in_a_hidden_home_folder_and_nothing_broader(tmp_path, monkeypatch):
    from evolve.sandbox import get_sandbox

    home = tmp_path / "home"
    cache = home / ".cache" / "evolvekit"
    cache.mkdir(parents=True)
    (cache / "t.db").write_text("rows")
    (home / ".bashrc").write_text("export TOKEN=1")
    for p in (home, home / ".cache", cache, cache / "t.db", home / ".bashrc"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    monkeypatch.setenv("HOME", str(home))
    plain = get_sandbox("process", probe=False)
    assert plain.run("RESULT = 1", ro_paths=[cache / "t.db"], limits=FAST).verdict == "denied"
    trusting = get_sandbox("process", probe=False, data_roots=[cache])
    res = trusting.run(
        "RESULT = open(INPUTS['p']).read()", inputs={"p": str(cache / "t.db")}, ro_paths=[cache / "t.db"], limits=FAST
    )
    assert res.ok and res.value == "rows"
    assert trusting.run("RESULT = 1", ro_paths=[home / ".bashrc"], limits=FAST).verdict == "denied"
    for too_broad in (home, "/", "/etc/ssl", cache / ".ssh"):
        with pytest.raises(ValueError, match="data root"):
            get_sandbox("process", probe=False, data_roots=[too_broad])
