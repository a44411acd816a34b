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
* **The build's network**: ``host`` where the engine has no ``bridge`` network (one started with
  ``--bridge=none``, as on the development machine, where builds reach the package registries only
  through the host), else the engine's default; ``dataset.params.build_network`` sets it.

The rewritten Dockerfile is sent inside the build context (never written into the task folder), and
a failed build removes its intermediate containers (``forcerm``).
"""

from __future__ import annotations

import base64
import json
import re
import shlex
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
            flags = re.match(r"((?:--\S+\s+)*)", rest).group(1)  # e.g. --mount=...: kept as they are
            cmd = rest[len(flags):]
            bare = _HEREDOC.sub("", cmd).strip() == ""
            if bare and len(bodies) == 1:  # the body is the script, as BuildKit runs it
                body = bodies[0]
                out.append(_script_line(body, shell, executable=body.startswith("#!")).replace(
                    "RUN ", f"RUN {flags}", 1))
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
                raise BuildfileError(f"Dockerfile line {i + 1}: {word} with a heredoc "
                                     f"{'and ' + ' '.join(bad) if bad else 'needs one destination'} is not built here")
            dest = dests[0]
            script = []
            for body, (_d, quote, w) in zip(bodies, marks):
                target = dest if len(marks) == 1 and not dest.endswith("/") else f"{dest.rstrip('/')}/{w}"
                q = "'" if quote else ""
                script.append(f'mkdir -p "$(dirname {shlex.quote(target)})"')
                script.append(f"cat > {shlex.quote(target)} <<{q}{w}{q}\n{body}{w}")
                for o in opts:
                    name, _, value = o.partition("=")
                    script.append(f"{'chmod' if name == '--chmod' else 'chown'} {shlex.quote(value)} "
                                  f"{shlex.quote(target)}")
            out.append(_script_line("\n".join(script) + "\n", shell))
        i = nxt
    return "\n".join(out) + "\n"


def build_network(client: Any, wanted: str = "auto") -> str | None:
    """The network a build uses: ``wanted`` unless ``auto``; then ``host`` where the engine has no
    ``bridge`` network, else None (the engine's default)."""
    if wanted != "auto":
        return wanted
    try:
        names = {n.name for n in client.networks.list()}
    except Exception:  # noqa: BLE001 - an engine that will not say: its default
        return None
    return None if "bridge" in names else "host"


__all__ = ["BuildfileError", "build_network", "rewrite"]
