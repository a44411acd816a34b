"""A Harbor task's environment, where the agent's commands and then the task's tests run.

Two backends, one interface (:class:`Environment`: ``exec``, ``verify``, ``solve``, ``close``):

* ``sandbox`` — no container engine needed: a bubblewrap workspace (:mod:`evolve.sandbox.shell`)
  holding the files the task's Dockerfile copies, with its ``RUN`` lines carried out over them
  (:mod:`.dockerfile`), the host's /usr standing in for the image; no network;
* ``docker`` — the task's Dockerfile built by the engine (once per task content), one container
  per episode with no network, memory, CPU and pids limits; commands by ``exec``.

``auto`` (the default) takes docker when an engine answers, else the sandbox. Verification is
Harbor's: stale reward files are removed, ``tests/`` is copied to ``/tests`` only now (the agent
never saw it), ``bash /tests/test.sh`` runs from the working directory under the verifier's
timeout and env, and the score is ``/logs/verifier/reward.json`` (its ``reward`` key, else the mean
of its values), else ``/logs/verifier/reward.txt``, else the exit code (0 solved). An environment
that cannot be built, a test script that does not finish, or a reward file that is not a number
is the world failing (:class:`~evolve.errors.InfraError`, category ``environment``), never a score.
"""

from __future__ import annotations

import glob
import io
import json
import math
import os
import shutil
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from evolve.errors import ConfigError, InfraError
from evolve.worlds.harbor.dockerfile import DockerfileError, parse, top_dirs

BACKENDS = ("auto", "sandbox", "docker")
FEEDBACK_CHARS = 4000


class EnvironmentError_(InfraError):  # noqa: N801 - not the builtin EnvironmentError
    """The task's environment failed (could not be built, a test that never finished, a reward
    that is not a number): the world failing under the rollout, not the agent."""

    def __init__(self, task: dict, message: str) -> None:
        super().__init__(f"Harbor task {task.get('id')}: {message}", category="environment", retryable=False)


class Environment(Protocol):
    backend: str
    workdir: str

    def exec(self, command: str, *, timeout: float, env: dict | None = None) -> Any: ...
    def verify(self) -> dict: ...
    def solve(self) -> Any: ...
    def close(self) -> None: ...


def _tail(text: str, n: int = FEEDBACK_CHARS) -> str:
    return text if len(text) <= n else "…" + text[-n:]


def parse_reward(task: dict, reward_json: bytes | None, reward_txt: bytes | None, exit_code: int | None) -> tuple[float, dict, str]:
    """(score, components, where it came from) by Harbor's rules (see the module docstring)."""
    if reward_json is not None:
        try:
            data = json.loads(reward_json.decode("utf-8", "replace") or "null")
        except json.JSONDecodeError as e:
            raise EnvironmentError_(task, f"/logs/verifier/reward.json is not JSON ({e}); fix tests/test.sh") from None
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            data = {"reward": data}
        if not isinstance(data, dict) or not data or not all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in data.values()):
            raise EnvironmentError_(task, f"/logs/verifier/reward.json must map names to numbers, got {str(data)[:200]}")
        comps = {str(k): float(v) for k, v in data.items()}
        score = comps.get("reward", sum(comps.values()) / len(comps))
        return score, comps, "reward.json"
    if reward_txt is not None:
        text = reward_txt.decode("utf-8", "replace").strip()
        try:
            score = float(text)
        except ValueError:
            raise EnvironmentError_(task, f"/logs/verifier/reward.txt holds {text[:80]!r}, not a number; fix "
                                    "tests/test.sh") from None
        if not math.isfinite(score):
            raise EnvironmentError_(task, f"/logs/verifier/reward.txt holds {text!r}")
        return score, {}, "reward.txt"
    return (1.0 if exit_code == 0 else 0.0), {}, "exit code"


# ----------------------------------------------------------------------------- sandbox backend

_TEMPLATES: dict[str, tuple[Path, dict]] = {}  # task digest -> (built folders, plan facts)
_TEMPLATE_LOCK = threading.Lock()
_TEMPLATE_ROOT: list[tempfile.TemporaryDirectory] = []  # one folder per process, removed when it exits


def _template_root() -> Path:
    """The process's folder of built environments (a TemporaryDirectory: removed at exit, so a run
    or a test session leaves nothing behind in /tmp)."""
    with _TEMPLATE_LOCK:
        if not _TEMPLATE_ROOT:
            _TEMPLATE_ROOT.append(tempfile.TemporaryDirectory(prefix="evolve-harbor-"))
        return Path(_TEMPLATE_ROOT[0].name)


def _plan_of(task: dict):
    dockerfile = Path(task["path"]) / "environment" / "Dockerfile"
    if not dockerfile.is_file():
        raise EnvironmentError_(task, "environment/Dockerfile is missing; the sandbox backend builds from it")
    try:
        return parse(dockerfile.read_text(errors="replace"))
    except DockerfileError as e:
        raise EnvironmentError_(task, f"environment/Dockerfile: {e}; use the docker backend "
                                "(world params: environment: docker)") from None


def _copy_sources(task: dict, ws: Any, step: Any) -> None:
    context = (Path(task["path"]) / "environment").resolve()
    for src in step.sources:
        matches = sorted(glob.glob(str(context / src))) if any(c in src for c in "*?[") else [str(context / src)]
        if not matches:
            raise EnvironmentError_(task, f"environment/Dockerfile line {step.line}: COPY source {src!r} is not in "
                                    "environment/")
        for m in matches:
            path = Path(m).resolve()
            if path != context and context not in path.parents:
                raise EnvironmentError_(task, f"environment/Dockerfile line {step.line}: {src!r} is outside the "
                                        "build context environment/")
            if not path.exists():
                raise EnvironmentError_(task, f"environment/Dockerfile line {step.line}: COPY source {src!r} is "
                                        "not in environment/")
            dest = step.dest
            if path.is_file() and dest.endswith("/"):
                dest = dest + path.name
            ws.put(dest.rstrip("/") or "/", path)


class SandboxEnvironment:
    """The task's environment as a bubblewrap workspace (see the module docstring)."""

    backend = "sandbox"

    def __init__(self, task: dict) -> None:
        from evolve.sandbox.shell import Workspace

        self.task = task
        plan = _plan_of(task)
        self.workdir = task.get("workdir") or plan.workdir
        tops = sorted(set(top_dirs(plan)) | {"/" + self.workdir.strip("/").split("/")[0], "/logs"})
        bad = [t for t in tops if t in ("/usr", "/etc", "/tmp", "/proc", "/dev", "/bin", "/lib", "/lib64", "/sbin")]
        if bad:
            raise EnvironmentError_(task, f"environment/Dockerfile writes into {bad[0]}, which the sandbox backend "
                                    "keeps read-only (it is the host's); use the docker backend")
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
            built = _TEMPLATES.get(key)
        if built is None:
            t0 = time.monotonic()
            for d in plan.dirs:
                self.ws.host(d).mkdir(parents=True, exist_ok=True)
                self.ws._give(self.ws.host(d))
            for step in plan.steps:
                left = self.task["build_timeout"] - (time.monotonic() - t0)
                if left <= 0:
                    raise EnvironmentError_(self.task, f"building the environment took over its build_timeout_sec "
                                            f"({self.task['build_timeout']:g} s)")
                if step.kind == "copy":
                    _copy_sources(self.task, self.ws, step)
                    continue
                self.ws.host(step.workdir).mkdir(parents=True, exist_ok=True)
                r = self.ws.exec(step.command, timeout=left, cwd=step.workdir, env=step.env)
                if r.error or r.timed_out or r.exit_code != 0:
                    why = r.error or ("timed out" if r.timed_out else f"exited {r.exit_code}")
                    raise EnvironmentError_(self.task, f"environment/Dockerfile line {step.line}: RUN {step.command[:200]!r} "
                                            f"{why} in the sandbox: {_tail(r.stderr or r.stdout, 600)!r}. The sandbox "
                                            "backend runs RUN with the host's /usr, no network and a read-only root; "
                                            "a task that installs packages needs the docker backend")
            template = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=_template_root()))
            for top in tops:
                shutil.copytree(self.ws.host(top), template / top.strip("/"), symlinks=True, dirs_exist_ok=True)
            with _TEMPLATE_LOCK:
                _TEMPLATES.setdefault(key, (template, {}))
            return
        template = built[0]
        for top in tops:
            src = template / top.strip("/")
            if src.exists():
                self.ws.put(top, src)

    def exec(self, command: str, *, timeout: float, env: dict | None = None, cwd: str | None = None) -> Any:
        r = self.ws.exec(command, timeout=timeout, env=env, cwd=cwd)
        if r.error:
            raise EnvironmentError_(self.task, f"the sandbox failed to run a command: {r.error}")
        return r

    def _run_folder(self, inside: str, folder: str, script: str, timeout: float, env: dict) -> Any:
        if inside in self.ws._mounts:  # a second verification (a retry inside one episode): a fresh copy
            shutil.rmtree(self.ws.host(inside), ignore_errors=True)
            self.ws.put(inside, Path(self.task["path"]) / folder)
        else:
            self.ws.mount(inside, Path(self.task["path"]) / folder, writable=False)
        return self.exec(f"bash {inside}/{script}", timeout=timeout, env=env)

    def _read(self, inside: str) -> bytes | None:
        p = self.ws.host(inside)
        return p.read_bytes() if p.is_file() else None

    def verify(self) -> dict:
        t0 = time.monotonic()
        for name in ("reward.txt", "reward.json"):
            p = self.ws.host(f"/logs/verifier/{name}")
            if p.exists() or p.is_symlink():
                p.unlink()
        vdir = self.ws.host("/logs/verifier")
        vdir.mkdir(parents=True, exist_ok=True)
        self.ws._give(vdir)
        r = self._run_folder("/tests", "tests", "test.sh", self.task["verifier_timeout"], self.task.get("verifier_env", {}))
        return _verdict(self.task, r, self._read("/logs/verifier/reward.json"), self._read("/logs/verifier/reward.txt"),
                        time.monotonic() - t0)

    def solve(self) -> Any:
        return self._run_folder("/solution", "solution", "solve.sh", self.task["agent_timeout"], {})

    def close(self) -> None:
        self.ws.close()


def _verdict(task: dict, r: Any, reward_json: bytes | None, reward_txt: bytes | None, seconds: float) -> dict:
    if r.timed_out:
        raise EnvironmentError_(task, f"tests/test.sh did not finish within the verifier's timeout_sec "
                                f"({task['verifier_timeout']:g} s) and was killed; give the test its own timeouts")
    score, comps, source = parse_reward(task, reward_json, reward_txt, r.exit_code)
    output = (r.stdout + ("\n" + r.stderr if r.stderr.strip() else "")).strip()
    return {"score": score, "components": comps, "source": source, "exit_code": r.exit_code,
            "output": _tail(output), "seconds": round(seconds, 3)}


# ----------------------------------------------------------------------------- docker backend

_IMAGES: dict[str, str] = {}
_IMAGE_LOCK = threading.Lock()


def docker_client(timeout: float = 3.0) -> Any:
    """A docker client whose engine answered a ping, or None (no SDK, no engine)."""
    try:
        import docker
    except ImportError:
        return None
    try:
        client = docker.from_env(timeout=int(max(1, timeout)))
        client.ping()
        return client
    except Exception:  # noqa: BLE001 - no engine here, a socket without a daemon, no permission
        return None


def _tar_of(folder: Path, prefix: str) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(folder), arcname=prefix)
    return buf.getvalue()


class DockerEnvironment:
    """The task's environment as a container built from its Dockerfile (see the module docstring).
    Written against the docker SDK's API; this machine has no engine, so it runs where one does."""

    backend = "docker"

    def __init__(self, task: dict, client: Any = None, *, network: bool = False) -> None:
        self.task = task
        self.client = client or docker_client()
        if self.client is None:
            raise EnvironmentError_(task, "no Docker engine answers here (docker.from_env().ping() failed); use the "
                                    "sandbox backend (world params: environment: sandbox)")
        image = self._image()
        self.workdir = task.get("workdir") or (self.client.images.get(image).attrs.get("Config", {}).get("WorkingDir")
                                               or "/app")
        mem = int(task.get("memory_mb") or 2048)
        try:
            self.container = self.client.containers.run(
                image, command=["sleep", "infinity"], detach=True, init=True, working_dir=self.workdir,
                network_mode=None if network else "none", network_disabled=not network,
                mem_limit=f"{mem}m", memswap_limit=f"{mem}m", pids_limit=512, nano_cpus=int(1e9),
                environment=dict(task.get("environment_env", {})), labels={"evolvekit": "harbor"})
        except Exception as e:  # noqa: BLE001 - the engine refused: the world failing
            raise EnvironmentError_(task, f"the container did not start: {type(e).__name__}: {e}") from None
        self.exec("mkdir -p /logs/verifier /logs/agent", timeout=30)

    def _image(self) -> str:
        if self.task.get("docker_image"):
            return str(self.task["docker_image"])
        tag = f"evolvekit-harbor/{self.task['id'].lower()}:{self.task['digest']}"
        with _IMAGE_LOCK:
            if tag in _IMAGES:
                return tag
            try:
                self.client.images.get(tag)
            except Exception:  # noqa: BLE001 - not built yet
                try:
                    self.client.images.build(path=str(Path(self.task["path"]) / "environment"), tag=tag, rm=True,
                                             timeout=int(self.task["build_timeout"]))
                except Exception as e:  # noqa: BLE001 - a failed build: the task's environment is broken
                    raise EnvironmentError_(self.task, f"docker build of environment/ failed: {type(e).__name__}: "
                                            f"{_tail(str(e), 800)}") from None
            _IMAGES[tag] = tag
            return tag

    def exec(self, command: str, *, timeout: float, env: dict | None = None, cwd: str | None = None) -> Any:
        from evolve.sandbox.shell import OUTPUT_CAP, ShellResult

        argv = ["timeout", "-s", "KILL", f"{max(0.1, timeout):.1f}", "bash", "-c", command]
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["r"] = self.container.exec_run(argv, workdir=cwd or self.workdir, environment=dict(env or {}),
                                                   demux=True)
            except Exception as e:  # noqa: BLE001
                box["e"] = e

        t0 = time.monotonic()
        th = threading.Thread(target=run, daemon=True)
        th.start()
        th.join(timeout + 15.0)
        if th.is_alive():
            self.close()
            raise EnvironmentError_(self.task, f"docker exec did not return {timeout + 15:.0f} s after its timeout")
        if "e" in box:
            raise EnvironmentError_(self.task, f"docker exec failed: {type(box['e']).__name__}: {box['e']}")
        res = box["r"]
        out, err = res.output if isinstance(res.output, tuple) else (res.output, b"")
        out, err = (out or b"").decode("utf-8", "replace"), (err or b"").decode("utf-8", "replace")
        code = res.exit_code
        timed_out = code in (124, 137) and time.monotonic() - t0 >= timeout - 0.5
        return ShellResult(None if timed_out else code, out[-OUTPUT_CAP:], err[-OUTPUT_CAP:], timed_out,
                           time.monotonic() - t0, len(out) > OUTPUT_CAP or len(err) > OUTPUT_CAP)

    def _read(self, inside: str) -> bytes | None:
        try:
            stream, _ = self.container.get_archive(inside)
        except Exception:  # noqa: BLE001 - docker.errors.NotFound: no such file
            return None
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = next((m for m in tar.getmembers() if m.isfile()), None)
            f = tar.extractfile(member) if member is not None else None
            return f.read() if f is not None else None

    def _put(self, inside: str, folder: str) -> None:
        self.exec(f"rm -rf {inside}", timeout=30)
        self.container.put_archive("/", _tar_of(Path(self.task["path"]) / folder, inside.strip("/")))

    def verify(self) -> dict:
        t0 = time.monotonic()
        self.exec("rm -f /logs/verifier/reward.txt /logs/verifier/reward.json; mkdir -p /logs/verifier", timeout=30)
        self._put("/tests", "tests")
        r = self.exec("bash /tests/test.sh", timeout=self.task["verifier_timeout"], env=self.task.get("verifier_env"))
        return _verdict(self.task, r, self._read("/logs/verifier/reward.json"), self._read("/logs/verifier/reward.txt"),
                        time.monotonic() - t0)

    def solve(self) -> Any:
        self._put("/solution", "solution")
        return self.exec("bash /solution/solve.sh", timeout=self.task["agent_timeout"])

    def close(self) -> None:
        c = getattr(self, "container", None)
        if c is not None:
            try:
                c.remove(force=True)
            except Exception:  # noqa: BLE001 - gone already
                pass
            self.container = None


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        from evolve.registry import did_you_mean

        raise ConfigError(f"environment {name!r} is not a backend ({did_you_mean(name, list(BACKENDS))})",
                          path="dataset.params.environment")
    return name


def open_environment(task: dict, backend: str = "auto") -> Environment:
    """A fresh environment for one episode of ``task`` on ``backend`` (see the module docstring)."""
    check_backend(backend)
    if backend == "docker" or (backend == "auto" and os.environ.get("EVOLVE_HARBOR_BACKEND") != "sandbox"
                               and docker_client(timeout=2) is not None):
        return DockerEnvironment(task)
    from evolve.sandbox import SandboxUnavailable

    try:
        return SandboxEnvironment(task)
    except SandboxUnavailable:
        raise
    except OSError as e:
        raise EnvironmentError_(task, f"the sandbox workspace could not be made: {e}") from None


__all__ = ["BACKENDS", "DockerEnvironment", "Environment", "EnvironmentError_", "SandboxEnvironment", "docker_client",
           "open_environment", "parse_reward"]
