"""Which of the host's environment variables a Harbor task may read, and keeping their values out of
everything stored.

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
MASK = "***"
HOW = "allow it in your task file (dataset.params.allow_env: [{var}]) or on the command line (--allow-env {var})"


def check_names(names: Any, where: str) -> list[str]:
    """``names`` as a sorted list of variable names, or a ConfigError naming ``where``."""
    if names is None:
        return []
    if isinstance(names, str) or not isinstance(names, (list, tuple)):
        raise ConfigError(f"give a list of environment variable names, e.g. [MY_TOKEN], not {names!r}", path=where)
    bad = [n for n in names if not (isinstance(n, str) and _NAME.fullmatch(n))]
    if bad:
        raise ConfigError(f"{bad[0]!r} is not an environment variable name (letters, digits and _, not starting "
                          "with a digit)", path=where)
    return sorted(set(names))


def tables(task: dict) -> Iterable[tuple[str, dict[str, str]]]:
    """``(section, env table)`` of every env table of ``task`` (as :func:`.task.load_task` keeps them)."""
    for key, section in (("environment_env", "[environment]"), ("verifier_env", "[verifier]"),
                         ("solution_env", "[solution]")):
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
    """What :func:`.task.load_task` adds to a task: ``allow_env`` (the allowed variables it reads),
    ``host_env`` (every variable it reads) and notes; ``errors.unsupported`` for a ``${VAR}``
    without a default whose variable is not allowed, or allowed and not set."""
    allowed = set(allowed)
    notes, seen = [], set()
    for r in reads(task):
        var, where = r["var"], f"task.toml: {r['section']} env {r['key']} = {task_value(r)!r}"
        if var not in allowed:
            if r["default"] is None:
                raise errors.unsupported(folder, f"{where} reads the host's environment variable {var}, which a "
                                         f"task gets only when you allow it: {HOW.format(var=var)}")
            if var not in seen:
                notes.append(f"{where}: the host's {var} is not passed to tasks, so its default is used; to pass "
                             f"it, {HOW.format(var=var)}")
        elif r["default"] is None and var not in os.environ:
            raise errors.unsupported(folder, f"{where} takes its value from the host's environment variable {var}, "
                                     f"which is not set here; export {var} before the run (or write "
                                     f"${{{var}:-default}})")
        seen.add(var)
    names = sorted({r["var"] for r in reads(task)})
    return {"allow_env": [n for n in names if n in allowed], "host_env": names, "notes": notes}


def task_value(r: dict) -> str:
    return "${" + r["var"] + ("" if r["default"] is None else ":-" + r["default"]) + "}"


def resolve(task: dict, table: dict[str, str] | None) -> dict[str, str]:
    """``table`` with each ``${VAR}``/``${VAR:-default}`` value read now: from the host only for a
    variable in the task's ``allow_env``, else its default; a ``${VAR}`` with neither is the world
    failing (an :class:`~.outcome.EnvironmentError_`), naming the variable and the setting."""
    allowed = set(task.get("allow_env") or ())
    out = {}
    for key, value in (table or {}).items():
        m = TEMPLATE.fullmatch(value)
        if not m:
            out[key] = value
        elif m.group(1) in allowed and m.group(1) in os.environ:
            out[key] = os.environ[m.group(1)]
        elif m.group(2) is not None:
            out[key] = m.group(2)
        else:
            from evolve.worlds.harbor.outcome import EnvironmentError_

            var = m.group(1)
            why = (f"the host's environment variable {var} is not set in this process; export it before the run"
                   if var in allowed else f"the host's environment variable {var} is not passed to tasks; "
                   + HOW.format(var=var))
            raise EnvironmentError_(task, f"env {key} = {value!r}: {why}", kind="ValueError")
    return out


def secrets(task: dict) -> list[str]:
    """The values now in the host's environment of the allowed variables the task reads, longest
    first (so a value holding another is masked whole)."""
    values = {os.environ.get(v, "") for v in task.get("allow_env") or ()}
    return sorted((v for v in values if v), key=len, reverse=True)


def mask(value: Any, hidden: list[str]) -> Any:
    """``value`` (a string, or lists and dicts of them) with each of ``hidden`` replaced by ``***``."""
    if not hidden:
        return value
    if isinstance(value, str):
        for h in hidden:
            value = value.replace(h, MASK)
        return value
    if isinstance(value, list):
        return [mask(v, hidden) for v in value]
    if isinstance(value, dict):
        return {k: mask(v, hidden) for k, v in value.items()}
    return value


class MaskedEnvironment:
    """An environment (:class:`.environment.Environment`) whose answers have the task's secrets
    masked: command results, the verifier's verdict, ``solve.sh``'s output and every
    :class:`~.outcome.EnvironmentError_` it raises. The rest is the environment's own."""

    def __init__(self, env: Any, hidden: list[str]) -> None:
        self._env, self._hidden = env, hidden

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        from evolve.worlds.harbor.outcome import EnvironmentError_

        try:
            return getattr(self._env, name)(*args, **kwargs)
        except EnvironmentError_ as e:
            raise EnvironmentError_({"id": e.task_id}, mask(e.reason, self._hidden), status=e.status,
                                    kind=e.kind) from None

    def _result(self, r: Any) -> Any:
        for attr in ("stdout", "stderr"):
            if isinstance(getattr(r, attr, None), str):
                try:
                    setattr(r, attr, mask(getattr(r, attr), self._hidden))
                except AttributeError:  # a frozen result: a copy with them masked
                    import dataclasses

                    r = dataclasses.replace(r, **{attr: mask(getattr(r, attr), self._hidden)})
        return r

    def run(self, *args: Any, **kwargs: Any) -> Any:
        return self._result(self._call("run", *args, **kwargs))

    def exec(self, *args: Any, **kwargs: Any) -> Any:
        return self._result(self._call("exec", *args, **kwargs))

    def sh(self, *args: Any, **kwargs: Any) -> Any:
        return self._result(self._call("sh", *args, **kwargs))

    def solve(self, *args: Any, **kwargs: Any) -> Any:
        return self._result(self._call("solve", *args, **kwargs))

    def verify(self, *args: Any, **kwargs: Any) -> dict:
        return mask(self._call("verify", *args, **kwargs), self._hidden)

    def start_step(self, *args: Any, **kwargs: Any) -> dict | None:
        return mask(self._call("start_step", *args, **kwargs), self._hidden)


__all__ = ["MASK", "MaskedEnvironment", "admit", "check_names", "mask", "reads", "resolve", "secrets", "tables"]
