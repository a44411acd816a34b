"""The escape suite: model-written code trying to get out of the `process` sandbox. Each attempt
must be contained, get the right verdict, and leave no process behind (checked by scanning /proc
after every test for sandbox uids, our own bwrap children and per-test marker strings)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from evolve.sandbox import Limits, SandboxUnavailable, get_sandbox
from tests.helpers.sandbox_leftovers import assert_no_leftovers

FAST = Limits(wall_s=2, cpu_s=2)
PROJECT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def box():
    try:
        return get_sandbox("process")
    except SandboxUnavailable as exc:  # pragma: no cover
        pytest.skip(f"process sandbox unavailable here: {exc}")


@pytest.fixture
def marker():
    mark = f"evolve-escape-{uuid.uuid4().hex}"
    yield mark
    assert_no_leftovers(mark)


@pytest.fixture(autouse=True)
def _nothing_left_behind():
    yield
    assert_no_leftovers()


def _try(code_lines: str) -> str:
    """Wrap attempts so each records 'ok:...' or 'fail:ErrName' in RESULT[name]."""
    return "RESULT = {}\n" + code_lines


READS = """
import os
def attempt(name, fn):
    try:
        RESULT[name] = 'ok:' + repr(fn())[:200]
    except BaseException as exc:
        RESULT[name] = 'fail:' + type(exc).__name__
attempt('project', lambda: open(INPUTS['project']).read())
attempt('test_file', lambda: open(INPUTS['test_file']).read())
attempt('shadow', lambda: open('/etc/shadow').read())
attempt('root_home', lambda: sorted(os.listdir('/root')))
attempt('pyenv_versions', lambda: sorted(os.listdir(os.path.dirname(INPUTS['prefix']))))
attempt('work', lambda: os.listdir('/work'))
attempt('host_tmp', lambda: os.listdir(INPUTS['host_tmp']))
attempt('env', lambda: {k: v for k, v in os.environ.items() if 'SECRET' in k or INPUTS['secret'] in v})
attempt('proc_environ_1', lambda: open('/proc/1/environ').read())
attempt('pids', lambda: len([p for p in os.listdir('/proc') if p.isdigit()]))
attempt('etc', lambda: sorted(os.listdir('/etc')))
"""


def test_host_files_and_environment_are_invisible(box, tmp_path):
    secret = "s3cr3t-" + uuid.uuid4().hex
    os.environ["EVOLVE_TEST_SECRET"] = secret
    (tmp_path / "host-only.txt").write_text("host")
    try:
        import sys

        inputs = {
            "project": str(PROJECT / "pyproject.toml"),
            "test_file": __file__,
            "secret": secret,
            "prefix": os.path.realpath(sys.base_prefix),
            "host_tmp": str(tmp_path),
        }
        res = box.run(_try(READS), inputs=inputs, limits=FAST)
    finally:
        del os.environ["EVOLVE_TEST_SECRET"]
    assert res.ok, res.error
    r = res.value
    for name in ("project", "test_file", "shadow", "work", "host_tmp", "proc_environ_1"):
        assert r[name].startswith("fail:"), (name, r[name])
    assert r["env"] == "ok:{}"
    # /root holds only the path down to the bound interpreter, nothing else from the host's /root
    assert r["root_home"] == "ok:['.pyenv']" or not os.path.realpath(sys.base_prefix).startswith("/root/")
    assert r["pyenv_versions"] == f"ok:[{os.path.basename(inputs['prefix'])!r}]" or not inputs["prefix"].startswith(
        "/root/"
    )
    assert r["etc"] == "ok:['group', 'passwd']"
    assert int(r["pids"][3:]) <= 2  # its own pid namespace: bwrap's init and itself
    assert secret not in res.stdout + res.stderr + repr(res.value)


WRITES = """
import os
def attempt(name, fn):
    try:
        fn()
        RESULT[name] = 'ok'
    except BaseException as exc:
        RESULT[name] = 'fail:' + type(exc).__name__
attempt('usr', lambda: open('/usr/evil', 'w').write('x'))
attempt('usr_bin', lambda: open('/usr/bin/python3', 'a').write('x'))
attempt('prefix', lambda: open(INPUTS['prefix'] + '/evil', 'w').write('x'))
attempt('project', lambda: open(INPUTS['project'] + '/evil', 'w').write('x'))
attempt('host_tmp', lambda: open(INPUTS['host_tmp'] + '/evil', 'w').write('x'))
attempt('root_fs', lambda: open('/evil', 'w').write('x'))
attempt('etc_passwd', lambda: open('/etc/passwd', 'a').write('x'))
attempt('dev', lambda: open('/dev/evil', 'w').write('x'))
attempt('tmp', lambda: open('/tmp/fine', 'w').write('x'))
attempt('tmp_fill', lambda: open('/tmp/big', 'wb').write(b'x' * (200 * 1024 * 1024)))
"""


def test_writes_outside_the_private_tmp_fail(box, tmp_path):
    import sys

    prefix = os.path.realpath(sys.base_prefix)
    inputs = {"prefix": prefix, "project": str(PROJECT), "host_tmp": str(tmp_path)}
    before = sorted(os.listdir(PROJECT))
    res = box.run(_try(WRITES), inputs=inputs, limits=Limits(wall_s=5, cpu_s=5, file_size_mb=512, tmp_mb=16))
    assert res.ok, res.error
    r = res.value
    for name in ("usr", "usr_bin", "prefix", "project", "host_tmp", "root_fs", "etc_passwd", "dev", "tmp_fill"):
        assert r[name].startswith("fail:"), (name, r[name])
    assert r["tmp"] == "ok"  # the private tmpfs is writable (and size-capped: tmp_fill failed)
    assert not Path("/usr/evil").exists() and not Path(prefix, "evil").exists()
    assert not (PROJECT / "evil").exists() and not (tmp_path / "evil").exists()
    assert sorted(os.listdir(PROJECT)) == before


def test_network_only_own_loopback(box):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        try:
            accepted.append(server.accept())
        except OSError:
            pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    code = (
        "import socket\n"
        "RESULT = {'ifaces': [n for _, n in socket.if_nameindex()],\n"
        "          'dev': [l.split(':')[0].strip() for l in open('/proc/net/dev').readlines()[2:]]}\n"
        "try:\n"
        "    socket.create_connection(('127.0.0.1', INPUTS['port']), timeout=1)\n"
        "    RESULT['connect'] = 'connected'\n"
        "except OSError as exc:\n"
        "    RESULT['connect'] = type(exc).__name__\n"
        "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); c = socket.create_connection(s.getsockname())\n"
        "RESULT['own_loopback'] = 'works'\n"
    )
    try:
        res = box.run(code, inputs={"port": port}, limits=FAST)
    finally:
        t.join(1)
        server.close()
    assert res.ok, res.error
    assert res.value["ifaces"] == ["lo"] and res.value["dev"] == ["lo"]
    assert res.value["connect"] == "ConnectionRefusedError" and not accepted
    assert res.value["own_loopback"] == "works"


def test_fork_bomb_is_contained(box):
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    t0 = time.monotonic()
    res = box.run(code, limits=Limits(wall_s=2, cpu_s=2, max_procs=16))
    assert res.verdict in ("timeout", "killed", "error") and time.monotonic() - t0 < 5
    # the host can still fork
    assert subprocess.run(["true"], check=False).returncode == 0
    # the limit really stops it: count processes it managed to make
    res = box.run(
        "import os, time\nn = 0\nfor _ in range(200):\n    try:\n        pid = os.fork()\n"
        "    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n"
        "    n += 1\nRESULT = n",
        limits=Limits(wall_s=3, cpu_s=3, max_procs=16),
    )
    assert res.ok and 1 <= res.value < 16


def test_memory_bomb_gives_memory(box):
    res = box.run(
        "x = []\nwhile True:\n    x.append(bytearray(10 * 1024 * 1024))\n", limits=Limits(wall_s=5, memory_mb=128)
    )
    assert res.verdict == "memory" and "MemoryError" in res.error


def test_infinite_loop_times_out_near_wall_s(box):
    t0 = time.monotonic()
    res = box.run("while True:\n    pass\n", limits=Limits(wall_s=1, cpu_s=5))
    took = time.monotonic() - t0
    assert res.verdict == "timeout" and 0.9 < took < 2.5, took
    res = box.run(
        "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\ntime.sleep(60)",
        limits=Limits(wall_s=1, cpu_s=5),
    )  # defeats the in-sandbox alarm: the host kills it
    assert res.verdict == "timeout" and "killed" in res.error
    res = box.run(
        "import signal\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\nwhile True: pass",
        limits=Limits(wall_s=10, cpu_s=1),
    )
    assert res.verdict == "timeout" and "CPU-time" in res.error


def test_daemons_do_not_outlive_the_call(box, marker):
    code = (
        "import os, subprocess, sys, time\n"
        "sleeper = [sys.executable, '-c', 'import time; time.sleep(1000)', INPUTS['m']]\n"
        "subprocess.Popen(sleeper, start_new_session=True)\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        "        os.execv(sys.executable, sleeper)\n"
        "    os._exit(0)\n"
        "time.sleep(0.3)\n"
        "RESULT = sum(INPUTS['m'] in open(f'/proc/{p}/cmdline').read() for p in os.listdir('/proc') if p.isdigit())\n"
    )
    res = box.run(code, inputs={"m": marker}, limits=FAST)
    assert res.ok and res.value == 2, res
    # the marker fixture asserts they are gone from the host


def test_huge_output_is_capped(box):
    res = box.run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", limits=Limits(wall_s=5))
    assert res.verdict == "killed" and "output cap" in res.error and res.truncated
    assert 1_000_000 <= len(res.stdout) < 1_000_200
    res = box.run("print('y' * 100_000_000)", limits=Limits(wall_s=5, memory_mb=1024, output_bytes=10_000))
    assert res.verdict == "killed" and len(res.stdout) < 10_200
    res = box.call_many(
        "def f():\n    print('z' * 3_000_000)\n    return 1\n", "f", [{}], limits=Limits(wall_s=5, output_bytes=1000)
    )
    assert res[0].ok and res[0].truncated and len(res[0].stdout) < 1200


CTYPES = """
import ctypes, os, subprocess, socket
libc = ctypes.CDLL(None, use_errno=True)
def attempt(name, fn):
    try:
        RESULT[name] = fn()
    except BaseException as exc:
        RESULT[name] = 'fail:' + type(exc).__name__
attempt('unshare_user', lambda: (libc.unshare(0x10000000), ctypes.get_errno()))
attempt('unshare_net', lambda: (libc.unshare(0x40000000), ctypes.get_errno()))
attempt('setuid0', lambda: (libc.setuid(0), ctypes.get_errno()))
attempt('mount', lambda: (libc.mount(b'none', b'/tmp', b'tmpfs', 0, None), ctypes.get_errno()))
attempt('ptrace', lambda: (libc.ptrace(16, 1, 0, 0), ctypes.get_errno()))
attempt('system_cat', lambda: libc.system(('cat %s > /tmp/out 2>&1' % INPUTS['project']).encode()))
attempt('system_out', lambda: open('/tmp/out').read()[:100])
attempt('subprocess', lambda: subprocess.run(['cat', INPUTS['project']], capture_output=True).returncode)
attempt('touch_host', lambda: os.system('touch %s' % INPUTS['host_marker']))
attempt('net', lambda: subprocess.run(['python3', '-c', 'import socket; socket.create_connection(("127.0.0.1", %d), 1)'
                                       % INPUTS['port']], capture_output=True).returncode)
attempt('kill_host', lambda: os.kill(INPUTS['host_pid'], 9))
attempt('poke_memory', lambda: open('/proc/%d/mem' % INPUTS['host_pid'], 'r+b'))
attempt('status', lambda: [l.split(':')[0] + l.split(':')[1].strip()
                           for l in open('/proc/self/status') if l.startswith(('CapEff', 'CapPrm', 'NoNewPrivs'))])
"""


def test_ctypes_and_subprocess_stay_inside(box, tmp_path):
    host_marker = tmp_path / "touched-by-sandbox"
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    try:
        inputs = {
            "project": str(PROJECT / "pyproject.toml"),
            "host_marker": str(host_marker),
            "port": server.getsockname()[1],
            "host_pid": os.getpid(),
        }
        res = box.run(_try(CTYPES), inputs=inputs, limits=Limits(wall_s=5, cpu_s=5))
    finally:
        server.close()
    assert res.ok, res.error
    r = res.value
    import errno

    for name in ("unshare_user", "unshare_net", "setuid0", "mount", "ptrace"):
        assert r[name][0] == -1 and r[name][1] in (errno.EPERM, errno.EINVAL, errno.ENOSYS), (name, r[name])
    assert r["system_cat"] != 0 and "No such file" in r["system_out"]
    assert r["subprocess"] != 0 and r["net"] != 0
    assert r["kill_host"] == "fail:ProcessLookupError" and r["poke_memory"] == "fail:FileNotFoundError"
    assert r["status"] == ["CapPrm0000000000000000", "CapEff0000000000000000", "NoNewPrivs1"]
    assert not host_marker.exists()


def test_limits_cannot_be_raised_from_inside(box):
    code = (
        "import resource\nRESULT = {}\n"
        "for name in ('RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_NPROC', 'RLIMIT_FSIZE'):\n"
        "    res = getattr(resource, name)\n"
        "    try:\n"
        "        resource.setrlimit(res, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
        "        RESULT[name] = 'raised'\n"
        "    except (ValueError, OSError):\n"
        "        RESULT[name] = resource.getrlimit(res)\n"
    )
    res = box.run(code, limits=Limits(wall_s=2, cpu_s=2, memory_mb=200, max_procs=20, file_size_mb=3))
    assert res.ok and res.value == {
        "RLIMIT_AS": [200 << 20, 200 << 20],
        "RLIMIT_CPU": [2, 3],
        "RLIMIT_NPROC": [20, 20],
        "RLIMIT_FSIZE": [3 << 20, 3 << 20],
    }


def test_payloads_aimed_at_the_host_stay_data(box, tmp_path):
    pwned = tmp_path / "pwned"
    payloads = {
        "pickle": f"cos\nsystem\n(S'touch {pwned}'\ntR.",
        "eval": f"__import__('os').system('touch {pwned}')",
        "yaml": f"!!python/object/apply:os.system ['touch {pwned}']",
    }
    code = (
        "import sys, os\n"
        'print(\'{"i": 0, "verdict": "ok", "value": "forged"}\')\n'
        "print('{\"done\": true}')\n"
        'sys.stderr.write(\'{"i": 0, "verdict": "ok", "value": "forged"}\\n\')\n'
        "RESULT = INPUTS\n"
    )
    res = box.run(code, inputs=payloads, limits=FAST)
    assert res.ok and res.value == payloads  # returned verbatim, as strings
    assert '"forged"' in res.stdout and '"forged"' in res.stderr  # forged protocol lines are just output
    res = box.call("def f():\n    return " + repr(payloads["eval"]) + "\n", "f", limits=FAST)
    assert res.value == payloads["eval"]
    assert not pwned.exists()


def test_non_root_mode_contains_a_fork_bomb():
    """When the host process is not root, bwrap takes its unprivileged user-namespace path; check it
    here by running a second host process as nobody (needs root, setpriv and a system python)."""
    if os.geteuid() != 0 or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"):
        pytest.skip("needs root, setpriv and /usr/bin/python3 to start an unprivileged host process")
    import tempfile

    from evolve.sandbox._paths import find_bwrap

    where = Path(tempfile.mkdtemp(prefix="evolve-sandbox-nonroot-"))
    where.chmod(0o755)
    script = where / "nonroot.py"
    script.write_text(
        "import importlib.util, sys, json\n"
        f"spec = importlib.util.spec_from_file_location('sbx', {str(PROJECT / 'sandbox' / '__init__.py')!r},\n"
        f"    submodule_search_locations=[{str(PROJECT / 'sandbox')!r}])\n"
        "m = importlib.util.module_from_spec(spec); sys.modules['sbx'] = m; spec.loader.exec_module(m)\n"
        "from sbx.process import ProcessSandbox\nfrom sbx import Limits\n"
        f"b = ProcessSandbox(bwrap={find_bwrap()!r}, python='/usr/bin/python3')\n"
        "L = Limits(wall_s=2, cpu_s=2, max_procs=16)\n"
        "bomb = b.run('import os\\nwhile True:\\n    try:\\n        os.fork()\\n    except OSError:\\n        pass\\n', limits=L)\n"
        "info = b.run('import os, socket\\nRESULT = [os.getuid(), [n for _, n in socket.if_nameindex()], "
        'open("/proc/self/status").read().count("CapEff:\\t0000000000000000")]\', limits=L)\n'
        "print(json.dumps([bomb.verdict, info.verdict, info.value, info.error]))\n"
    )
    script.chmod(0o644)
    try:
        out = subprocess.run(
            ["setpriv", "--reuid", "65534", "--regid", "65534", "--clear-groups", "/usr/bin/python3", str(script)],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
            cwd="/",
        )
    finally:
        shutil.rmtree(where)
    assert out.returncode == 0, out.stderr
    import json

    bomb, info, value, error = json.loads(out.stdout.strip().splitlines()[-1])
    assert bomb in ("timeout", "killed", "error") and info == "ok", error
    assert value == [65534, ["lo"], 1]
    assert_no_leftovers("/usr/bin/python3 -I -S")


def _tree(root: Path) -> dict:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in ["", *dirnames, *filenames]:
            p = Path(dirpath) / name
            st = os.lstat(p)
            out[str(p.relative_to(root))] = (st.st_uid, st.st_mode, p.read_bytes() if p.is_file() else None)
    return out


def test_a_workspace_never_follows_the_links_its_commands_plant(tmp_path):
    """The host copies into, makes folders in, reads from and deletes in a workspace whose commands
    planted links to a canary folder (and a FIFO): it refuses each link and each non-file, never
    writes, reads, deletes or chowns through one, and copies a folder's own links as links."""
    from evolve.sandbox.beneath import Refused
    from evolve.sandbox.shell import Workspace

    canary = tmp_path / "canary"
    (canary / "sub").mkdir(parents=True)
    (canary / "secret.txt").write_text("canary secret\n")
    src = tmp_path / "src"
    src.mkdir()
    (src / "f.txt").write_text("payload\n")
    (src / "inner").symlink_to(canary)
    before = _tree(canary)
    try:
        ws = Workspace({"/app": None, "/logs": None})
    except SandboxUnavailable as exc:  # pragma: no cover
        pytest.skip(f"process sandbox unavailable here: {exc}")
    try:
        r = ws.exec(
            f"ln -s {canary} /app/l && ln -s {canary}/secret.txt /app/s && mkfifo /app/fifo && mkdir /app/d", timeout=10
        )
        assert r.ok, r
        attempts = {
            "put a file through": lambda: ws.put("/app/l/x.txt", src / "f.txt"),
            "put a folder onto": lambda: ws.put("/app/l", src),
            "put a file in place of": lambda: ws.put("/app/l", src / "f.txt"),
            "make a folder through": lambda: ws.makedirs("/app/l/sub/new"),
            "read a link": lambda: ws.read("/app/s"),
            "read through": lambda: ws.read("/app/l/secret.txt"),
            "delete through": lambda: ws.remove("/app/l/secret.txt"),
            "copy out through": lambda: ws.copy_out("/app/l", tmp_path / "out"),
        }
        for what, attempt in attempts.items():
            with pytest.raises(Refused, match=r"/app/[ls] is a symbolic link"):
                attempt()
                pytest.fail(what)
        with pytest.raises(Refused, match="/app/fifo is not a regular file"):
            ws.read("/app/fifo")  # refused at once, never blocking on the FIFO
        ws.put("/app/d", src)
        r = ws.exec("readlink /app/d/inner; cat /app/d/f.txt; stat -c %u /app/d/f.txt /app/d", timeout=10)
        assert r.stdout.split("\n")[:2] == [str(canary), "payload"], r
        if ws.uid is not None:  # run by root: what the host made is the sandbox uid's
            assert r.stdout.split("\n")[2:4] == [str(ws.uid)] * 2, r
        assert ws.read("/app/d/f.txt") == b"payload\n" and ws.read("/app/nothing") is None
        ws.remove("/app/l")  # the link itself
        assert ws.exec("test -e /app/l || echo gone", timeout=10).stdout == "gone\n"
    finally:
        ws.close()
    assert _tree(canary) == before
    with pytest.raises(ValueError, match="may not nest"):
        Workspace({"/app": None, "/app/data": None})
