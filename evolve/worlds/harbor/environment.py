"""A Harbor task's environment, where the agent's commands and then the task's tests run.

Two backends, one interface (:class:`Environment`): ``run`` (a command in the episode's persistent
shell), ``exec``/``sh`` (a one-shot command, as a user), ``verify``/``solve``/``start_step`` (the
verifier, the oracle and a step's start, as Harbor runs them: :mod:`.phases`), ``close``; and the
file operations those use (``reset``, ``upload``, ``executable``, ``fetch``).

* ``docker`` — the task's Dockerfile built by the engine (once per task content), one container
  per episode with memory, CPU and pids limits and the network its ``network_mode`` asks for, as
  the task's users; one real shell per episode (:mod:`.docker_env`, :mod:`.docker_shell`);
* ``sandbox`` — no container engine needed: a bubblewrap workspace (:mod:`evolve.sandbox.shell`)
  holding the files the task's Dockerfile copies, with its ``RUN`` lines carried out over them
  (:mod:`.dockerfile`), the host's /usr standing in for the image; no network, one user, the
  working directory and exports kept between commands but not /tmp or background processes
  (:mod:`.sandbox_env`).

``auto`` (the default) takes docker when an engine answers, else the sandbox. The score is
Harbor's: ``/logs/verifier/reward.json`` (every key a component; its ``reward`` key, else its only
value, is the score) else ``/logs/verifier/reward.txt``; no reward file, a test script that does
not finish, a reward that is not a number (or not a regular file: a link is never followed), or an
environment that cannot be built is the world failing (:class:`~evolve.errors.InfraError`,
category ``environment``, with the exception type Harbor's trial result would record), never a
score.

Nothing a task or an agent writes reaches the host. The sandbox backend touches the task folder
and the workspace only through :mod:`evolve.sandbox.beneath` (each path walked from a folder held
open, no link followed, what it makes given to the sandbox's uid through its own descriptor); a
Dockerfile it cannot carry out that way (a COPY through a link, a RUN that fails in the sandbox)
is refused as ``unsupported``, naming the docker backend. The docker backend sends files in as
tars that keep links as links and takes files out through the engine's API (``get_archive``).
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from evolve.errors import ConfigError
from evolve.worlds.harbor.docker_env import DockerEnvironment, docker_client
from evolve.worlds.harbor.outcome import EnvironmentError_, parse_reward
from evolve.worlds.harbor.sandbox_env import SandboxEnvironment

BACKENDS = ("auto", "sandbox", "docker")


class Environment(Protocol):
    backend: str
    workdir: str
    task: dict

    def run(self, command: str, *, timeout: float | None, user: str | None = None) -> Any: ...
    def exec(self, command: str, *, timeout: float | None, env: dict | None = None) -> Any: ...
    def sh(self, command: str, *, timeout: float | None, env: dict | None = None, cwd: str | None = None,
           user: str | None = None) -> Any: ...
    def verify(self, step: dict | None = None) -> dict: ...
    def solve(self, step: dict | None = None) -> Any: ...
    def start_step(self, step: dict, first: bool) -> dict | None: ...
    def reset(self, paths: list[str]) -> None: ...
    def upload(self, folder: str, inside: str, *, replace: bool = True, kind: str = "RuntimeError") -> None: ...
    def executable(self, inside: str) -> None: ...
    def fetch(self, inside: str, *, limit: int | None = None, tail_bytes: int | None = None) -> bytes | None: ...
    def close(self) -> None: ...


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        from evolve.registry import did_you_mean

        raise ConfigError(f"environment {name!r} is not a backend ({did_you_mean(name, list(BACKENDS))})",
                          path="dataset.params.environment")
    return name


def open_environment(task: dict, backend: str = "auto") -> Environment:
    """A fresh environment for one episode of ``task`` on ``backend`` (see the module docstring); the
    values of the host variables the user allowed it are masked in all it answers (:mod:`.hostenv`)."""
    from evolve.worlds.harbor.hostenv import MaskedEnvironment, secrets

    hidden = secrets(task)
    env = _open(task, backend)
    return MaskedEnvironment(env, hidden) if hidden else env


def _open(task: dict, backend: str) -> Environment:
    check_backend(backend)
    if backend == "docker" or (backend == "auto" and os.environ.get("EVOLVE_HARBOR_BACKEND") != "sandbox"
                               and docker_client(timeout=2) is not None):
        return DockerEnvironment(task)
    from evolve.sandbox import SandboxUnavailable

    try:
        return SandboxEnvironment(task)
    except (SandboxUnavailable, EnvironmentError_):
        raise
    except (OSError, ValueError) as e:  # what the task's files made impossible, named, never a traceback
        raise EnvironmentError_(task, f"the sandbox environment could not be made: {type(e).__name__}: {e}") from None


__all__ = ["BACKENDS", "DockerEnvironment", "Environment", "EnvironmentError_", "SandboxEnvironment", "docker_client",
           "open_environment", "parse_reward"]
