"""A real Docker engine for the tests that need one, brought up by the project where the machine
allows it (the ``docker_engine`` fixture in tests/conftest.py).

1. An engine that already answers (``docker.from_env().ping()``) is used as it is and left running.
2. Else, as root with apt: Debian's ``docker.io`` (and ``debootstrap``) are installed when missing and
   ``dockerd --bridge=none --iptables=false --ip-masq=false`` is started (never a bridge: no
   private-range address may be used on the development machine); it is stopped when the tests end.
3. The base images come from no registry: ``evolvekit-standin/debian:bookworm`` is debootstrapped
   from the Debian mirror apt uses and ``docker import``ed; ``evolvekit-standin/python:3.11-slim``
   is built on it (Debian's python3 and python-is-python3, ``--network host``). They are stand-ins:
   :data:`IMAGES` is the image map the tests give the harbor world and the sandbox (``ubuntu`` and
   ``debian`` bases to the Debian one, ``python:3.11-slim`` to the Python one). They are kept between
   sessions, like the engine's package: making them again costs about a minute.

What the tests build and run is removed when they end: containers labelled ``evolvekit``, and images
made during the session (task images, a failed build's leftovers). Where none of this is possible
(not root, no apt, no engine), :func:`bring_up` says why and the tests skip with that reason.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEBIAN = "evolvekit-standin/debian:bookworm"
PYTHON = "evolvekit-standin/python:3.11-slim"
IMAGES = {"debian:bookworm": DEBIAN, "debian:12": DEBIAN, "ubuntu:24.04": DEBIAN, "ubuntu:22.04": DEBIAN,
          "ubuntu:latest": DEBIAN, "python:3.11-slim": PYTHON, "python:3.12-slim": PYTHON, "python:3.13-slim": PYTHON}
DOCKERD = ["dockerd", "--bridge=none", "--iptables=false", "--ip-masq=false"]


@dataclass
class Engine:
    client: Any
    started: subprocess.Popen | None = None  # the dockerd these tests started, if they did
    images: dict[str, str] = field(default_factory=lambda: dict(IMAGES))
    since: float = field(default_factory=time.time)
    before: set[str] = field(default_factory=set)  # image ids present when the session began

    def task(self, folder: Path, allow_env: tuple[str, ...] | list[str] = (), **more: Any) -> dict:
        """The Harbor task in ``folder`` with this engine's image map (its bases the local stand-ins),
        reading the host variables in ``allow_env``."""
        from evolve.worlds.harbor.task import load_task

        return {**load_task(folder, allow_env=allow_env), "images": self.images, **more}


def _client(timeout: float = 5.0) -> Any:
    try:
        import docker
    except ImportError:
        return None
    try:
        c = docker.from_env(timeout=int(timeout))
        c.ping()
        return c
    except Exception:  # noqa: BLE001 - no engine answers
        return None


def _run(cmd: list[str], timeout: float, **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def _mirror() -> str:
    """The Debian mirror apt uses here (deb822 ``URIs:`` or a ``deb`` line naming .../debian)."""
    texts = []
    for p in [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]:
        try:
            texts.append(p.read_text())
        except OSError:
            continue
    for uri in re.findall(r"(?:URIs:|^deb(?:\s+\[[^\]]*\])?)\s+(\S+)", "\n".join(texts), re.MULTILINE):
        if uri.rstrip("/").endswith("/debian"):
            return uri
    return "http://deb.debian.org/debian"


def _install() -> str | None:
    """Debian's docker.io and debootstrap, when missing; a reason when they cannot be."""
    need = [pkg for pkg, exe in (("docker.io", "dockerd"), ("debootstrap", "debootstrap")) if not shutil.which(exe)]
    if not need:
        return None
    if not shutil.which("apt-get"):
        return f"no {', '.join(need)} and no apt-get to install them"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    r = _run(["apt-get", "install", "-y", "-q", *need], 600, env=env)
    if r.returncode != 0:  # the package lists may be missing on a fresh machine
        _run(["apt-get", "update", "-q"], 600, env=env)
        r = _run(["apt-get", "install", "-y", "-q", *need], 600, env=env)
    return None if r.returncode == 0 else f"apt-get install {' '.join(need)} failed: {r.stderr[-500:]}"


def _start() -> tuple[subprocess.Popen | None, str | None]:
    log = open(Path(tempfile.gettempdir()) / "evolvekit-tests-dockerd.log", "ab")  # noqa: SIM115 - dockerd's
    proc = subprocess.Popen(DOCKERD, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    for _ in range(120):
        if proc.poll() is not None:
            return None, f"dockerd exited with {proc.returncode}: see {log.name}"
        if _client(2) is not None:
            return proc, None
        time.sleep(0.5)
    _stop(proc)
    return None, "dockerd did not answer within 60 s"


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _has(client: Any, image: str) -> bool:
    try:
        client.images.get(image)
        return True
    except Exception:  # noqa: BLE001 - docker.errors.ImageNotFound
        return False


def _base_images(client: Any) -> str | None:
    """The stand-in bases (see the module docstring), made when missing; a reason when they cannot be."""
    if not _has(client, DEBIAN):
        with tempfile.TemporaryDirectory(prefix="evolvekit-debootstrap-") as d:
            r = _run(["debootstrap", "--variant=minbase", "bookworm", d, _mirror()], 900)
            if r.returncode != 0:
                return f"debootstrap of bookworm failed: {(r.stdout + r.stderr)[-500:]}"
            tar = subprocess.Popen(["tar", "-C", d, "-c", "."], stdout=subprocess.PIPE)
            r = _run(["docker", "import", "-", DEBIAN], 600, stdin=tar.stdout)
            tar.wait()
            if r.returncode != 0:
                return f"docker import of the bookworm root failed: {r.stderr[-500:]}"
    if not _has(client, PYTHON):
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "Dockerfile").write_text(
                f"FROM {DEBIAN}\nRUN apt-get update && apt-get install -y --no-install-recommends python3 "
                "python-is-python3 && rm -rf /var/lib/apt/lists/*\n")
            r = _run(["docker", "build", "--network", "host", "--force-rm", "-q", "-t", PYTHON, d], 900)
            if r.returncode != 0:
                return f"building the Python stand-in failed: {r.stderr[-500:]}"
    return None


def bring_up() -> tuple[Engine | None, str | None]:
    """An engine with the stand-in bases, or None and why not."""
    client, started = _client(), None
    if client is None:
        if os.geteuid() != 0:
            return None, "no Docker engine answers, and starting one needs root"
        why = _install()
        if why:
            return None, why
        started, why = _start()
        if why:
            return None, why
        client = _client()
    why = _base_images(client)
    if why:
        if started is not None:
            _stop(started)
        return None, why
    return Engine(client=client, started=started, before={i.id for i in client.images.list(all=True)}), None


def tear_down(engine: Engine) -> None:
    """Remove what the tests ran and built; stop the engine if the tests started it."""
    c = engine.client
    try:
        for ct in c.containers.list(all=True, filters={"label": "evolvekit"}):
            ct.remove(force=True)
        for ct in c.containers.list(all=True, filters={"status": "exited"}):  # a failed build's leftovers
            if ct.attrs.get("Created", "") and ct.image and ct.image.id not in engine.before:
                ct.remove(force=True)
        made = [i for i in c.images.list(all=True) if i.id not in engine.before]
        for img in sorted(made, key=lambda i: -len(i.attrs.get("RootFS", {}).get("Layers", []))):
            try:
                c.images.remove(img.id, force=True)
            except Exception:  # noqa: BLE001 - a parent removed with its child
                pass
    finally:
        if engine.started is not None:
            _stop(engine.started)


def leftovers(engine: Engine) -> list[str]:
    """What the tests left behind so far: containers labelled evolvekit, images made this session."""
    c = engine.client
    return ([f"container {ct.name}" for ct in c.containers.list(all=True, filters={"label": "evolvekit"})]
            + [f"image {i.tags or i.id}" for i in c.images.list(all=True) if i.id not in engine.before])
