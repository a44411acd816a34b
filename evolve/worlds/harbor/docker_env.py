"""The docker backend of a Harbor task's environment: the task's Dockerfile built by the engine
(once per task content), one container per episode with no network and memory, CPU and pids
limits; commands by ``exec``. Files go in as tars that keep links as links (no device or FIFO of
the task's), and come out through the engine's API (``get_archive``), never through a host path."""

from __future__ import annotations

import hashlib
import io
import tarfile
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from evolve.worlds.harbor.outcome import TEXT_LIMIT, EnvironmentError_, tail, verdict

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


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    """Files, folders and links (as links) only: no device or FIFO of a task's goes into a container."""
    return info if info.isreg() or info.isdir() or info.issym() or info.islnk() else None


def _tar_of(folder: Path, prefix: str) -> bytes:
    # tarfile.add follows no link (lstat, links stored as links), so nothing outside the task folder
    # goes in; the engine unpacks it inside the container
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(folder), arcname=prefix, filter=_plain)
    return buf.getvalue()


class DockerEnvironment:
    """The task's environment as a container built from its Dockerfile (see the module docstring)."""

    backend = "docker"

    def __init__(self, task: dict, client: Any = None, *, network: bool = False) -> None:
        self.task = task
        self.client = client or docker_client()
        if self.client is None:
            raise EnvironmentError_(task, "no Docker engine answers here (docker.from_env().ping() failed); use the "
                                    "sandbox backend (world params: environment: sandbox)")
        image = self._image()
        try:
            config = self.client.images.get(image).attrs.get("Config") or {}
        except Exception as e:  # noqa: BLE001 - docker.errors.ImageNotFound: the task's image is not here
            raise EnvironmentError_(task, f"the image {image!r} is not available to the engine: {type(e).__name__}: "
                                    f"{tail(str(e), 300)}") from None
        self.workdir = task.get("workdir") or config.get("WorkingDir") or "/app"
        mem = int(task.get("memory_mb") or 2048)
        try:
            self.container = self.client.containers.run(
                image, command=["sleep", "infinity"], detach=True, init=True, working_dir=self.workdir,
                network_mode=None if network else "none", network_disabled=not network,
                mem_limit=f"{mem}m", memswap_limit=f"{mem}m", pids_limit=512, nano_cpus=int(1e9),
                environment=dict(task.get("environment_env", {})), labels={"evolvekit": "harbor"})
        except Exception as e:  # noqa: BLE001 - the engine refused: the world failing
            raise EnvironmentError_(task, f"the container did not start: {type(e).__name__}: {e}") from None
        try:
            self.exec("mkdir -p /logs/verifier /logs/agent", timeout=30)
        except BaseException:
            self.close()
            raise

    def _image(self) -> str:
        """The task's image: ``[environment] docker_image`` (through the image map), else its
        Dockerfile built as :mod:`.build` rewrites it, once per task content and rewrite."""
        from evolve.worlds.harbor.build import BuildfileError, rewrite

        images = dict(self.task.get("images") or {})
        if self.task.get("docker_image"):
            return images.get(str(self.task["docker_image"]), str(self.task["docker_image"]))
        self._check_context()
        from evolve.sandbox.beneath import Refused, read

        try:
            text = (read(self.task["path"], "environment/Dockerfile", limit=1 << 20) or b"").decode("utf-8", "replace")
            dockerfile = rewrite(text, images)
        except (Refused, BuildfileError) as e:
            raise EnvironmentError_(self.task, f"environment/Dockerfile: {e}", status="unsupported") from None
        digest = hashlib.sha256(dockerfile.encode()).hexdigest()[:12]
        tag = f"evolvekit-harbor/{self.task['id'].lower()}:{self.task['digest']}-{digest}"
        with _IMAGE_LOCK:
            if tag in _IMAGES:
                return tag
            try:
                self.client.images.get(tag)
            except Exception:  # noqa: BLE001 - not built yet
                self._build(dockerfile, tag)
            _IMAGES[tag] = tag
            return tag

    def _build(self, dockerfile: str, tag: str) -> None:
        """``docker build`` of environment/ with ``dockerfile`` (sent inside the context, never written
        into the task folder), on the build network; a failed build leaves no container behind."""
        from evolve.worlds.harbor.build import build_network

        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "Dockerfile"
            path.write_text(dockerfile)
            try:
                self.client.images.build(path=str(Path(self.task["path"]) / "environment"), dockerfile=str(path),
                                         tag=tag, rm=True, forcerm=True, labels={"evolvekit": "harbor"},
                                         network_mode=build_network(self.client, self.task.get("build_network",
                                                                                                "auto")),
                                         timeout=int(self.task["build_timeout"]))
            except Exception as e:  # noqa: BLE001 - a failed build: the task's environment is broken
                raise EnvironmentError_(self.task, f"docker build of environment/ failed: {type(e).__name__}: "
                                        f"{tail(str(e), 800)}") from None

    def _check_context(self) -> None:
        """The SDK tars environment/ without following links, but reads .dockerignore by its path."""
        from evolve.sandbox.beneath import Refused, kind

        try:
            k = kind(self.task["path"], "environment/.dockerignore")
        except Refused as e:
            k = str(e)
        if k not in (None, "file"):
            raise EnvironmentError_(self.task, "environment/.dockerignore is not a regular file; the host reads a "
                                    "task's files without following links")

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
        """The reward file, out through the engine's API (never a host path), by the rules the
        sandbox backend reads it by: a regular file of at most TEXT_LIMIT bytes."""
        try:
            stream, _ = self.container.get_archive(inside)
        except Exception:  # noqa: BLE001 - docker.errors.NotFound: no such file
            return None
        data = bytearray()
        for chunk in stream:
            data += chunk
            if len(data) > TEXT_LIMIT + 65536:
                raise EnvironmentError_(self.task, f"the reward file {inside} is over {TEXT_LIMIT} bytes")
        with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tar:
            member = tar.next()
            if member is None:
                return None
            if not member.isfile():
                raise EnvironmentError_(self.task, f"the reward file {inside} is not a regular file (a link or a "
                                        "folder); tests/test.sh must write it as a regular file")
            f = tar.extractfile(member)
            return f.read() if f is not None else None

    def _put(self, inside: str, folder: str) -> None:
        self.exec(f"rm -rf {inside}", timeout=30)
        self.container.put_archive("/", _tar_of(Path(self.task["path"]) / folder, inside.strip("/")))

    def verify(self) -> dict:
        t0 = time.monotonic()
        self.exec("rm -f /logs/verifier/reward.txt /logs/verifier/reward.json; mkdir -p /logs/verifier", timeout=30)
        self._put("/tests", "tests")
        r = self.exec("bash /tests/test.sh", timeout=self.task["verifier_timeout"], env=self.task.get("verifier_env"))
        return verdict(self.task, r, self._read("/logs/verifier/reward.json"), self._read("/logs/verifier/reward.txt"),
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


__all__ = ["DockerEnvironment", "docker_client"]
