"""The sandbox backend of a Harbor task's environment: no container engine needed. A bubblewrap
workspace (:mod:`evolve.sandbox.shell`) holds the files the task's Dockerfile copies, with its
``RUN`` lines carried out over them (:mod:`.dockerfile`), the host's /usr standing in for the image;
no network. Built once per task content and process, then copied for each episode.

The workspace's folders are written by the task's RUN lines, the agent, solve.sh and test.sh, and
the task folder by whoever published it: the host (often root) touches neither by path. Task files
are read and copied through :mod:`evolve.sandbox.beneath` (walked from the task folder, no link
followed), the workspace through the Workspace's own methods (the same, from each mount's folder).
What cannot be carried out that way is refused as ``unsupported``, naming the docker backend: so
are a task naming users (``[agent]``/``[verifier] user``: the sandbox has one), a separate verifier
environment, and a phase whose task.toml asks for the network (the sandbox has none; a phase left at
Harbor's default ``public`` runs without, and its verdict says so).

The agent's commands keep their working directory and exported variables from one command to the
next (each command starts where the last one left, with its exports), but each runs in its own
sandbox: a file in /tmp and a background process do not outlive their command (the docker backend
keeps one real shell for the episode, :mod:`.docker_shell`)."""

from __future__ import annotations

import errno
import posixpath
import shlex
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from evolve.worlds.harbor.environment.base import PhasedEnvironment
from evolve.worlds.harbor.environment.dockerfile import DockerfileError, parse, top_dirs
from evolve.worlds.harbor.environment.outcome import (
    TEXT_LIMIT,
    EnvironmentError_,
    tail,
    unsupported,
)

_TEMPLATES: dict[str, Path] = {}  # task digest -> the built environment's folders
_TEMPLATE_LOCK = threading.Lock()
_TEMPLATE_ROOT: list[tempfile.TemporaryDirectory] = []  # one folder per process, removed when it exits
READ_ONLY_TOPS = ("/usr", "/etc", "/tmp", "/proc", "/dev", "/bin", "/lib", "/lib64", "/sbin")


def _template_root() -> Path:
    """The process's folder of built environments (a TemporaryDirectory: removed at exit, so a run
    or a test session leaves nothing behind in /tmp)."""
    with _TEMPLATE_LOCK:
        if not _TEMPLATE_ROOT:
            _TEMPLATE_ROOT.append(tempfile.TemporaryDirectory(prefix="evolve-harbor-"))
        return Path(_TEMPLATE_ROOT[0].name)


def _plan_of(task: dict):
    from evolve.sandbox.beneath import Refused, read

    try:
        text = read(task["path"], "environment/Dockerfile", limit=TEXT_LIMIT)
    except Refused as e:
        raise unsupported(task, f"{e} (the sandbox backend reads a task's files without following links)") from None
    if text is None:
        raise EnvironmentError_(task, "environment/Dockerfile is missing; the sandbox backend builds from it")
    from evolve.worlds.harbor.environment.build import BuildfileError, rewrite

    try:  # heredocs made plain RUN lines first, as for an engine without BuildKit
        return parse(rewrite(text.decode("utf-8", "replace")))
    except (DockerfileError, BuildfileError) as e:
        raise unsupported(task, f"environment/Dockerfile: {e}") from None


def _copy_sources(task: dict, ws: Any, step: Any) -> None:
    from evolve.sandbox.beneath import Refused, glob, kind
    from evolve.sandbox.shell import NotMounted

    root, where = Path(task["path"]), f"environment/Dockerfile line {step.line}"
    for src in step.sources:
        rel = posixpath.normpath("environment/" + src.lstrip("/"))
        if rel != "environment" and not rel.startswith("environment/"):
            raise EnvironmentError_(task, f"{where}: {src!r} is outside the build context environment/")
        try:
            matches = glob(root, rel) if any(c in src for c in "*?[") else [rel]
            kinds = [kind(root, m) for m in matches]
        except Refused as e:
            raise unsupported(
                task, f"{where}: COPY {src!r}: {e} (the sandbox backend copies a task's files without following links)"
            ) from None
        if not matches or None in kinds:
            raise EnvironmentError_(task, f"{where}: COPY source {src!r} is not in environment/")
        for m, k in zip(matches, kinds):
            if k not in ("file", "dir"):
                what = "a symbolic link" if k == "link" else "not a file or folder"
                raise unsupported(
                    task,
                    f"{where}: COPY source {m} is {what} (the sandbox backend copies a task's "
                    "files without following links)",
                )
            dest = step.dest
            if k == "file" and dest.endswith("/"):
                dest = dest + posixpath.basename(m)
            try:
                ws.put(dest.rstrip("/") or "/", root / m, within=root)
            except NotMounted:
                raise unsupported(
                    task,
                    f"{where}: COPY into {dest}, which the sandbox backend does not mount "
                    "(it mounts only the folders WORKDIR and COPY name below /)",
                ) from None
            except Refused as e:
                why = " (the sandbox backend never writes through a link)" if e.errno == errno.ELOOP else ""
                raise unsupported(task, f"{where}: COPY to {dest}: {e}{why}") from None


SHELL_STATE = "/logs/agent/.evolvekit-shell"  # where a command leaves its cwd and exports for the next


def _refuse(task: dict) -> list[str]:
    """What the sandbox cannot carry out (``unsupported``, naming the docker backend); the phases it
    runs without the network Harbor's default would give them."""
    users = [f"[{k.split('_')[0]}] user = {task[k]!r}" for k in ("agent_user", "verifier_user") if task.get(k)]
    users += [
        f"step {s['name']!r} {k.split('_')[0]} user"
        for s in task.get("steps") or []
        for k in ("agent_user", "verifier_user")
        if s.get(k)
    ]
    if users:
        raise unsupported(task, f"task.toml sets {users[0]}: the sandbox backend runs every command as its one user")
    if task.get("verifier_mode") == "separate":
        raise unsupported(
            task,
            "a separate verifier environment ([verifier] environment_mode = 'separate'), which "
            "the sandbox backend does not make",
        )
    net = task.get("network") or {}
    wanted = [p for p in ("agent", "verifier") if net.get(p) == "public"]
    declared = [p for p in wanted if p in net.get("declared", [])]
    if declared:
        raise unsupported(
            task,
            f"its {declared[0]} needs the network (network_mode = 'public' in task.toml), and "
            "the sandbox backend has none",
        )
    return wanted


class SandboxEnvironment(PhasedEnvironment):
    """The task's environment as a bubblewrap workspace (see the module docstring)."""

    backend = "sandbox"
    offline = "none: the task leaves network_mode at Harbor's default (public), and the sandbox backend has no network"

    def __init__(self, task: dict) -> None:
        from evolve.sandbox.shell import Workspace
        from evolve.worlds.harbor.environment.hostenv import resolve

        self.task = task
        self.denied = _refuse(task)
        plan = _plan_of(task)
        self.workdir = task.get("workdir") or plan.workdir
        tops = sorted(set(top_dirs(plan)) | {"/" + self.workdir.strip("/").split("/")[0], "/logs"})
        bad = [t for t in tops if t in READ_ONLY_TOPS or t == "/"]
        if bad:
            raise unsupported(
                task,
                f"environment/Dockerfile writes into {bad[0]}, which the sandbox backend keeps "
                "read-only (it is the host's)",
            )
        self.env = {**plan.env, **resolve(task, task.get("environment_env"))}
        mem = int(task.get("memory_mb") or 1024)
        self.ws = Workspace(dict.fromkeys(tops), workdir=self.workdir, env=self.env, memory_mb=max(256, mem))
        try:
            self._build(plan, tops)
            self.reset([])
        except BaseException:
            self.ws.close()
            raise

    def _build(self, plan: Any, tops: list[str]) -> None:
        key = self.task["digest"]
        with _TEMPLATE_LOCK:
            template = _TEMPLATES.get(key)
        if template is not None:
            for top in tops:
                if (template / top.strip("/")).is_dir():
                    self.ws.put(top, template / top.strip("/"))
            return
        t0 = time.monotonic()
        for d in plan.dirs:
            self._makedirs(d, "WORKDIR")
        for step in plan.steps:
            left = self.task["build_timeout"] - (time.monotonic() - t0)
            if left <= 0:
                raise EnvironmentError_(
                    self.task,
                    f"building the environment took over its build_timeout_sec ({self.task['build_timeout']:g} s)",
                )
            if step.kind == "copy":
                _copy_sources(self.task, self.ws, step)
                continue
            if step.workdir != "/":  # a RUN before the first WORKDIR runs in /, as Docker's does
                self._makedirs(step.workdir, f"line {step.line}")
            r = self.ws.exec(step.command, timeout=left, cwd=step.workdir, env=step.env)
            if r.error or r.timed_out or r.exit_code != 0:
                why = r.error or ("timed out" if r.timed_out else f"exited {r.exit_code}")
                raise unsupported(
                    self.task,
                    f"environment/Dockerfile line {step.line}: RUN {step.command[:200]!r} "
                    f"{why} in the sandbox: {tail(r.stderr or r.stdout, 600)!r}. The sandbox backend "
                    "runs RUN with the host's /usr, no network and a read-only root outside the "
                    "folders it mounts",
                )
        template = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=_template_root()))
        for top in tops:
            (template / top.strip("/")).mkdir()
            self.ws.copy_out(top, template / top.strip("/"))
        with _TEMPLATE_LOCK:
            _TEMPLATES.setdefault(key, template)

    def _makedirs(self, inside: str, why: str) -> None:
        from evolve.sandbox.beneath import Refused
        from evolve.sandbox.shell import NotMounted

        if inside == "/":
            return
        try:
            self.ws.makedirs(inside)
        except NotMounted:
            raise unsupported(
                self.task, f"environment/Dockerfile {why}: {inside} is not in a folder the sandbox backend mounts"
            ) from None
        except Refused as e:
            raise unsupported(
                self.task, f"environment/Dockerfile {why}: {e} (the sandbox backend never makes folders through a link)"
            ) from None

    # -- commands ---------------------------------------------------------------------------------

    def sh(
        self,
        command: str,
        *,
        timeout: float | None,
        env: dict | None = None,
        cwd: str | None = None,
        user: str | None = None,
    ) -> Any:
        if user:
            raise unsupported(self.task, f"a command as user {user!r}: the sandbox backend has one user")
        r = self.ws.exec(command, timeout=timeout if timeout is not None else 24 * 3600.0, env=env, cwd=cwd)
        if r.error:
            raise EnvironmentError_(self.task, f"the sandbox failed to run a command: {r.error}")
        return r

    def exec(self, command: str, *, timeout: float | None, env: dict | None = None, cwd: str | None = None) -> Any:
        return self.sh(command, timeout=timeout, env=env, cwd=cwd)

    def run(self, command: str, *, timeout: float | None, user: str | None = None) -> Any:
        """``command`` where the last one left: its working directory and exported variables (see
        the module docstring)."""
        state = SHELL_STATE
        wrapped = (
            f'__s={state}; [ -f "$__s/env" ] && . "$__s/env" 2>/dev/null; '
            f'[ -f "$__s/cwd" ] && {{ cd "$(<"$__s/cwd")" 2>/dev/null || true; }}\n'
            'trap \'__rc=$?; mkdir -p "$__s" && pwd > "$__s/cwd" && export -p > "$__s/env"; exit $__rc\' EXIT\n'
            f"eval {shlex.quote(command)} </dev/null\n"
        )
        return self.sh(wrapped, timeout=timeout, user=user)

    # -- files --------------------------------------------------------------------------------------

    def reset(self, paths: list[str]) -> None:
        """Remove ``paths`` (a mounted folder is emptied) and make /logs' folders again (the agent
        may have made them links or files: then they are made afresh)."""
        from evolve.sandbox.beneath import Refused
        from evolve.sandbox.shell import NotMounted

        try:
            for p in paths:
                if p in self.ws._mounts:  # noqa: SLF001 - /tests, /solution: a fresh empty folder
                    self.ws.mount(p)
                    continue
                while True:  # a link on the way (the agent's): the link itself goes, nothing through it
                    try:
                        self.ws.remove(p)
                        break
                    except NotMounted:
                        break
                    except Refused:
                        parent = posixpath.dirname(p)
                        if parent in self.ws._mounts or parent == "/":  # noqa: SLF001
                            raise
                        p = parent
            for d in ("/logs/verifier", "/logs/agent"):
                try:
                    self.ws.makedirs(d)
                except (Refused, OSError):
                    self.ws.remove(d)
                    self.ws.makedirs(d)
        except OSError as e:
            raise EnvironmentError_(
                self.task, f"clearing {paths} failed on the host: {type(e).__name__}: {e}"
            ) from None

    def upload(self, folder: str, inside: str, *, replace: bool = True, kind: str = "RuntimeError") -> None:
        from evolve.sandbox.beneath import Refused
        from evolve.sandbox.shell import NotMounted

        root = Path(self.task["path"])
        try:
            if replace or inside not in self.ws._mounts and inside.count("/") == 1:  # noqa: SLF001
                self.ws.mount(inside, root / folder, writable=True, within=root)
            else:
                self.ws.put(inside, root / folder, within=root)
        except (Refused, NotMounted) as e:
            raise EnvironmentError_(
                self.task, f"{folder}/: {e}; a task's files are copied without following links", kind=kind
            ) from None
        except OSError as e:
            raise EnvironmentError_(
                self.task, f"copying {folder}/ failed: {type(e).__name__}: {e}", kind=kind
            ) from None

    def executable(self, inside: str) -> None:
        self.sh(f"chmod +x {shlex.quote(inside)}", timeout=30)

    def fetch(self, inside: str, *, limit: int | None = None, tail_bytes: int | None = None) -> bytes | None:
        """A regular file of the workspace, read without following links (its last ``tail_bytes``
        through a command in the sandbox); None when absent."""
        from evolve.sandbox.beneath import Refused
        from evolve.sandbox.shell import NotMounted

        if tail_bytes is not None:
            r = self.ws.exec(f"tail -c {int(tail_bytes)} {shlex.quote(inside)}", timeout=30)
            return r.stdout.encode() if r.exit_code == 0 else None
        try:
            return self.ws.read(inside, limit=limit or TEXT_LIMIT)
        except NotMounted:
            return None
        except Refused as e:
            raise EnvironmentError_(
                self.task,
                f"{inside}: {e}; the host reads it without following links, so "
                "tests/test.sh must write it as a regular file",
                kind="DownloadVerifierDirError",
            ) from None

    def close(self) -> None:
        self.ws.close()


__all__ = ["READ_ONLY_TOPS", "SandboxEnvironment"]
