"""The docker backend of a Harbor task's environment: the task's Dockerfile built by the engine
(once per task content), one container per episode with memory, CPU and pids limits and the
network the task's ``network_mode`` asks for (:func:`networks`); the agent's commands in one
persistent shell (:mod:`.docker_shell`), the verifier and the oracle by ``exec`` as Harbor runs them
(:mod:`.phases`), as the task's users. Files go in as tars that keep links as links (no device or
FIFO of the task's, owned by root as ``docker cp`` makes them), and come out through the engine's
API (``get_archive``, or ``tail`` in the container), never through a host path."""

from __future__ import annotations

import io
import tarfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.worlds.harbor.environment.base import PhasedEnvironment
from evolve.worlds.harbor.environment.build import labels
from evolve.worlds.harbor.environment.outcome import TEXT_LIMIT, EnvironmentError_, tail

if TYPE_CHECKING:
    from evolve.worlds.harbor.environment.docker_shell import DockerShell

# The capabilities an episode's and a verifier's container keep (Docker's defaults less NET_RAW,
# MKNOD, AUDIT_WRITE, SETFCAP, SETPCAP, SYS_CHROOT and NET_BIND_SERVICE, which no published task
# measured here needs: docs/worlds.md); ``capabilities: docker`` keeps Docker's defaults.
KEPT_CAPS = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID")
CAPABILITIES = ("reduced", "docker")


def capabilities(setting: str) -> dict[str, Any]:
    """The ``containers.run`` keywords for ``setting``: ``reduced`` (every capability dropped but
    :data:`KEPT_CAPS`) or ``docker`` (the engine's defaults)."""
    if setting == "docker":
        return {}
    if setting != "reduced":
        raise ValueError(f"capabilities {setting!r}: use one of {', '.join(CAPABILITIES)}")
    return {"cap_drop": ["ALL"], "cap_add": list(KEPT_CAPS)}


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
    """Files, folders and links (as links) only: no device or FIFO of a task's goes into a container;
    owned by root, as ``docker cp`` (Harbor's upload) makes them."""
    if not (info.isreg() or info.isdir() or info.issym() or info.islnk()):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _tar_children(folder: Path) -> bytes:
    """The folder's contents (not the folder itself: the target keeps its owner and mode)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for child in sorted(folder.iterdir()):
            tar.add(str(child), arcname=child.name, filter=_plain)
    return buf.getvalue()


def networks(task: dict, client: Any) -> tuple[dict[str, str], list[str]]:
    """The engine network each phase runs on (``{"agent", "verifier"}``: ``none`` or the engine's
    ``bridge``; never ``host``, the machine's own), and the phases left without the network
    Harbor's default (``public``) would give them. A phase whose task.toml asks for the network
    where the engine has none for containers is ``unsupported`` here: the world cannot run it."""
    try:
        names = {n.name for n in client.networks.list()}
    except Exception:  # noqa: BLE001 - an engine that will not say: none assumed
        names = set()
    net = task.get("network") or {"agent": "no-network", "verifier": "no-network", "declared": []}
    out: dict[str, str] = {}
    denied: list[str] = []
    for phase in ("agent", "verifier"):
        if net[phase] == "no-network":
            out[phase] = "none"
        elif "bridge" in names:
            out[phase] = "bridge"
        elif phase in net.get("declared", []):
            raise EnvironmentError_(
                task,
                f"its {phase} needs the network (network_mode = 'public' in task.toml), and "
                f"this Docker engine has no network for containers (it has {sorted(names)}; the "
                "host network, the machine's own, is never given to a task): run it where the "
                "engine has its default bridge network",
                status="unsupported",
                kind="Unsupported",
            )
        else:
            out[phase], denied = "none", denied + [phase]
    if out["agent"] != out["verifier"] and task.get("verifier_mode") != "separate":
        raise EnvironmentError_(
            task,
            f"its agent runs on network {out['agent']!r} and its verifier on "
            f"{out['verifier']!r}; the docker backend does not switch a container's network "
            "between phases yet",
            status="unsupported",
            kind="Unsupported",
        )
    return out, denied


def _tar_of(folder: Path, prefix: str) -> bytes:
    # tarfile.add follows no link (lstat, links stored as links), so nothing outside the task folder
    # goes in; the engine unpacks it inside the container
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(folder), arcname=prefix, filter=_plain)
    return buf.getvalue()


class DockerEnvironment(PhasedEnvironment):
    """The task's environment as a container built from its Dockerfile (see the module docstring)."""

    backend = "docker"
    offline = (
        "none: the task leaves network_mode at Harbor's default (public), and this engine has no network for containers"
    )

    def __init__(self, task: dict, client: Any = None) -> None:
        from evolve.worlds.harbor.environment.hostenv import resolve

        self.task = task
        self.shell: DockerShell | None = None
        self.container: Any = None  # docker's Container, once started
        self.restarts = 0  # times the episode's shell had to be started again
        self.client = client or docker_client()
        if self.client is None:
            raise EnvironmentError_(
                task,
                "no Docker engine answers here (docker.from_env().ping() failed); use the "
                "sandbox backend (world params: environment: sandbox)",
            )
        self.networks, self.denied = networks(task, self.client)
        self.image = self._image()
        try:
            config = self.client.images.get(self.image).attrs.get("Config") or {}
        except Exception as e:  # noqa: BLE001 - docker.errors.ImageNotFound: the task's image is not here
            raise EnvironmentError_(
                task,
                f"the image {self.image!r} is not available to the engine: {type(e).__name__}: {tail(str(e), 300)}",
            ) from None
        self.workdir = task.get("workdir") or config.get("WorkingDir") or "/app"
        self.variables = resolve(task, task.get("environment_env"))
        self.container = self._start(self.image, self.networks["agent"])

    def _start(self, image: str, network: str) -> Any:
        mem = int(self.task.get("memory_mb") or 2048)
        try:
            ct = self.client.containers.run(
                image,
                command=["sleep", "infinity"],
                detach=True,
                init=True,
                working_dir=self.workdir,
                network_mode=network,
                network_disabled=network == "none",
                mem_limit=f"{mem}m",
                memswap_limit=f"{mem}m",
                pids_limit=512,
                nano_cpus=int((self.task.get("cpus") or 1.0) * 1e9),
                environment=self.variables,
                labels=labels(),
                **capabilities(self.task.get("capabilities") or "reduced"),
            )
        except Exception as e:  # noqa: BLE001 - the engine refused: the world failing
            raise EnvironmentError_(self.task, f"the container did not start: {type(e).__name__}: {e}") from None
        try:
            r = ct.exec_run(
                [
                    "sh",
                    "-c",
                    "mkdir -p /logs/verifier /logs/agent /logs/artifacts && chmod 777 /logs "
                    '/logs/verifier /logs/agent /logs/artifacts && mkdir -p "$1"',
                    "sh",
                    self.workdir,
                ],
                user="0",
            )
            if r.exit_code != 0:
                raise EnvironmentError_(self.task, f"making /logs in the container failed: {r.output[-300:]!r}")
        except BaseException:
            ct.remove(force=True)
            raise
        return ct

    def _image(self) -> str:
        from evolve.worlds.harbor.environment.build import task_image

        return task_image(self.task, self.client)

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
        """``bash -c command`` by its own ``docker exec`` (Harbor's ``environment.exec``), as
        ``user`` (None: the image's), killed at ``timeout`` seconds (None: no limit)."""
        from evolve.sandbox.shell import OUTPUT_CAP, ShellResult

        argv = ["bash", "-c", command]
        if timeout is not None:
            argv = ["timeout", "-s", "KILL", f"{max(0.1, timeout):.1f}", *argv]
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["r"] = self.container.exec_run(
                    argv, workdir=cwd or self.workdir, environment=dict(env or {}), demux=True, user=user or ""
                )
            except Exception as e:  # noqa: BLE001
                box["e"] = e

        t0 = time.monotonic()
        th = threading.Thread(target=run, daemon=True)
        th.start()
        th.join(None if timeout is None else timeout + 15.0)
        if th.is_alive():
            self.close()
            raise EnvironmentError_(
                self.task, f"docker exec did not return {(timeout or 0) + 15:.0f} s after its timeout"
            )
        if "e" in box:
            raise EnvironmentError_(self.task, f"docker exec failed: {type(box['e']).__name__}: {box['e']}")
        res = box["r"]
        out, err = res.output if isinstance(res.output, tuple) else (res.output, b"")
        out, err = (out or b"").decode("utf-8", "replace"), (err or b"").decode("utf-8", "replace")
        code = res.exit_code
        timed_out = timeout is not None and code in (124, 137) and time.monotonic() - t0 >= timeout - 0.5
        if code in (126, 127) and "unable to find user" in (out + err):
            raise EnvironmentError_(
                self.task, f"the image has no user {user!r} (task.toml names it): {err.strip()[-300:]}"
            )
        return ShellResult(
            None if timed_out else code,
            out[-OUTPUT_CAP:],
            err[-OUTPUT_CAP:],
            timed_out,
            time.monotonic() - t0,
            len(out) > OUTPUT_CAP or len(err) > OUTPUT_CAP,
        )

    def exec(self, command: str, *, timeout: float | None, env: dict | None = None, cwd: str | None = None) -> Any:
        """A one-shot command as the agent's user (the persistent shell is :meth:`run`)."""
        return self.sh(command, timeout=timeout, env=env, cwd=cwd, user=self.task.get("agent_user"))

    def run(self, command: str, *, timeout: float | None, user: str | None = None) -> Any:
        """``command`` in the episode's persistent shell (started on the first one, as ``user``)."""
        from evolve.sandbox.shell import OUTPUT_CAP
        from evolve.worlds.harbor.environment.docker_shell import DockerShell

        user = user or self.task.get("agent_user")
        if self.shell is not None and self.shell.user != user:  # a step with its own agent user
            self._close_shell()
        if self.shell is None:
            try:
                self.shell = DockerShell(
                    self.client, self.container, user=user, workdir=self.workdir, env={}, cap=OUTPUT_CAP
                )
            except Exception as e:  # noqa: BLE001 - no bash in the image, an unknown user: the world failing
                raise EnvironmentError_(
                    self.task, f"the episode's shell did not start: {type(e).__name__}: {tail(str(e), 400)}"
                ) from None
        try:
            return self.shell.run(command, timeout)
        except Exception as e:  # noqa: BLE001 - the engine went away under the shell
            raise EnvironmentError_(self.task, f"the episode's shell failed: {type(e).__name__}: {e}") from None

    # -- files --------------------------------------------------------------------------------------

    def reset(self, paths: list[str]) -> None:
        """Remove ``paths`` (as root) and make /logs' folders again, writable by every user."""
        import shlex

        r = self.container.exec_run(
            [
                "sh",
                "-c",
                f"rm -rf {' '.join(shlex.quote(p) for p in paths)}; mkdir -p "
                "/logs/verifier /logs/agent && chmod 777 /logs/verifier /logs/agent",
            ],
            user="0",
        )
        if r.exit_code != 0:
            raise EnvironmentError_(self.task, f"clearing {paths} failed: {r.output[-300:]!r}")

    def upload(self, folder: str, inside: str, *, replace: bool = True, kind: str = "RuntimeError") -> None:
        """The task's ``folder`` copied to ``inside`` (its contents merged there when not ``replace``)."""
        from evolve.sandbox.beneath import kind as kind_of

        try:
            if kind_of(self.task["path"], folder) != "dir":
                raise EnvironmentError_(self.task, f"{folder}/ is not a folder of the task", kind=kind)
            if replace:
                self.container.exec_run(["rm", "-rf", inside], user="0")
            self.container.exec_run(["mkdir", "-p", inside], user="0")
            self.container.put_archive(inside, _tar_children(Path(self.task["path"]) / folder))
        except EnvironmentError_:
            raise
        except Exception as e:  # noqa: BLE001 - the engine refused the copy
            raise EnvironmentError_(
                self.task, f"copying {folder}/ to {inside} failed: {type(e).__name__}: {tail(str(e), 300)}", kind=kind
            ) from None

    def executable(self, inside: str) -> None:
        self.container.exec_run(["chmod", "+x", inside], user="0")

    def fetch(self, inside: str, *, limit: int | None = None, tail_bytes: int | None = None) -> bytes | None:
        """A file of the container, out through the engine's API (never a host path): the whole
        regular file (at most ``limit`` bytes), or its last ``tail_bytes``; None when absent."""
        if tail_bytes is not None:
            r = self.container.exec_run(["tail", "-c", str(tail_bytes), inside], user="0", demux=True)
            return (r.output[0] or b"") if r.exit_code == 0 else None
        try:
            stream, _ = self.container.get_archive(inside)
        except Exception:  # noqa: BLE001 - docker.errors.NotFound: no such file
            return None
        limit = limit or TEXT_LIMIT
        data = bytearray()
        for chunk in stream:
            data += chunk
            if len(data) > limit + 65536:
                raise EnvironmentError_(self.task, f"{inside} is over {limit} bytes", kind="DownloadVerifierDirError")
        with tarfile.open(fileobj=io.BytesIO(bytes(data))) as tar:
            member = tar.next()
            if member is None:
                return None
            if not member.isfile():
                raise EnvironmentError_(
                    self.task,
                    f"{inside} is not a regular file (a link or a folder); "
                    "tests/test.sh must write it as a regular file",
                    kind="DownloadVerifierDirError",
                )
            f = tar.extractfile(member)
            return f.read() if f is not None else None

    # -- the task's phases --------------------------------------------------------------------------

    def verify(self, step: dict | None = None) -> dict:
        if self.task.get("verifier_mode") == "separate":
            self._to_verifier_container()
        return super().verify(step)

    def _to_verifier_container(self) -> None:
        """Harbor's separate verifier: the artifacts (and /logs/artifacts) out of the agent's
        container, which then goes; a fresh container of the verifier's image (the task's own by
        default) with them put back at their paths (regular files and folders only)."""
        kept = []
        for src in [a["source"] for a in self.task.get("artifacts") or []] + ["/logs/artifacts"]:
            try:
                stream, _ = self.container.get_archive(src)
                kept.append((src, _only_plain(b"".join(stream), self.task)))
            except EnvironmentError_:
                raise
            except Exception:  # noqa: BLE001 - docker.errors.NotFound: the agent made no such artifact
                continue
        self.close()
        images = dict(self.task.get("images") or {})
        image = self.task.get("verifier_image")
        image = images.get(image, image) if image else self.image
        self.container = self._start(image, self.networks["verifier"])
        for src, data in kept:
            parent = src.rsplit("/", 1)[0] or "/"
            self.container.exec_run(["mkdir", "-p", parent], user="0")
            self.container.put_archive(parent, data)

    def _close_shell(self) -> None:
        if self.shell is not None:
            self.restarts += self.shell.restarts
            self.shell.close()
            self.shell = None

    def close(self) -> None:
        self._close_shell()
        c = getattr(self, "container", None)
        if c is not None:
            try:
                c.remove(force=True)
            except Exception:  # noqa: BLE001 - gone already
                pass
            self.container = None


ARTIFACTS_LIMIT = 256 << 20


def _only_plain(data: bytes, task: dict) -> bytes:
    """An artifact's tar with only regular files and folders (no link, device or setuid bit)."""
    if len(data) > ARTIFACTS_LIMIT:
        raise EnvironmentError_(task, f"an artifact is over {ARTIFACTS_LIMIT >> 20} MiB")
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for m in src:
            if m.isreg():
                m.mode &= 0o777
                dst.addfile(m, src.extractfile(m))
            elif m.isdir():
                m.mode &= 0o777
                dst.addfile(m)
    return out.getvalue()


__all__ = ["CAPABILITIES", "KEPT_CAPS", "DockerEnvironment", "capabilities", "docker_client", "networks"]
