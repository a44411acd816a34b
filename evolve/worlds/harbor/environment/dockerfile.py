"""The part of a task's Dockerfile that the sandbox backend carries out without a container engine.

``FROM`` names an image the sandbox does not have: the host's own /usr stands in for it (so a task
that needs packages the image installs needs the docker backend). ``WORKDIR``, ``COPY``/``ADD`` of
files from the build context, ``ENV`` and ``ARG`` defaults are applied; ``RUN`` runs in the sandbox
over the workspace, with no network and the build timeout; ``USER``, ``CMD``, ``ENTRYPOINT``,
``EXPOSE``, ``LABEL``, ``VOLUME``, ``HEALTHCHECK``, ``SHELL``, ``STOPSIGNAL`` and ``ONBUILD``
change nothing for a shell agent and are skipped. A multi-stage build (a second ``FROM``), ``ADD``
of a URL and ``COPY --from`` need a real build: :class:`DockerfileError` says so.
"""

from __future__ import annotations

import json
import posixpath
import re
import shlex
from dataclasses import dataclass, field

SKIPPED = {
    "USER",
    "CMD",
    "ENTRYPOINT",
    "EXPOSE",
    "LABEL",
    "VOLUME",
    "HEALTHCHECK",
    "SHELL",
    "STOPSIGNAL",
    "ONBUILD",
    "MAINTAINER",
}


class DockerfileError(ValueError):
    """A Dockerfile the sandbox backend cannot carry out; the message says which line and why."""


@dataclass
class Step:
    kind: str  # "copy" | "run"
    workdir: str
    env: dict[str, str]
    sources: list[str] = field(default_factory=list)  # copy: paths in the build context
    dest: str = ""  # copy: absolute destination
    command: str = ""  # run
    line: int = 0


@dataclass
class Plan:
    base: str | None
    workdir: str
    env: dict[str, str]
    steps: list[Step]
    dirs: list[str]  # every WORKDIR (created, as Docker does)


def _lines(text: str) -> list[tuple[int, str]]:
    out, buf, start = [], "", 0
    for i, raw in enumerate(text.splitlines(), 1):
        line = raw.rstrip()
        if not buf and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if buf and line.lstrip().startswith("#"):
            continue
        if not buf:
            start = i
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        out.append((start, buf.strip()))
        buf = ""
    if buf.strip():
        out.append((start, buf.strip()))
    return out


def _subst(text: str, env: dict[str, str]) -> str:
    return re.sub(
        r"\$\{(\w+)(?::-([^}]*))?\}|\$(\w+)",
        lambda m: env.get(m.group(1) or m.group(3), m.group(2) or "") if (m.group(1) or m.group(3)) else m.group(0),
        text,
    )


def _args(rest: str) -> list[str]:
    rest = rest.strip()
    if rest.startswith("["):
        try:
            value = json.loads(rest)
        except json.JSONDecodeError:
            value = None
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return value
    return shlex.split(rest)


def parse(text: str) -> Plan:
    """The plan a Dockerfile stands for (see the module docstring)."""
    base, workdir = None, "/"
    env: dict[str, str] = {}
    args: dict[str, str] = {}
    steps: list[Step] = []
    dirs: list[str] = []
    for no, line in _lines(text):
        word, _, rest = line.partition(" ")
        op = word.upper()
        if op == "FROM":
            if base is not None:
                raise DockerfileError(f"line {no}: a multi-stage build (a second FROM) needs a container engine")
            base = rest.split()[0] if rest.split() else None
        elif op == "ARG":
            name, _, default = rest.strip().partition("=")
            args[name.strip()] = default.strip().strip('"')
        elif op == "ENV":
            parts = shlex.split(rest)
            if parts and "=" not in parts[0]:  # the old "ENV key value" form
                env[parts[0]] = _subst(rest.strip()[len(parts[0]) :].strip().strip('"'), {**args, **env})
            else:
                for p in parts:
                    k, _, v = p.partition("=")
                    env[k] = _subst(v, {**args, **env})
        elif op == "WORKDIR":
            workdir = posixpath.normpath(posixpath.join(workdir, _subst(rest.strip().strip('"'), {**args, **env})))
            dirs.append(workdir)
        elif op in ("COPY", "ADD"):
            words = _args(rest)
            flags = [w for w in words if w.startswith("--")]
            words = [w for w in words if not w.startswith("--")]
            if any(f.startswith("--from") for f in flags):
                raise DockerfileError(f"line {no}: COPY --from needs a container engine (a multi-stage build)")
            if len(words) < 2:
                raise DockerfileError(f"line {no}: {op} needs a source and a destination")
            *sources, dest = (_subst(w, {**args, **env}) for w in words)
            if any(re.match(r"^[a-z]+://", s) for s in sources):
                raise DockerfileError(f"line {no}: {op} of a URL downloads; the sandbox backend has no network")
            dest_abs = posixpath.normpath(posixpath.join(workdir, dest))
            if dest.endswith("/") or len(sources) > 1:
                dest_abs += "/"
            steps.append(Step("copy", workdir, dict(env), sources=sources, dest=dest_abs, line=no))
        elif op == "RUN":
            command = rest.strip()
            if command.startswith("["):
                command = " ".join(shlex.quote(w) for w in _args(command))
            steps.append(Step("run", workdir, dict(env), command=command, line=no))
        elif op in SKIPPED:
            continue
        else:
            raise DockerfileError(f"line {no}: unknown instruction {word!r}")
    if workdir == "/":
        workdir = "/app"  # no WORKDIR: Harbor's own templates work in /app
        dirs.append(workdir)
    return Plan(base, workdir, env, steps, dirs)


def top_dirs(plan: Plan) -> list[str]:
    """The top-level folders the plan writes into (each becomes a workspace mount)."""
    tops = {"/" + p.strip("/").split("/")[0] for p in plan.dirs}
    tops |= {"/" + s.dest.strip("/").split("/")[0] for s in plan.steps if s.kind == "copy" and s.dest.strip("/")}
    return sorted(tops)


__all__ = ["DockerfileError", "Plan", "Step", "parse", "top_dirs"]
