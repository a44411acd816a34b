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

The commands can plant symbolic links anywhere in the workspace's folders, and the host may be
root. So the host never touches those folders by path: copying in (:meth:`Workspace.put`,
:meth:`Workspace.mount`), making folders, reading a file back and deleting one all go through
:mod:`.beneath`, which walks from the mount's own folder without following any link (a link on
the way is refused, never followed) and gives what it makes to the workspace's uid through the
new file's own descriptor. Mounts may not nest, so bwrap never makes a mount point inside a
folder the commands control. :meth:`Workspace.close` deletes with the fd-based
:func:`shutil.rmtree`, which follows no link.

    ws = Workspace({"/app": None, "/logs": None}, workdir="/app")   # None: a fresh empty folder
    ws.put("/app", Path("environment/files"))                       # copy files in
    r = ws.exec("ls; echo hi > out.txt", timeout=10)
    r.exit_code, r.stdout                                            # (0, "...\\n")
    ws.read("/app/out.txt")                                          # b"hi\\n" (None if absent)
    ws.close()
"""

from __future__ import annotations

import os
import posixpath
import secrets
import shutil
import tempfile
import time
from collections.abc import Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from . import beneath
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

    def __init__(
        self,
        mounts: Mapping[str, str | Path | None],
        *,
        workdir: str = "/app",
        env: Mapping[str, str] | None = None,
        memory_mb: int = 1024,
        max_procs: int = 64,
        file_size_mb: int = 64,
        tmp_mb: int = 256,
        bwrap: str | None = None,
    ) -> None:
        for inside in mounts:
            _check_inside(inside)
        _check_nesting(list(mounts))
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
    # Commands can plant links anywhere in the mounted folders, and the host runs as root: every
    # host-side operation on them goes through .beneath (walked from the mount's own folder, no link
    # followed, what is made owned by the workspace's uid through its own descriptor).

    def _own(self, inside: str) -> Path:
        path = self.root / inside.strip("/").replace("/", "__")
        path.mkdir()  # fresh, in the host's own folder: nothing the sandbox could have planted
        if self.uid is not None:
            os.lchown(path, self.uid, self.uid)
        return path

    def _where(self, inside: str) -> tuple[str, Path, str]:
        """(the mount, its host folder, the rest of the path below it) for ``inside``."""
        _check_path(inside)
        best = max(
            (m for m in self._mounts if inside == m or inside.startswith(m.rstrip("/") + "/")), key=len, default=None
        )
        if best is None:
            raise NotMounted(f"{inside!r} is not under a mounted folder ({sorted(self._mounts)})")
        return best, self._mounts[best][0], inside[len(best) :].strip("/")

    @contextmanager
    def _named(self, mount: str):
        """Refused errors name the path as the commands see it."""
        try:
            yield
        except beneath.Refused as e:
            raise beneath.Refused(
                e.errno or 0, posixpath.join(mount, e.rel), e.why
            ) from None  # Refused always sets errno

    def mount(
        self, inside: str, source: str | Path | None = None, *, writable: bool = True, within: str | Path | None = None
    ) -> None:
        """Add a folder at ``inside`` (for the commands run from now on): a copy of ``source``
        (or an empty folder) of the workspace's own. Mounted already: its contents are replaced by
        a fresh copy. ``within`` as for :meth:`put`."""
        _check_inside(inside)
        if inside in self._mounts:
            if self._mounts[inside][0].parent != self.root:
                raise ValueError(f"{inside!r} is mounted from a host folder of the caller's; it is not replaced")
            beneath.remove(self._mounts[inside][0], "")
        else:
            _check_nesting([*self._mounts, inside])
            self._mounts[inside] = (self._own(inside), writable)
            self._box = None
        if source is not None:
            self.put(inside, source, within=within)

    def put(self, inside: str, source: str | Path, *, within: str | Path | None = None) -> None:
        """Copy a host file or folder to ``inside`` (under a mount) as Docker's COPY does (a
        folder's contents merge into ``inside``; a file replaces it, or goes into it when it is a
        folder); links are copied as links. ``within``: a host folder holding ``source`` whose
        contents are not trusted (a task's files): no link below it on the way to ``source`` is
        followed. Nothing in the workspace is written through a link (:class:`~.beneath.Refused`)."""
        mount, root, rel = self._where(inside)
        source = Path(source)
        if within is None:
            within, src_rel = source.parent, source.name
        else:
            src_rel = source.relative_to(within).as_posix()
        with self._named(mount):
            beneath.copy(within, "" if src_rel == "." else src_rel, root, rel, uid=self.uid)

    def makedirs(self, inside: str) -> None:
        """Make the folder ``inside`` and its missing parents, owned by the workspace's uid."""
        mount, root, rel = self._where(inside)
        with self._named(mount):
            beneath.makedirs(root, rel, uid=self.uid)

    def read(self, inside: str, *, limit: int = 1 << 20) -> bytes | None:
        """The bytes of the regular file ``inside``, None when it does not exist; a link on the
        way or at the end, something that is not a regular file or a file over ``limit`` bytes is
        :class:`~.beneath.Refused`."""
        mount, root, rel = self._where(inside)
        with self._named(mount):
            return beneath.read(root, rel, limit=limit)

    def remove(self, inside: str) -> None:
        """Delete ``inside`` (a file, a link itself, or a folder and everything in it)."""
        mount, root, rel = self._where(inside)
        if not rel:
            raise ValueError(f"{inside!r} is a mount; remove what is inside it")
        with self._named(mount):
            beneath.remove(root, rel)

    def copy_out(self, inside: str, dest: str | Path) -> None:
        """Copy the folder ``inside`` into the host folder ``dest`` (links as links, owned by the
        host): a built environment kept to start later workspaces from."""
        mount, root, rel = self._where(inside)
        with self._named(mount):
            with beneath.opened(root, rel):  # a folder, reached without a link, or Refused
                pass
            beneath.copy(root, rel, dest, "")

    # -- commands ---------------------------------------------------------------------------------

    def _sandbox(self) -> _WorkspaceBox:
        if self._box is None:
            binds = [(str(host), inside, writable) for inside, (host, writable) in sorted(self._mounts.items())]
            self._box = _WorkspaceBox(binds, self.uid, bwrap=self._bwrap)
        return self._box

    def exec(
        self, command: str, *, timeout: float, cwd: str | None = None, env: Mapping[str, str] | None = None
    ) -> ShellResult:
        """Run ``bash -c command`` in the workspace; its whole process tree is killed after
        ``timeout`` seconds (then ``exit_code`` is None and ``timed_out`` True)."""
        if self.closed:
            raise RuntimeError("the workspace is closed")
        if not isinstance(command, str):
            raise TypeError(f"a command is a string, got {type(command).__name__}")
        full_env = {
            "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/tmp",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
            **self.env,
            **(env or {}),
        }
        timeout = max(0.1, float(timeout))
        limits = Limits(
            wall_s=timeout + 5.0, cpu_s=int(timeout) + 10, output_bytes=4 * OUTPUT_CAP + 10_000, **self._limits
        )
        t0 = time.monotonic()
        res = self._sandbox().run(
            _RUNNER,
            inputs={"cmd": command, "cwd": cwd or self.workdir, "env": full_env, "timeout": timeout, "cap": OUTPUT_CAP},
            limits=limits,
        )
        took = time.monotonic() - t0
        v = res.value if res.ok and isinstance(res.value, dict) else None
        if v is None:
            if res.verdict == "timeout":  # the command ignored its own kill: the host killed the tree
                return ShellResult(None, "", "", True, took, error=None)
            err = (res.error or "").strip() or res.stderr.strip()
            if "No such file or directory" in err and "cwd" not in err and cwd:
                err = f"the working directory {cwd} does not exist: {err}"
            return ShellResult(None, "", res.stderr, False, took, error=f"{res.verdict}: {err[:2000]}")
        return ShellResult(
            v["code"], v["out"], v["err"], bool(v["timed_out"]), float(v.get("seconds", took)), bool(v["cut"])
        )

    def close(self) -> None:
        """Delete the workspace's own folders (the mounts given as host folders stay)."""
        self.closed = True
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class NotMounted(ValueError):
    """A path inside that is under none of the workspace's mounts."""


def _check_path(inside: str) -> None:
    if not isinstance(inside, str) or not inside.startswith("/") or ".." in inside.split("/"):
        raise ValueError(f"a path inside the sandbox must be absolute with no '..': {inside!r}")


def _check_nesting(insides: list[str]) -> None:
    # bwrap would make a nested mount point inside the outer mount's host folder, following links
    # the commands planted there: mounts sit side by side
    norm = sorted("/" + i.strip("/") for i in insides)
    for a, b in zip(norm, norm[1:]):
        if b.startswith(a.rstrip("/") + "/"):
            raise ValueError(f"mount {b!r} is inside mount {a!r}; a workspace's mounts may not nest")


def _check_inside(inside: str) -> None:
    _check_path(inside)
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


__all__ = ["OUTPUT_CAP", "NotMounted", "ShellResult", "Workspace", "available"]
