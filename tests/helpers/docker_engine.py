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

4. What the tests build and run is removed when they end, and nothing else: the session sets
   ``$EVOLVE_HARBOR_SESSION`` to an id of its own, the harbor world labels every container and image
   it makes with it (``evolvekit.session``), and only those are removed, so a user's own harbor runs
   on the same engine, and their images, are left alone (a failed build's untagged layers carry no
   label and stay, as any build cache does).
5. The dockerd the tests start is recorded in :data:`PIDFILE` (pid, start time, command line). A
   session that was killed leaves it running; the next session finds it there, checks it is that
   very process (the recorded start time and command line), stops it and starts its own, so it is
   never mistaken for a user's engine.

Where none of this is possible (not root, no apt, no engine), :func:`bring_up` says why and the
tests skip with that reason; where CI runs as root with apt (``$CI`` set), that is a failure
instead (:func:`must_have_engine`), so the docker tests are never skipped there silently.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEBIAN = "evolvekit-standin/debian:bookworm"
PYTHON = "evolvekit-standin/python:3.11-slim"
IMAGES = {
    "debian:bookworm": DEBIAN,
    "debian:12": DEBIAN,
    "ubuntu:24.04": DEBIAN,
    "ubuntu:22.04": DEBIAN,
    "ubuntu:latest": DEBIAN,
    "python:3.11-slim": PYTHON,
    "python:3.12-slim": PYTHON,
    "python:3.13-slim": PYTHON,
}
DOCKERD = ["dockerd", "--bridge=none", "--iptables=false", "--ip-masq=false"]
PIDFILE = Path(tempfile.gettempdir()) / "evolvekit-tests-dockerd.json"
SESSION_ENV = "EVOLVE_HARBOR_SESSION"


@dataclass
class Engine:
    client: Any
    started: subprocess.Popen | None = None  # the dockerd these tests started, if they did
    images: dict[str, str] = field(default_factory=lambda: dict(IMAGES))
    session: str = field(default_factory=lambda: f"tests-{uuid.uuid4().hex[:12]}")  # its label's value

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
    record(proc.pid)
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
    PIDFILE.unlink(missing_ok=True)


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat field 22), or None."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (not gone, not a zombie waiting for its parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _cmdline(pid: int) -> list[str]:
    try:
        return [a for a in Path(f"/proc/{pid}/cmdline").read_text().split("\0") if a]
    except OSError:
        return []


def record(pid: int) -> None:
    """Write :data:`PIDFILE` for the dockerd ``pid`` these tests started: its pid, start time and command line."""
    cmdline: list[str] = []
    for _ in range(250):  # a process just started shows its command line only once its exec is done
        cmdline = _cmdline(pid)
        if cmdline:
            break
        time.sleep(0.02)
    PIDFILE.write_text(json.dumps({"pid": pid, "start": _start_time(pid), "cmdline": cmdline}))


def orphan() -> int | None:
    """The pid of a dockerd an earlier test session started and left running: the process in
    :data:`PIDFILE`, alive with the recorded start time and command line (so a pid the system has
    given to another process since is never taken for it), else None; a stale record is removed."""
    try:
        rec = json.loads(PIDFILE.read_text())
        pid = int(rec["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if rec.get("start") and _start_time(pid) == rec["start"] and rec.get("cmdline") and _cmdline(pid) == rec["cmdline"]:
        return pid
    PIDFILE.unlink(missing_ok=True)  # gone, or the pid is another process's now
    return None


def stop_orphan() -> int | None:
    """Stop the dockerd an earlier session left (:func:`orphan`); its pid, or None when there is none."""
    import signal

    pid = orphan()
    if pid is None:
        return None
    os.kill(pid, signal.SIGTERM)
    for _ in range(120):
        if not _alive(pid):
            break
        time.sleep(0.5)
    else:
        os.kill(pid, signal.SIGKILL)
    PIDFILE.unlink(missing_ok=True)
    return pid


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
                "python-is-python3 && rm -rf /var/lib/apt/lists/*\n"
            )
            r = _run(["docker", "build", "--network", "host", "--force-rm", "-q", "-t", PYTHON, d], 900)
            if r.returncode != 0:
                return f"building the Python stand-in failed: {r.stderr[-500:]}"
    return None


def bring_up() -> tuple[Engine | None, str | None]:
    """An engine with the stand-in bases, or None and why not. A dockerd an earlier session started
    and left running is stopped first; the session's id goes into ``$EVOLVE_HARBOR_SESSION``."""
    if os.geteuid() == 0:
        stop_orphan()
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
    engine = Engine(client=client, started=started)
    os.environ[SESSION_ENV] = engine.session  # the harbor world labels what it makes with it
    return engine, None


def must_have_engine() -> bool:
    """Whether a missing engine fails the tests: in CI (``$CI``) as root with apt, where
    :func:`bring_up` can always make one."""
    return bool(os.environ.get("CI")) and os.geteuid() == 0 and shutil.which("apt-get") is not None


def ours(engine: Engine) -> dict[str, str]:
    return {"label": f"evolvekit.session={engine.session}"}


def tear_down(engine: Engine) -> None:
    """Remove the containers and images this session made (its label); stop the engine if the
    tests started it."""
    c = engine.client
    try:
        for ct in c.containers.list(all=True, filters=ours(engine)):
            ct.remove(force=True)
        for img in c.images.list(filters=ours(engine)):
            try:
                c.images.remove(img.id, force=True)
            except Exception:  # noqa: BLE001 - removed with another tag of it
                pass
    finally:
        os.environ.pop(SESSION_ENV, None)
        if engine.started is not None:
            _stop(engine.started)


def leftovers(engine: Engine) -> list[str]:
    """What this session left behind so far: its containers."""
    return [f"container {ct.name}" for ct in engine.client.containers.list(all=True, filters=ours(engine))]
