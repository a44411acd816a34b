"""The `process` backend: a fresh bubblewrap sandbox (Linux namespaces) per run.

Inside: its own user, pid, net (loopback only), ipc, uts, cgroup and mount namespaces; a root that
holds only /usr (plus the /bin, /lib* links), this interpreter's base installation, a size-capped
tmpfs at /tmp and /dev/shm, a fresh /proc and a minimal /dev, a two-line /etc/passwd and /etc/group,
and the caller's ro_paths — all read-only except the tmpfs. No host environment variable crosses
(--clearenv). A seccomp denylist refuses namespace, mount, ptrace, bpf, keyring, io_uring and
similar syscalls. Hard rlimits (CPU, address space, processes, file size, open files) are set by the
bootstrap before the code is read; the code cannot raise them.

Run by root, bwrap cannot map the sandbox to an unprivileged uid through its own user namespace,
and RLIMIT_NPROC never applies to uid 0. So for root the sandbox skips the user namespace, keeps
only CAP_SETUID/CAP_SETGID, and the bootstrap drops at once to a fresh random uid/gid with no
groups; no_new_privs stops any way back. Run by anyone else, the sandbox uses bwrap's unprivileged
user namespace (with --disable-userns so the code cannot nest another).
"""

from __future__ import annotations

import functools
import os
import secrets
import subprocess
import sysconfig
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from . import _seccomp
from ._paths import INSTALL_HINT, check_data_roots, find_bwrap, find_python, vet_ro_paths
from ._protocol import BOOTSTRAP_SOURCE, batch_result, death_result, request_bytes
from ._runner import GRACE_S, collect
from ._types import Limits, SandboxResult, SandboxUnavailable
from .base import Outcome, SandboxBase, fill_after_death

_ENV = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "LANG": "C.UTF-8",
    "LC_ALL": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
    "TMPDIR": "/tmp",
}
_PROBE_CACHE: dict[tuple, str | None] = {}
SANDBOX_UIDS = range(1_500_000_000, 2_000_000_000)  # run by root, each sandbox gets a fresh uid from here


class ProcessSandbox(SandboxBase):
    """Sandbox backend on bubblewrap. Options: bwrap (path), python (interpreter inside; its
    installation is bound read-only), site_packages (also bind this environment's site-packages and
    put them on sys.path — read-only, off by default), probe (check once that a sandbox starts),
    data_roots (host folders trusted as data: ro_paths inside them may sit in a home directory,
    e.g. evolvekit's cache; credential names are still refused)."""

    name = "process"

    def __init__(
        self,
        *,
        bwrap: str | None = None,
        python: str | None = None,
        site_packages: bool = False,
        probe: bool = True,
        data_roots: Sequence[str | Path] = (),
    ):
        try:
            self.data_roots = check_data_roots(data_roots)
        except ValueError as e:
            raise ValueError(f"process sandbox: {e}") from None
        self.bwrap = find_bwrap(bwrap)
        self.features = _bwrap_features(self.bwrap)
        missing = {"--cap-drop", "--perms", "--ro-bind-data", "--die-with-parent", "--seccomp"} - self.features
        if missing:
            raise SandboxUnavailable(
                f"process: {self.bwrap} is too old (no {', '.join(sorted(missing))}); {INSTALL_HINT}"
            )
        # bwrap >= 0.10 can cap a tmpfs's size; older ones leave /tmp bounded only by host RAM
        self.tmp_size_capped = "--size" in self.features
        self.python, self.prefix = find_python(python)
        self.boot_code = _compiled_bootstrap(self.python)
        self.as_root = os.geteuid() == 0
        self.seccomp = _seccomp.program()
        self.extra_binds: list[str] = []
        if site_packages:
            paths = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
            self.extra_binds = sorted(os.path.realpath(p) for p in paths if os.path.isdir(p))
        if probe:
            self._probe()

    # -- what the base asks of a backend ----------------------------------------------------------

    def _once(self, mode: str, code: str, limits: Limits, binds, **fields) -> Outcome:
        request = request_bytes(mode, code, limits, nproc=True, **fields)
        got = self._spawn(request, limits, binds, batch=False, deadline=time.monotonic() + limits.wall_s + GRACE_S)
        return Outcome(got.lines, got.stdout, got.stderr, got.ending, got.duration, got.bad_lines)

    def _many(self, code: str, function: str, calls: list[dict], limits: Limits, binds) -> list[SandboxResult]:
        t0 = time.monotonic()
        # The whole batch: a wall_s for loading plus one per call, plus slack; CPU scaled alike.
        overall = t0 + limits.wall_s * (len(calls) + 1) + 2 * GRACE_S
        batch_limits = _scaled_cpu(limits, len(calls) + 1)
        results: list[SandboxResult | None] = [None] * len(calls)
        start = 0
        while start < len(calls):
            request = request_bytes("many", code, batch_limits, nproc=True, function=function, calls=calls[start:])
            began = time.monotonic()
            got = self._spawn(
                request,
                batch_limits,
                binds,
                batch=True,
                deadline=overall,
                first_call_deadline=began + limits.wall_s + GRACE_S + 1.0,
            )
            per_call = got.duration / max(1, len(calls) - start)
            for obj in got.lines:
                i = obj.get("i")
                if "verdict" not in obj or not isinstance(i, int):
                    continue
                if i == -1:  # loading the code failed: every remaining call gets that outcome
                    res = batch_result(obj, limits, got.duration)
                    for j in range(start, len(calls)):
                        results[j] = res
                elif 0 <= i < len(calls) - start:
                    results[start + i] = batch_result(obj, limits, per_call)
            missing = [j for j in range(start, len(calls)) if results[j] is None]
            if not missing:
                break
            if got.ending.kill_reason == "call_wall" and got.current is not None and time.monotonic() < overall:
                # One call hung past its alarm: it times out, the rest go on in a fresh sandbox.
                results[start + got.current] = death_result(
                    got.ending, limits, stdout="", stderr="", duration=limits.wall_s, truncated=False
                )
                start = start + got.current + 1
                continue
            fill_after_death(
                results, Outcome(got.lines, got.stdout, got.stderr, got.ending, got.duration), limits, missing[0]
            )
            break
        return [r for r in results if r is not None]

    # -- internals --------------------------------------------------------------------------------

    def _binds(self, ro_paths) -> list[tuple[str, str]]:
        return vet_ro_paths(ro_paths, world_readable=self.as_root, data_roots=self.data_roots)

    def _argv(self, binds, limits: Limits, uid: int, result_fd: int, data_fds: list[int]) -> list[str]:
        def data(content: bytes) -> str:
            # an anonymous in-memory file (a pipe could block once the user's pipe quota is spent)
            fd = os.memfd_create("evolve-sandbox", os.MFD_CLOEXEC)
            data_fds.append(fd)
            view = memoryview(content)
            while view:
                view = view[os.write(fd, view) :]
            os.lseek(fd, 0, os.SEEK_SET)
            return str(fd)

        argv = [self.bwrap]
        if self.as_root:
            argv += [
                "--unshare-ipc",
                "--unshare-pid",
                "--unshare-net",
                "--unshare-uts",
                "--unshare-cgroup-try",
                "--cap-drop",
                "ALL",
                "--cap-add",
                "CAP_SETUID",
                "--cap-add",
                "CAP_SETGID",
            ]
        else:
            argv += ["--unshare-all", "--unshare-user", "--cap-drop", "ALL"]
            if "--disable-userns" in self.features:  # bwrap >= 0.8; the seccomp filter refuses it anyway
                argv += ["--disable-userns"]
        argv += ["--die-with-parent", "--new-session", "--hostname", "sandbox", "--clearenv"]
        for key, value in _ENV.items():
            argv += ["--setenv", key, value]
        argv += ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
            if os.path.islink(top):
                argv += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                argv += ["--ro-bind", top, top]
        made: set[str] = set()

        def parents(path: str) -> list[str]:
            # bwrap makes missing parents of a mount point 0700 (root's /root here): the unprivileged
            # sandbox uid could not traverse them, so make them 0755 first. Only inside the new root.
            out = []
            for parent in reversed(list(Path(path).parents)[:-1]):
                p = str(parent)
                if p not in made and not _covered(p):
                    made.add(p)
                    out += ["--perms", "0755", "--dir", p]
            return out

        for path in [self.prefix, *self.extra_binds]:
            if not path.startswith("/usr/"):
                argv += parents(path) + ["--ro-bind", path, path]
        tmp = limits.tmp_mb * 1024 * 1024
        argv += ["--proc", "/proc", "--dev", "/dev"]
        for size, where in ((min(tmp, 16 << 20), "/dev/shm"), (tmp, "/tmp")):
            argv += ["--perms", "1777"] + (["--size", str(size)] if self.tmp_size_capped else []) + ["--tmpfs", where]
        gid = uid
        argv += [
            "--perms",
            "0755",
            "--dir",
            "/etc",
            "--perms",
            "0644",
            "--ro-bind-data",
            data(f"sandbox:x:{uid}:{gid}:sandbox:/tmp:/bin/sh\n".encode()),
            "/etc/passwd",
            "--perms",
            "0644",
            "--ro-bind-data",
            data(f"sandbox:x:{gid}:\n".encode()),
            "/etc/group",
        ]
        for source, dest in binds:
            argv += parents(dest) + ["--ro-bind", source, dest]
        argv += self._more_mounts(parents)
        argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp"]
        if self.seccomp is not None:
            argv += ["--seccomp", data(self.seccomp)]
        pyflags = ["-I", "-S", "-B"] if not self.extra_binds else ["-I", "-B"]
        if self.boot_code is not None:
            # the bootstrap precompiled by this very interpreter, read from a memfd: saves compiling it per call
            fd = data(self.boot_code)
            bootstrap = (
                f"import marshal, os\nb = b''\nwhile c := os.read({fd}, 65536):\n    b += c\n"
                f"os.close({fd})\nexec(marshal.loads(b))\n"
            )
        else:
            bootstrap = BOOTSTRAP_SOURCE
        if self.extra_binds:
            bootstrap = f"import sys; sys.path.extend({self.extra_binds!r})\n" + bootstrap
        argv += ["--", self.python, *pyflags, "-c", bootstrap, str(uid) if self.as_root else "-", f"fd:{result_fd}"]
        return argv

    def _sandbox_uid(self) -> int:
        """The uid the code runs as: run by root, a fresh one per sandbox; else the caller's own."""
        return SANDBOX_UIDS[secrets.randbelow(len(SANDBOX_UIDS))] if self.as_root else os.getuid()

    def _more_mounts(self, parents) -> list[str]:
        """bwrap arguments for mounts a subclass adds after the read-only binds (none here;
        :mod:`.shell` binds a task's writable workspace). ``parents(dest)`` makes a mount point's
        missing parents traversable."""
        return []

    def _spawn(
        self,
        request: bytes,
        limits: Limits,
        binds,
        *,
        batch: bool,
        deadline: float,
        first_call_deadline: float | None = None,
    ):
        uid = self._sandbox_uid()
        result_r, result_w = os.pipe()
        data_fds: list[int] = []
        t0 = time.monotonic()
        try:
            argv = self._argv(binds, limits, uid, result_w, data_fds)
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(result_w, *data_fds),
                start_new_session=True,
                cwd="/",
                env={"PATH": "/usr/bin:/bin"},
            )
        except BaseException:
            os.close(result_r)
            raise
        finally:
            os.close(result_w)
            for fd in data_fds:
                os.close(fd)
        return collect(
            proc,
            request,
            result_r,
            limits,
            batch=batch,
            deadline=deadline,
            first_call_deadline=first_call_deadline,
            t0=t0,
        )

    def _probe(self) -> None:
        key = (self.bwrap, self.python, self.as_root, tuple(self.extra_binds))
        if key not in _PROBE_CACHE:
            try:
                res = self.call("def f():\n    return 1\n", "f", limits=Limits(wall_s=15, cpu_s=10))
                _PROBE_CACHE[key] = None if res.ok and res.value == 1 else f"{res.verdict}: {res.error} {res.stderr}"
            except OSError as exc:
                _PROBE_CACHE[key] = f"{type(exc).__name__}: {exc}"
        problem = _PROBE_CACHE[key]
        if problem:
            raise SandboxUnavailable(
                f"process: bubblewrap ({self.bwrap}) could not start a sandbox here: {problem.strip()[:800]}. "
                "It needs unprivileged user namespaces (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu "
                "24.04+ kernel.apparmor_restrict_unprivileged_userns=0 or an AppArmor profile for bwrap), or a "
                f"distribution bwrap ({INSTALL_HINT}); the 'docker' backend may work where an engine runs"
            )


@functools.lru_cache(maxsize=8)
def _compiled_bootstrap(python: str) -> bytes | None:
    """The bootstrap compiled and marshalled by the sandbox's own interpreter (bytecode is specific
    to its version), or None to send source. Our own source, compiled outside the sandbox; the host
    only forwards these bytes, it never loads them."""
    prog = "import marshal, sys; sys.stdout.buffer.write(marshal.dumps(compile(sys.stdin.read(), '<string>', 'exec')))"
    try:
        out = subprocess.run(
            [python, "-I", "-S", "-c", prog],
            input=BOOTSTRAP_SOURCE.encode(),
            capture_output=True,
            timeout=30,
            check=False,
            env={"PATH": "/usr/bin:/bin"},
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 and 0 < len(out.stdout) < 60_000 else None


@functools.lru_cache(maxsize=8)
def _bwrap_features(bwrap: str) -> frozenset[str]:
    """The long options this bwrap knows, from its --help."""
    try:
        out = subprocess.run([bwrap, "--help"], check=False, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as exc:
        raise SandboxUnavailable(f"process: cannot run {bwrap}: {exc}; {INSTALL_HINT}") from None
    return frozenset(
        word for line in (out.stdout + out.stderr).splitlines() for word in line.split()[:1] if word.startswith("--")
    )


def _covered(path: str) -> bool:
    """Is this directory already provided inside the sandbox (by /usr or the tmpfs at /tmp)?"""
    return path in ("/", "/tmp", "/usr") or path.startswith("/usr/")


def _scaled_cpu(limits: Limits, n: int) -> Limits:
    return replace(limits, cpu_s=int(limits.cpu_s * n) + 1)
