"""A task's Dockerfile as the engine here can build it (the docker backend).

* **The image map** (``dataset.params.images``: ``{"ubuntu:24.04": "my-ubuntu:24.04"}``): a ``FROM``
  (or ``COPY --from``) naming an image in the map builds on the image it maps to. For machines that
  reach no registry: give the bases they cannot pull as local images. A stand-in is a stand-in: a
  task whose tests depend on what only the real image has fails on it, and that is the map's doing.
* **Heredocs** (BuildKit's ``RUN <<EOF``, ``RUN python3 <<EOF``, ``COPY <<EOF /path``), which an
  engine without BuildKit (Debian 12's 20.10) cannot parse, become plain ``RUN`` lines: the text
  BuildKit would hand the shell (the body alone for a bare ``RUN <<EOF``, else the whole command with
  its heredoc; ``cat > /path`` with the heredoc for ``COPY``) is written base64-encoded and run by the
  Dockerfile's shell, so variables expand as BuildKit expands them (in the shell, at build time,
  quoted delimiters not). A form this cannot carry (a ``COPY`` heredoc with flags other than
  ``--chmod``/``--chown``) is refused, naming the line.
* **The build's network** (:func:`build_network`): a task's ``RUN`` lines run as root, so a build
  never gets the host's network by default (it would reach every service on the machine's
  loopback: a gateway holding an upstream key, ``evolve mcp --http``, the dashboard, ``evolve
  serve``, Ray's job API). Where the engine has a ``bridge`` network a build uses it, as Harbor's
  do; where it has none (an engine started with ``--bridge=none``) a build has no network at all,
  and one that needs it fails as the world failing, its reason naming the image map and the
  opt-in. ``host`` is only ever the user's own choice (``dataset.params.build_network: host`` in
  their task file, or ``evolve harbor check --build-network host``), never a task folder's; it is
  logged as a warning each time a build uses it, and a client of ``evolve mcp`` cannot set it.

The rewritten Dockerfile is sent inside the build context (never written into the task folder), and
a failed build removes its intermediate containers (``forcerm``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import re
import shlex
import tempfile
import threading
from pathlib import Path
from typing import Any

_HEREDOC = re.compile(r"<<(-?)([\"']?)([A-Za-z_][A-Za-z0-9_]*)\2")
_FROM = re.compile(r"^(\s*FROM\s+(?:--platform=\S+\s+)?)(\S+)(.*)$", re.IGNORECASE)
_COPY_FROM = re.compile(r"(--from=)(\S+)", re.IGNORECASE)


class BuildfileError(ValueError):
    """A Dockerfile form the engine here cannot build; the message names the line."""


def _mapped(image: str, images: dict[str, str]) -> str:
    if image in images:
        return images[image]
    if ":" not in image.rsplit("/", 1)[-1] and "@" not in image and f"{image}:latest" in images:
        return images[f"{image}:latest"]
    return image


def _script_line(script: str, shell: list[str], executable: bool = False) -> str:
    """A ``RUN`` line running ``script`` (any text, newlines included) with ``shell``."""
    b64 = base64.b64encode(script.encode()).decode()
    f = "/tmp/.evolvekit-heredoc.$$"
    run = f"chmod +x {f} && {f}" if executable else f"{shlex.join(shell)} {f}"
    return f"RUN printf %s {b64} | base64 -d > {f} && {run}; rc=$?; rm -f {f}; exit $rc"


def _bodies(lines: list[str], i: int, marks: list[tuple[str, str, str]]) -> tuple[list[str], int]:
    """The heredoc bodies that follow line ``i`` (one per ``<<WORD`` on it), and the next line's index."""
    out = []
    j = i + 1
    for dash, _quote, word in marks:
        body = []
        while True:
            if j >= len(lines):
                raise BuildfileError(f"Dockerfile line {i + 1}: the heredoc <<{word} is never closed")
            raw = lines[j]
            j += 1
            if (raw.lstrip("\t") if dash else raw) == word:
                break
            body.append(raw.lstrip("\t") if dash else raw)
        out.append("\n".join(body) + "\n")
    return out, j


def rewrite(text: str, images: dict[str, str] | None = None) -> str:
    """``text`` with the image map applied and heredocs made plain (see the module docstring)."""
    images = dict(images or {})
    lines = text.splitlines()
    out: list[str] = []
    shell = ["/bin/sh"]
    i = 0
    while i < len(lines):
        line = lines[i]
        m = _FROM.match(line)
        if m:
            out.append(f"{m.group(1)}{_mapped(m.group(2), images)}{m.group(3)}")
            i += 1
            continue
        word = line.split(None, 1)[0].upper() if line.strip() and not line.lstrip().startswith("#") else ""
        if word == "SHELL":
            try:
                shell = [str(x) for x in json.loads(line.split(None, 1)[1])][:1] or shell
            except (ValueError, IndexError):
                pass
        if word == "COPY":
            line = _COPY_FROM.sub(lambda k: k.group(1) + _mapped(k.group(2), images), line)
        marks = _HEREDOC.findall(line) if word in ("RUN", "COPY", "ADD") else []
        if not marks:
            out.append(line)
            i += 1
            continue
        bodies, nxt = _bodies(lines, i, marks)
        rest = line.split(None, 1)[1] if len(line.split(None, 1)) > 1 else ""
        if word == "RUN":
            if rest.startswith("["):
                raise BuildfileError(f"Dockerfile line {i + 1}: a heredoc in RUN's exec form is not built here")
            m = re.match(r"((?:--\S+\s+)*)", rest)
            assert m is not None  # the pattern matches the empty string too
            flags = m.group(1)  # e.g. --mount=...: kept as they are
            cmd = rest[len(flags) :]
            bare = _HEREDOC.sub("", cmd).strip() == ""
            if bare and len(bodies) == 1:  # the body is the script, as BuildKit runs it
                body = bodies[0]
                out.append(
                    _script_line(body, shell, executable=body.startswith("#!")).replace("RUN ", f"RUN {flags}", 1)
                )
            else:  # the command with its heredocs: the shell reads them as it would any heredoc
                script = cmd + "\n" + "".join(b + w + "\n" for b, (_d, _q, w) in zip(bodies, marks))
                out.append(_script_line(script, shell).replace("RUN ", f"RUN {flags}", 1))
        else:  # COPY/ADD <<EOF [<<EOF2 ...] dest: files written by the shell (variables as BuildKit expands them)
            try:
                parts = shlex.split(_HEREDOC.sub("", rest))
            except ValueError as e:
                raise BuildfileError(f"Dockerfile line {i + 1}: {e}") from None
            opts = [p for p in parts if p.startswith("--")]
            dests = [p for p in parts if not p.startswith("--")]
            bad = [o for o in opts if not o.startswith(("--chmod=", "--chown="))]
            if bad or len(dests) != 1:
                raise BuildfileError(
                    f"Dockerfile line {i + 1}: {word} with a heredoc "
                    f"{'and ' + ' '.join(bad) if bad else 'needs one destination'} is not built here"
                )
            dest = dests[0]
            steps: list[str] = []
            for body, (_d, quote, w) in zip(bodies, marks):
                target = dest if len(marks) == 1 and not dest.endswith("/") else f"{dest.rstrip('/')}/{w}"
                q = "'" if quote else ""
                steps.append(f'mkdir -p "$(dirname {shlex.quote(target)})"')
                steps.append(f"cat > {shlex.quote(target)} <<{q}{w}{q}\n{body}{w}")
                for o in opts:
                    name, _, value = o.partition("=")
                    steps.append(
                        f"{'chmod' if name == '--chmod' else 'chown'} {shlex.quote(value)} {shlex.quote(target)}"
                    )
            out.append(_script_line("\n".join(steps) + "\n", shell))
        i = nxt
    return "\n".join(out) + "\n"


BUILD_NETWORKS = ("auto", "none", "host")
_log = logging.getLogger("evolve.worlds.harbor")


def check_build_network(value: Any, where: str = "dataset.params.build_network") -> str:
    """``value`` if it is a build network this world takes, else a ConfigError naming ``where``."""
    if value not in BUILD_NETWORKS:
        from evolve.errors import ConfigError

        raise ConfigError(
            f"build_network {value!r} is not one of {', '.join(BUILD_NETWORKS)} (auto: the engine's "
            "bridge network where it has one, else none; host: the machine's own network, your "
            "explicit choice only)",
            path=where,
        )
    return value


def build_network(client: Any, wanted: str = "auto", task_id: str = "") -> str | None:
    """The network a build uses: ``auto`` is the engine's default (its ``bridge`` network) where the
    engine has a ``bridge`` network, else ``none`` (also when the engine will not list its networks);
    ``none`` is none; ``host``, the user's explicit opt-in, is the host's network, logged as a warning."""
    check_build_network(wanted)
    if wanted == "host":
        _log.warning(
            "harbor: building %s on the HOST network (build_network: host, your opt-in): its Dockerfile's "
            "RUN lines run as root with every service on this machine's loopback in reach",
            task_id or "a task",
        )
        return "host"
    if wanted == "none":
        return "none"
    try:
        names = {n.name for n in client.networks.list()}
    except Exception:  # noqa: BLE001 - an engine that will not say: no network, never the host's
        return "none"
    return None if "bridge" in names else "none"


OFFLINE_BUILD = (
    "the build ran without a network (this engine has no bridge network, and a task's build never "
    "gets the host's): a Dockerfile that downloads (apt-get, pip, curl) cannot build here. Give its "
    "bases as local images (dataset.params.images, or evolve harbor check --image NAME=LOCAL), run "
    "it where the engine has its default bridge network, or, only for tasks you trust with this "
    "machine's network and its loopback services, opt in with dataset.params.build_network: host in "
    "your task file (evolve harbor check --build-network host)"
)


_IMAGES: dict[str, str] = {}
_IMAGE_LOCK = threading.Lock()


def labels() -> dict[str, str]:
    """The labels of what the docker backend makes: ``evolvekit=harbor``, and ``evolvekit.session``
    when ``$EVOLVE_HARBOR_SESSION`` names one (read when a container or image is made), so whoever
    set it (a test session) can remove what it made and nothing else."""
    out = {"evolvekit": "harbor"}
    session = os.environ.get("EVOLVE_HARBOR_SESSION")
    if session:
        out["evolvekit.session"] = session
    return out


def task_image(task: dict, client: Any) -> str:
    """The task's image: ``[environment] docker_image`` (through the image map), else its
    Dockerfile built as :func:`rewrite` makes it, once per task content and rewrite."""
    from evolve.worlds.harbor.environment.outcome import EnvironmentError_

    images = dict(task.get("images") or {})
    if task.get("docker_image"):
        return images.get(str(task["docker_image"]), str(task["docker_image"]))
    _check_context(task)
    from evolve.sandbox.beneath import Refused, read

    try:
        text = (read(task["path"], "environment/Dockerfile", limit=1 << 20) or b"").decode("utf-8", "replace")
        dockerfile = rewrite(text, images)
    except (Refused, BuildfileError) as e:
        raise EnvironmentError_(task, f"environment/Dockerfile: {e}", status="unsupported") from None
    digest = hashlib.sha256(dockerfile.encode()).hexdigest()[:12]
    tag = f"evolvekit-harbor/{task['id'].lower()}:{task['digest']}-{digest}"
    with _IMAGE_LOCK:
        if tag in _IMAGES:
            return tag
        try:
            client.images.get(tag)
        except Exception:  # noqa: BLE001 - not built yet
            _build(task, client, dockerfile, tag)
        _IMAGES[tag] = tag
        return tag


def _build(task: dict, client: Any, dockerfile: str, tag: str) -> None:
    """``docker build`` of environment/ with ``dockerfile`` (sent inside the context, never written
    into the task folder), on the build network; a failed build leaves no container behind."""
    from evolve.worlds.harbor.environment.outcome import EnvironmentError_, tail

    network = build_network(client, task.get("build_network") or "auto", task.get("id", ""))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "Dockerfile"
        path.write_text(dockerfile)
        try:
            client.images.build(
                path=str(Path(task["path"]) / "environment"),
                dockerfile=str(path),
                tag=tag,
                rm=True,
                forcerm=True,
                labels=labels(),
                network_mode=network,
                timeout=int(task["build_timeout"]),
            )
        except Exception as e:  # noqa: BLE001 - a failed build: the task's environment is broken
            why = f"docker build of environment/ failed: {type(e).__name__}: {tail(str(e), 800)}"
            raise EnvironmentError_(task, why + (f". Note: {OFFLINE_BUILD}" if network == "none" else "")) from None


def _check_context(task: dict) -> None:
    """The SDK tars environment/ without following links, but reads .dockerignore by its path."""
    from evolve.sandbox.beneath import Refused, kind
    from evolve.worlds.harbor.environment.outcome import EnvironmentError_

    try:
        k = kind(task["path"], "environment/.dockerignore")
    except Refused as e:
        k = str(e)
    if k not in (None, "file"):
        raise EnvironmentError_(
            task,
            "environment/.dockerignore is not a regular file; the host reads a task's files without following links",
        )


__all__ = [
    "BUILD_NETWORKS",
    "BuildfileError",
    "OFFLINE_BUILD",
    "build_network",
    "check_build_network",
    "labels",
    "rewrite",
    "task_image",
]
