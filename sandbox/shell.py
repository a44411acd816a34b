"""Shell commands in a task's environment: a :class:`Workspace` is a set of host folders that appear
writable at fixed paths (``/app``, ``/logs``, ...) inside a bubblewrap sandbox, and each
:meth:`Workspace.exec` runs one ``bash -c`` command there.

It is the ``process`` backend (:mod:`.process`) with two additions: the workspace's folders are
bound read-write (the rest of the root stays read-only: /usr and the interpreter, a private /tmp),
and every command of one workspace runs as the same uid (run by root, a fresh uid per workspace,
owner of its folders), so what one command writes the next can change. Everything else is the
process backend's: no network, no host environment, hard rlimits, the seccomp denylist, and the
whole process tree killed at the wall-clock limit. Each command gets a fresh sandbox over the same
files: a background process does not outlive the command that started it.

    ws = Workspace({"/app": None, "/logs": None}, workdir="/app")   # None: a fresh empty folder
    ws.put("/app", Path("environment/files"))                       # copy files in
    r = ws.exec("ls; echo hi > out.txt", timeout=10)
    r.exit_code, r.stdout                                            # (0, "...\\n")
    ws.host("/app") / "out.txt"                                      # the file, on the host
    ws.close()
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ._types import Limits, SandboxUnavailable
from .process import SANDBOX_UIDS, ProcessSandbox

_RESERVED = ("/", "/usr", "/proc", "/dev", "/etc", "/tmp", "/bin", "/lib", "/lib64", "/sbin")
OUTPUT_CAP = 64_000  # characters kept of each stream (the tail)

# Runs inside the sandbox (under the bootstrap's rlimits and uid): the command in its own session,
# its output into files on the capped /tmp (never into this interpreter's memory), the whole
# session killed at the timeout, the tails returned.
_RUNNER = r"""
import os, signal, subprocess, time
I = INPUTS
t0 = time.monotonic()
with open("/tmp/.evolve-out", "wb") as out, open("/tmp/.evolve-err", "wb") as err:
    p = subprocess.Popen(["/bin/bash", "-c", I["cmd"]], cwd=I["cwd"], env=I["env"], stdin=subprocess.DEVNULL,
                         stdout=out, stderr=err, start_new_session=True)
    try:
        code = p.wait(timeout=I["timeout"])
        timed_out = False
    except subprocess.TimeoutExpired:
        timed_out = True
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except OSError:
        pass
    if timed_out:
        p.wait()
        code = None
def tail(path, cap):
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        if size > cap:
            f.seek(size - cap)
        return f.read().decode("utf-8", "replace"), size > cap
o, co = tail("/tmp/.evolve-out", I["cap"])
e, ce = tail("/tmp/.evolve-err", I["cap"])
RESULT = {"code": code, "out": o, "err": e, "timed_out": timed_out, "cut": co or ce,
          "seconds": time.monotonic() - t0}
"""


@dataclass(frozen=True)
class ShellResult:
    """One command: ``exit_code`` (None when it was killed at its timeout), the tails of its
    output, and ``error`` when the sandbox itself failed (then nothing is known of the command)."""

    exit_code: int | None
    stdout: str
    stderr: str
    timed_out: bool
    duration_s: float
    truncated: bool = False
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.exit_code == 0


class _WorkspaceBox(ProcessSandbox):
    """The process backend with a fixed uid and the workspace's binds."""

    def __init__(self, binds: list[tuple[str, str, bool]], uid: int | None, **options) -> None:
        self._ws_binds, self._ws_uid = binds, uid
        super().__init__(**options)

    def _sandbox_uid(self) -> int:
        return self._ws_uid if self._ws_uid is not None else super()._sandbox_uid()

    def _more_mounts(self, parents) -> list[str]:
        # Debian's /usr/bin/awk, which, vi, ... are links through /etc/alternatives: without it the image's
        # standard tools would be missing
        out: list[str] = ["--ro-bind-try", "/etc/alternatives", "/etc/alternatives"]
        for host, inside, writable in self._ws_binds:
            out += parents(inside) + ["--bind" if writable else "--ro-bind", host, inside]
        return out


class Workspace:
    """Folders bound at fixed paths inside a sandbox, and commands run over them (see the module
    docstring). ``mounts`` maps a path inside to a host folder (None: a fresh folder of the
    workspace's own, deleted by :meth:`close`); ``workdir`` is where commands start; ``env`` is
    added to every command's environment (PATH, HOME=/tmp and LANG are set)."""

    def __init__(self, mounts: Mapping[str, str | Path | None], *, workdir: str = "/app",
                 env: Mapping[str, str] | None = None, memory_mb: int = 1024, max_procs: int = 64,
                 file_size_mb: int = 64, tmp_mb: int = 256, bwrap: str | None = None) -> None:
        for inside in mounts:
            _check_inside(inside)
        self.root = Path(tempfile.mkdtemp(prefix="evolve-ws-"))
        os.chmod(self.root, 0o755)
        self.workdir, self.env = workdir, dict(env or {})
        self._limits = dict(memory_mb=memory_mb, max_procs=max_procs, file_size_mb=file_size_mb, tmp_mb=tmp_mb)
        self.as_root = os.geteuid() == 0
        self.uid = SANDBOX_UIDS[secrets.randbelow(len(SANDBOX_UIDS))] if self.as_root else None
        self._mounts: dict[str, tuple[Path, bool]] = {}
        for inside, host in mounts.items():
            self._mounts[inside] = (self._own(inside) if host is None else Path(host).resolve(), True)
        if workdir not in self._mounts and not any(workdir.startswith(m.rstrip("/") + "/") for m in self._mounts):
            raise ValueError(f"workdir {workdir!r} is not inside a mounted folder ({sorted(self._mounts)})")
        self._box: _WorkspaceBox | None = None
        self._bwrap = bwrap
        self.closed = False

    # -- files ------------------------------------------------------------------------------------

    def _own(self, inside: str) -> Path:
        path = self.root / inside.strip("/").replace("/", "__")
        path.mkdir(parents=True, exist_ok=True)
        self._give(path)
        return path

    def _give(self, path: Path) -> None:
        """Make ``path`` (recursively) the sandbox uid's, so commands can change it."""
        if self.uid is None:
            return
        for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
            try:
                os.lchown(p, self.uid, self.uid)
            except FileNotFoundError:
                pass

    def host(self, inside: str) -> Path:
        """The host path of ``inside`` (a path under one of the mounts)."""
        best = max((m for m in self._mounts if inside == m or inside.startswith(m.rstrip("/") + "/")),
                   key=len, default=None)
        if best is None:
            raise ValueError(f"{inside!r} is not under a mounted folder ({sorted(self._mounts)})")
        rest = inside[len(best):].lstrip("/")
        return self._mounts[best][0] / rest if rest else self._mounts[best][0]

    def mount(self, inside: str, source: str | Path | None = None, *, writable: bool = True) -> Path:
        """Add a folder at ``inside`` (for the commands run from now on): a copy of ``source``
        (or an empty folder) of the workspace's own. Returns its host path."""
        _check_inside(inside)
        if inside in self._mounts:
            raise ValueError(f"{inside!r} is mounted already")
        path = self._own(inside)
        if source is not None:
            shutil.copytree(source, path, dirs_exist_ok=True, symlinks=True)
            self._give(path)
        self._mounts[inside] = (path, writable)
        self._box = None
        return path

    def put(self, inside: str, source: str | Path) -> None:
        """Copy a host file or folder to ``inside`` (a path under a mount), like Docker's COPY."""
        dest, source = self.host(inside), Path(source)
        if source.is_dir():
            shutil.copytree(source, dest, dirs_exist_ok=True, symlinks=True)
        else:
            if dest.is_dir():
                dest = dest / source.name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest)
        self._give(dest)
        for parent in dest.parents:  # folders COPY made on the way
            if parent == self.root or self.root not in parent.parents:
                break
            self._give_one(parent)

    def _give_one(self, path: Path) -> None:
        if self.uid is not None:
            os.lchown(path, self.uid, self.uid)

    # -- commands ---------------------------------------------------------------------------------

    def _sandbox(self) -> _WorkspaceBox:
        if self._box is None:
            binds = [(str(host), inside, writable) for inside, (host, writable) in sorted(self._mounts.items())]
            self._box = _WorkspaceBox(binds, self.uid, bwrap=self._bwrap)
        return self._box

    def exec(self, command: str, *, timeout: float, cwd: str | None = None,
             env: Mapping[str, str] | None = None) -> ShellResult:
        """Run ``bash -c command`` in the workspace; its whole process tree is killed after
        ``timeout`` seconds (then ``exit_code`` is None and ``timed_out`` True)."""
        if self.closed:
            raise RuntimeError("the workspace is closed")
        if not isinstance(command, str):
            raise TypeError(f"a command is a string, got {type(command).__name__}")
        full_env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME": "/tmp",
                    "LANG": "C.UTF-8", "TERM": "dumb", **self.env, **(env or {})}
        timeout = max(0.1, float(timeout))
        limits = Limits(wall_s=timeout + 5.0, cpu_s=int(timeout) + 10, output_bytes=4 * OUTPUT_CAP + 10_000,
                        **self._limits)
        t0 = time.monotonic()
        res = self._sandbox().run(_RUNNER, inputs={"cmd": command, "cwd": cwd or self.workdir, "env": full_env,
                                                   "timeout": timeout, "cap": OUTPUT_CAP}, limits=limits)
        took = time.monotonic() - t0
        v = res.value if res.ok and isinstance(res.value, dict) else None
        if v is None:
            if res.verdict == "timeout":  # the command ignored its own kill: the host killed the tree
                return ShellResult(None, "", "", True, took, error=None)
            err = (res.error or "").strip() or res.stderr.strip()
            if "No such file or directory" in err and "cwd" not in err and cwd:
                err = f"the working directory {cwd} does not exist: {err}"
            return ShellResult(None, "", res.stderr, False, took, error=f"{res.verdict}: {err[:2000]}")
        return ShellResult(v["code"], v["out"], v["err"], bool(v["timed_out"]), float(v.get("seconds", took)),
                           bool(v["cut"]))

    def close(self) -> None:
        """Delete the workspace's own folders (the mounts given as host folders stay)."""
        self.closed = True
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> "Workspace":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _check_inside(inside: str) -> None:
    if not isinstance(inside, str) or not inside.startswith("/") or ".." in inside.split("/"):
        raise ValueError(f"a path inside the sandbox must be absolute with no '..': {inside!r}")
    norm = "/" + inside.strip("/")
    if norm in _RESERVED or norm.startswith(("/usr/", "/proc/", "/dev/", "/tmp/")):
        raise ValueError(f"{inside!r} would cover the sandbox's own {norm}; use another path (e.g. /app)")


def available() -> str | None:
    """None when shell workspaces work here, else why not."""
    try:
        ProcessSandbox()
    except SandboxUnavailable as e:
        return str(e)
    return None


__all__ = ["OUTPUT_CAP", "ShellResult", "Workspace", "available"]
