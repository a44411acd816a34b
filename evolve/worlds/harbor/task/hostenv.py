"""Which of the host's environment variables a Harbor task may read (decided when it is loaded);
reading them and keeping their values out of everything stored is the environment's
(:mod:`evolve.worlds.harbor.environment.hostenv`).

A task's ``env`` tables (``[environment]``, ``[verifier]``, ``[solution]``, a step's
``[steps.verifier]``) may hold ``${VAR}`` or ``${VAR:-default}`` (Harbor's templates). The host's
environment holds the user's keys (``OPENAI_API_KEY``, cloud credentials), and a task is someone
else's code: its ``test.sh`` could print a value into the feedback the archive stores and the
reflective operators read. So a task reads a host variable only when the user allowed that name:

    dataset:
      params: {allow_env: [EVOLVEKIT_GREETING_NAME]}     # the user's task file
    evolve harbor check --allow-env EVOLVEKIT_GREETING_NAME path/to/tasks

* a variable not allowed is never read: ``${VAR:-default}`` takes its default (a note on the task
  says which variable it wanted and how to allow it), and ``${VAR}`` leaves the task out
  (*unsupported*), naming the variable and the setting; an allowed ``${VAR}`` whose variable is not
  set leaves it out too;
* the values of the allowed variables a task reads are masked (``***``) in what its environment
  gives back (command output, the tests' output and feedback, ``solve.sh``'s output, every error
  message), so they reach no trajectory, archive, log or report, as CI systems mask secrets. Like
  theirs, the mask is of the literal value: a task that transforms it (base64) is not caught, so
  allow only what you would hand the task's author;
* ``evolve harbor check`` lists the host variables each task reads, and whether each was allowed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from evolve.errors import ConfigError

TEMPLATE = re.compile(r"\$\{([^}:]+)(?::-(.*))?\}")  # Harbor's: the whole value, ${VAR} or ${VAR:-default}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HOW = "allow it in your task file (dataset.params.allow_env: [{var}]) or on the command line (--allow-env {var})"


def check_names(names: Any, where: str) -> list[str]:
    """``names`` as a sorted list of variable names, or a ConfigError naming ``where``."""
    if names is None:
        return []
    if isinstance(names, str) or not isinstance(names, (list, tuple)):
        raise ConfigError(f"give a list of environment variable names, e.g. [MY_TOKEN], not {names!r}", path=where)
    bad = [n for n in names if not (isinstance(n, str) and _NAME.fullmatch(n))]
    if bad:
        raise ConfigError(
            f"{bad[0]!r} is not an environment variable name (letters, digits and _, not starting with a digit)",
            path=where,
        )
    return sorted(set(names))


def tables(task: dict) -> Iterable[tuple[str, dict[str, str]]]:
    """``(section, env table)`` of every env table of ``task`` (as :func:`.load.load_task` keeps them)."""
    for key, section in (
        ("environment_env", "[environment]"),
        ("verifier_env", "[verifier]"),
        ("solution_env", "[solution]"),
    ):
        yield section, task.get(key) or {}
    for step in task.get("steps") or []:
        yield f"[[steps]] {step['name']!r} verifier", step.get("verifier_env") or {}


def reads(task: dict) -> list[dict[str, Any]]:
    """Each ``${VAR}`` of the task: ``{"section", "key", "var", "default"}`` (default None: none)."""
    out = []
    for section, table in tables(task):
        for key, value in table.items():
            m = TEMPLATE.fullmatch(value)
            if m:
                out.append({"section": section, "key": key, "var": m.group(1), "default": m.group(2)})
    return out


def admit(task: dict, folder: Path, allowed: Iterable[str], errors: Any) -> dict[str, Any]:
    """What :func:`.load.load_task` adds to a task: ``allow_env`` (the allowed variables it reads),
    ``host_env`` (every variable it reads) and notes; ``errors.unsupported`` for a ``${VAR}``
    without a default whose variable is not allowed, or allowed and not set."""
    allowed = set(allowed)
    notes, seen = [], set()
    for r in reads(task):
        var, where = r["var"], f"task.toml: {r['section']} env {r['key']} = {task_value(r)!r}"
        if var not in allowed:
            if r["default"] is None:
                raise errors.unsupported(
                    folder,
                    f"{where} reads the host's environment variable {var}, which a "
                    f"task gets only when you allow it: {HOW.format(var=var)}",
                )
            if var not in seen:
                notes.append(
                    f"{where}: the host's {var} is not passed to tasks, so its default is used; to pass "
                    f"it, {HOW.format(var=var)}"
                )
        elif r["default"] is None and var not in os.environ:
            raise errors.unsupported(
                folder,
                f"{where} takes its value from the host's environment variable {var}, "
                f"which is not set here; export {var} before the run (or write "
                f"${{{var}:-default}})",
            )
        seen.add(var)
    names = sorted({r["var"] for r in reads(task)})
    return {"allow_env": [n for n in names if n in allowed], "host_env": names, "notes": notes}


def task_value(r: dict) -> str:
    return "${" + r["var"] + ("" if r["default"] is None else ":-" + r["default"]) + "}"


__all__ = ["HOW", "TEMPLATE", "admit", "check_names", "reads", "tables", "task_value"]
