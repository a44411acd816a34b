"""The sandbox backend of a Harbor task's environment: no container engine needed. A bubblewrap
workspace (:mod:`evolve.sandbox.shell`) holds the files the task's Dockerfile copies, with its
``RUN`` lines carried out over them (:mod:`.dockerfile`), the host's /usr standing in for the image;
no network. Built once per task content and process, then copied for each episode.

The workspace's folders are written by the task's RUN lines, the agent, solve.sh and test.sh, and
the task folder by whoever published it: the host (often root) touches neither by path. Task files
are read and copied through :mod:`evolve.sandbox.beneath` (walked from the task folder, no link
followed), the workspace through the Workspace's own methods (the same, from each mount's folder).
What cannot be carried out that way is refused as ``unsupported``, naming the docker backend."""

from __future__ import annotations

import errno
import posixpath
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from evolve.worlds.harbor.dockerfile import DockerfileError, parse, top_dirs
from evolve.worlds.harbor.outcome import TEXT_LIMIT, EnvironmentError_, tail, unsupported, verdict

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
    try:
        return parse(text.decode("utf-8", "replace"))
    except DockerfileError as e:
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
            raise unsupported(task, f"{where}: COPY {src!r}: {e} (the sandbox backend copies a task's files "
                              "without following links)") from None
        if not matches or None in kinds:
            raise EnvironmentError_(task, f"{where}: COPY source {src!r} is not in environment/")
        for m, k in zip(matches, kinds):
            if k not in ("file", "dir"):
                what = "a symbolic link" if k == "link" else "not a file or folder"
                raise unsupported(task, f"{where}: COPY source {m} is {what} (the sandbox backend copies a task's "
                                  "files without following links)")
            dest = step.dest
            if k == "file" and dest.endswith("/"):
                dest = dest + posixpath.basename(m)
            try:
                ws.put(dest.rstrip("/") or "/", root / m, within=root)
            except NotMounted:
                raise unsupported(task, f"{where}: COPY into {dest}, which the sandbox backend does not mount "
                                  "(it mounts only the folders WORKDIR and COPY name below /)") from None
            except Refused as e:
                why = " (the sandbox backend never writes through a link)" if e.errno == errno.ELOOP else ""
                raise unsupported(task, f"{where}: COPY to {dest}: {e}{why}") from None


class SandboxEnvironment:
    """The task's environment as a bubblewrap workspace (see the module docstring)."""

    backend = "sandbox"

    def __init__(self, task: dict) -> None:
        from evolve.sandbox.shell import Workspace

        self.task = task
        plan = _plan_of(task)
        self.workdir = task.get("workdir") or plan.workdir
        tops = sorted(set(top_dirs(plan)) | {"/" + self.workdir.strip("/").split("/")[0], "/logs"})
        bad = [t for t in tops if t in READ_ONLY_TOPS or t == "/"]
        if bad:
            raise unsupported(task, f"environment/Dockerfile writes into {bad[0]}, which the sandbox backend keeps "
                              "read-only (it is the host's)")
        self.env = {**plan.env, **task.get("environment_env", {})}
        mem = int(task.get("memory_mb") or 1024)
        self.ws = Workspace({t: None for t in tops}, workdir=self.workdir, env=self.env, memory_mb=max(256, mem))
        try:
            self._build(plan, tops)
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
                raise EnvironmentError_(self.task, f"building the environment took over its build_timeout_sec "
                                        f"({self.task['build_timeout']:g} s)")
            if step.kind == "copy":
                _copy_sources(self.task, self.ws, step)
                continue
            if step.workdir != "/":  # a RUN before the first WORKDIR runs in /, as Docker's does
                self._makedirs(step.workdir, f"line {step.line}")
            r = self.ws.exec(step.command, timeout=left, cwd=step.workdir, env=step.env)
            if r.error or r.timed_out or r.exit_code != 0:
                why = r.error or ("timed out" if r.timed_out else f"exited {r.exit_code}")
                raise unsupported(self.task, f"environment/Dockerfile line {step.line}: RUN {step.command[:200]!r} "
                                  f"{why} in the sandbox: {tail(r.stderr or r.stdout, 600)!r}. The sandbox backend "
                                  "runs RUN with the host's /usr, no network and a read-only root outside the "
                                  "folders it mounts")
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
            raise unsupported(self.task, f"environment/Dockerfile {why}: {inside} is not in a folder the sandbox "
                              "backend mounts") from None
        except Refused as e:
            raise unsupported(self.task, f"environment/Dockerfile {why}: {e} (the sandbox backend never makes "
                              "folders through a link)") from None

    def exec(self, command: str, *, timeout: float, env: dict | None = None, cwd: str | None = None) -> Any:
        r = self.ws.exec(command, timeout=timeout, env=env, cwd=cwd)
        if r.error:
            raise EnvironmentError_(self.task, f"the sandbox failed to run a command: {r.error}")
        return r

    def _run_folder(self, inside: str, folder: str, script: str, timeout: float, env: dict) -> Any:
        from evolve.sandbox.beneath import Refused

        try:  # a fresh copy each time (a second verification of one episode gets the tests afresh)
            self.ws.mount(inside, Path(self.task["path"]) / folder, writable=False, within=Path(self.task["path"]))
        except Refused as e:
            raise EnvironmentError_(self.task, f"{folder}/: {e}; a task's files are copied without following "
                                    "links") from None
        return self.exec(f"bash {inside}/{script}", timeout=timeout, env=env)

    def _read(self, inside: str) -> bytes | None:
        from evolve.sandbox.beneath import Refused

        try:
            return self.ws.read(inside, limit=TEXT_LIMIT)
        except Refused as e:
            raise EnvironmentError_(self.task, f"the reward file: {e}; the host reads it without following links, "
                                    "so tests/test.sh must write it as a regular file") from None

    def _fresh_verifier_folder(self) -> None:
        """/logs/verifier as a real folder without stale reward files (the agent may have made it a
        link or a file: then it is made again)."""
        try:
            self.ws.makedirs("/logs/verifier")
            for name in ("reward.txt", "reward.json"):
                self.ws.remove(f"/logs/verifier/{name}")
        except OSError:
            self.ws.remove("/logs/verifier")
            self.ws.makedirs("/logs/verifier")

    def verify(self) -> dict:
        t0 = time.monotonic()
        try:
            self._fresh_verifier_folder()
            r = self._run_folder("/tests", "tests", "test.sh", self.task["verifier_timeout"],
                                 self.task.get("verifier_env", {}))
            reward_json, reward_txt = self._read("/logs/verifier/reward.json"), self._read("/logs/verifier/reward.txt")
        except OSError as e:
            raise EnvironmentError_(self.task, f"verifying failed on the host: {type(e).__name__}: {e}") from None
        return verdict(self.task, r, reward_json, reward_txt, time.monotonic() - t0)

    def solve(self) -> Any:
        try:
            return self._run_folder("/solution", "solution", "solve.sh", self.task["agent_timeout"], {})
        except OSError as e:
            raise EnvironmentError_(self.task, f"copying solution/ failed: {type(e).__name__}: {e}") from None

    def close(self) -> None:
        self.ws.close()


__all__ = ["READ_ONLY_TOPS", "SandboxEnvironment"]
