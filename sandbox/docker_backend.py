"""The `docker` backend: one throwaway container per run, locked down through the engine's API.

No network (network_mode "none"), read-only root, a size-capped tmpfs at /tmp, memory = memory+swap
limit, a CPU quota, a pids limit, uid 65534, every capability dropped, no-new-privileges, a minimal
environment, an init process to reap orphans; the container is killed and removed when the run
ends, whatever happened. The request goes in on stdin (attach socket, StdinOnce), results come back
on stdout as lines behind a random per-run marker. Its strength rests on the daemon's own config
(seccomp/AppArmor profile, userns-remap or not, runtime); see README.md.
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ._paths import vet_ro_paths
from ._protocol import (
    BOOTSTRAP_SOURCE,
    Capped,
    Ending,
    LineReader,
    batch_result,
    parse_line,
    request_bytes,
)
from ._types import Limits, SandboxResult, SandboxUnavailable
from .base import Outcome, SandboxBase, fill_after_death

DEFAULT_IMAGE = "python:3.11-slim"
_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
_SLACK_S = 5.0  # container create/start/teardown on top of the code's own wall limit


def _engine_address() -> str:
    return os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def _process_alternative() -> str:
    try:
        from .process import ProcessSandbox

        ProcessSandbox()
        return "the 'process' backend works here"
    except SandboxUnavailable as exc:
        return f"the 'process' backend is unavailable too ({exc})"


class DockerSandbox(SandboxBase):
    """Options: image (default python:3.11-slim; must already be present, nothing is pulled), client
    (a docker.DockerClient; default docker.from_env()), python (interpreter in the image), cpus,
    slack_s (time allowed for container start and teardown on top of the wall limit)."""

    name = "docker"

    def __init__(
        self,
        *,
        image: str = DEFAULT_IMAGE,
        client: Any = None,
        python: str = "python",
        cpus: float = 1.0,
        slack_s: float = _SLACK_S,
    ):
        self.image, self.python, self.cpus, self.slack_s = image, python, cpus, slack_s
        if client is None:
            try:
                import docker
            except ImportError as exc:
                raise SandboxUnavailable(
                    f"docker: the docker SDK is not installed ({exc}); pip install 'evolvekit[sandbox]'; "
                    f"{_process_alternative()}"
                ) from None
            try:
                client = docker.from_env()
                client.ping()
            except Exception as exc:  # noqa: BLE001 - DockerException, requests errors, socket permissions
                raise SandboxUnavailable(
                    f"docker: no engine reachable at {_engine_address()} ({type(exc).__name__}: {exc}); "
                    f"{_process_alternative()}"
                ) from None
        self.client = client
        try:
            client.images.get(image)
        except Exception as exc:  # noqa: BLE001 - ImageNotFound, APIError
            raise SandboxUnavailable(
                f"docker: image {image!r} is not available to the engine ({exc}); "
                f"pull it first (docker pull {image}); nothing is pulled at run time"
            ) from None

    # -- what the container is made of (unit-tested without an engine) ----------------------------

    def container_config(self, limits: Limits, binds: Sequence[tuple[str, str]] = ()) -> tuple[dict, dict]:
        """(create_container kwargs less host_config, create_host_config kwargs) for one run."""
        from docker.types import LogConfig, Ulimit

        mb = 1024 * 1024
        host = {
            "network_mode": "none",
            "read_only": True,
            "tmpfs": {"/tmp": f"rw,nosuid,nodev,size={limits.tmp_mb}m,mode=1777"},
            "mem_limit": limits.memory_mb * mb,
            "memswap_limit": limits.memory_mb * mb,  # = mem_limit: no swap on top
            "nano_cpus": int(self.cpus * 1e9),
            "pids_limit": limits.max_procs,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "ulimits": [
                Ulimit(name="cpu", soft=limits.cpu_s, hard=limits.cpu_s + 1),
                Ulimit(name="fsize", soft=limits.file_size_mb * mb, hard=limits.file_size_mb * mb),
                Ulimit(name="nofile", soft=256, hard=256),
                Ulimit(name="core", soft=0, hard=0),
            ],
            "init": True,
            "log_config": LogConfig(
                type="json-file",
                config={"max-size": f"{max(1, (16 * limits.output_bytes) // mb + 1)}m", "max-file": "1"},
            ),
            "binds": {source: {"bind": dest, "mode": "ro"} for source, dest in binds},
            "auto_remove": False,  # removed by us after reading the logs, also on timeout
        }
        create = {
            "image": self.image,
            "command": [self.python, "-I", "-S", "-B", "-c", BOOTSTRAP_SOURCE, "-", "marker"],
            "user": "65534:65534",
            "environment": dict(_ENV),
            "working_dir": "/tmp",
            "network_disabled": True,
            "hostname": "sandbox",
            "stdin_open": True,  # with detach=False the SDK also sets StdinOnce: EOF when we close our end
            "detach": False,
            "tty": False,
            "use_config_proxy": False,  # else the SDK copies proxy settings from ~/.docker/config.json into Env
        }
        return create, host

    # -- what the base asks of a backend ----------------------------------------------------------

    def _binds(self, ro_paths) -> list[tuple[str, str]]:
        return vet_ro_paths(ro_paths)

    def _once(self, mode: str, code: str, limits: Limits, binds, **fields) -> Outcome:
        marker = "@@sandbox-" + secrets.token_hex(16) + "@@"
        request = request_bytes(mode, code, limits, nproc=False, marker=marker, **fields)
        return self._container(request, limits, binds, marker, limits.wall_s)

    def _many(self, code: str, function: str, calls: list[dict], limits: Limits, binds) -> list[SandboxResult]:
        batch = replace(limits, cpu_s=limits.cpu_s * (len(calls) + 1) + 1)
        marker = "@@sandbox-" + secrets.token_hex(16) + "@@"
        request = request_bytes("many", code, batch, nproc=False, marker=marker, function=function, calls=calls)
        got = self._container(request, batch, binds, marker, limits.wall_s * (len(calls) + 1))
        results: list[SandboxResult | None] = [None] * len(calls)
        for obj in got.lines:
            i = obj.get("i")
            if "verdict" in obj and isinstance(i, int):
                if i == -1:
                    results = [batch_result(obj, limits, got.duration)] * len(calls)
                elif 0 <= i < len(calls):
                    results[i] = batch_result(obj, limits, got.duration / len(calls))
        missing = [j for j, r in enumerate(results) if r is None]
        if missing:
            fill_after_death(results, got, limits, missing[0])
        return [r for r in results if r is not None]

    # -- internals --------------------------------------------------------------------------------

    def _container(self, request: bytes, limits: Limits, binds, marker: str, wall: float):
        api = self.client.api
        create, host = self.container_config(limits, binds)
        t0 = time.monotonic()
        cid = api.create_container(host_config=api.create_host_config(**host), **create)["Id"]
        ending = Ending()
        stdout, stderr = Capped(limits.output_bytes), Capped(limits.output_bytes)
        reader = LineReader(14 * limits.output_bytes + 65536)
        lines: list[dict] = []
        try:
            sock = api.attach_socket(cid, params={"stdin": 1, "stream": 1})
            api.start(cid)
            raw = getattr(sock, "_sock", sock)
            raw.sendall(request)
            try:
                raw.shutdown(socket.SHUT_WR)
            finally:
                sock.close()
            try:
                ending.status = int(api.wait(cid, timeout=wall + self.slack_s).get("StatusCode", -1))
            except Exception as exc:  # noqa: BLE001 - requests' ReadTimeout / ConnectionError: the run overran
                ending.kill_reason, ending.kill_detail = "wall", f"the container did not finish ({type(exc).__name__})"
                _quiet(api.kill, cid)
            if ending.kill_reason is None and api.inspect_container(cid).get("State", {}).get("OOMKilled"):
                ending.stderr_tail = "out of memory (the engine's OOM killer stopped the container)"
            pending = b""
            for chunk in api.logs(cid, stdout=True, stderr=False, stream=True, follow=False):
                pending = _split_marked(pending + chunk, marker.encode(), stdout, reader, lines)
                if stdout.total > 16 * limits.output_bytes:
                    break
            _split_marked(pending, marker.encode(), stdout, reader, lines, final=True)
            for chunk in api.logs(cid, stdout=False, stderr=True, stream=True, follow=False):
                if stderr.add(chunk):
                    break
            ending.stderr_tail = ending.stderr_tail + bytes(stderr.data[-4096:]).decode("utf-8", "replace")
        finally:
            _quiet(api.remove_container, cid, force=True, v=True)
        return Outcome(lines, stdout, stderr, ending, time.monotonic() - t0)


def _split_marked(
    data: bytes, marker: bytes, stdout: Capped, reader: LineReader, lines: list[dict], final: bool = False
) -> bytes:
    """Move complete marked result lines out of `data` into `lines`, the rest into stdout; return
    the unfinished tail (which may still become a marked line). final: no more data will come."""
    tag = b"\n" + marker
    while True:
        at = data.find(tag)
        if at < 0:
            cut = len(data) if final else max(0, len(data) - len(tag))  # a marker may span chunks
            stdout.add(data[:cut])
            return data[cut:]
        end = data.find(b"\n", at + len(tag))
        if end < 0 and final:
            end, data = len(data), data + b"\n"
        if end < 0:
            stdout.add(data[:at])
            return data[at:]
        stdout.add(data[:at])
        for raw in reader.feed(data[at + len(tag) : end + 1]):
            obj = parse_line(raw)
            if obj is not None:
                lines.append(obj)
        data = data[end + 1 :]


def _quiet(fn, *args, **kwargs) -> None:
    try:
        fn(*args, **kwargs)
    except Exception:  # noqa: BLE001, S110 - teardown is best effort; the container may already be gone
        pass
