"""The host's environment variables a Harbor task was allowed (:mod:`evolve.worlds.harbor.task.hostenv`)
read when its environment is opened, and their values kept out of everything stored: masked
(``***``) in what the environment gives back (command output, the tests' output and feedback,
``solve.sh``'s output, every error message), so they reach no trajectory, archive, log or report,
as CI systems mask secrets. Like theirs, the mask is of the literal value: a task that transforms it
(base64) is not caught."""

from __future__ import annotations

import os
from typing import Any

from evolve.worlds.harbor.environment.outcome import EnvironmentError_
from evolve.worlds.harbor.task.hostenv import HOW, TEMPLATE

MASK = "***"


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
            var = m.group(1)
            why = (
                f"the host's environment variable {var} is not set in this process; export it before the run"
                if var in allowed
                else f"the host's environment variable {var} is not passed to tasks; " + HOW.format(var=var)
            )
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
    """An environment (:class:`.base.Environment`) whose answers have the task's secrets
    masked: command results, the verifier's verdict, ``solve.sh``'s output and every
    :class:`~.outcome.EnvironmentError_` it raises. The rest is the environment's own."""

    def __init__(self, env: Any, hidden: list[str]) -> None:
        self._env, self._hidden = env, hidden

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        try:
            return getattr(self._env, name)(*args, **kwargs)
        except EnvironmentError_ as e:
            raise EnvironmentError_(
                {"id": e.task_id}, mask(e.reason, self._hidden), status=e.status, kind=e.kind
            ) from None

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


__all__ = ["MASK", "MaskedEnvironment", "mask", "resolve", "secrets"]
