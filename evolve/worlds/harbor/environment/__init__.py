"""A Harbor task's environment, where the agent's commands and then the task's tests run.

Two backends, one interface (:class:`~.base.Environment`): ``run`` (a command in the episode's
persistent shell), ``exec``/``sh`` (a one-shot command, as a user), ``verify``/``solve``/``start_step``
(the verifier, the oracle and a step's start, as Harbor runs them: :mod:`.phases`, the same for both
through :class:`~.base.PhasedEnvironment`), ``close``; and the file operations those use
(``reset``, ``upload``, ``executable``, ``fetch``).

* ``docker`` — the task's Dockerfile built by the engine (once per task content, :mod:`.build`),
  one container per episode with memory, CPU and pids limits and the network its
  ``network_mode`` asks for, as the task's users; one real shell per episode (:mod:`.docker`,
  :mod:`.docker_shell`);
* ``sandbox`` — no container engine needed: a bubblewrap workspace (:mod:`evolve.sandbox.shell`)
  holding the files the task's Dockerfile copies, with its ``RUN`` lines carried out over them
  (:mod:`.dockerfile`), the host's /usr standing in for the image; no network, one user, the
  working directory and exports kept between commands but not /tmp or background processes
  (:mod:`.sandbox`).

``auto`` (the default) takes docker when an engine answers, else the sandbox (:func:`resolve_backend`,
the one place that decides). The score is
Harbor's: ``/logs/verifier/reward.json`` (every key a component; its ``reward`` key, else its only
value, is the score) else ``/logs/verifier/reward.txt``; no reward file, a test script that does
not finish, a reward that is not a number (or not a regular file: a link is never followed), or an
environment that cannot be built is the world failing (:class:`~evolve.errors.InfraError`,
category ``environment``, with the exception type Harbor's trial result would record: :mod:`.outcome`),
never a score. The host variables a task was allowed are read when its environment opens, and their
values masked in all it answers (:mod:`.hostenv`).

Nothing a task or an agent writes reaches the host. The sandbox backend touches the task folder
and the workspace only through :mod:`evolve.sandbox.beneath` (each path walked from a folder held
open, no link followed, what it makes given to the sandbox's uid through its own descriptor); a
Dockerfile it cannot carry out that way (a COPY through a link, a RUN that fails in the sandbox)
is refused as ``unsupported``, naming the docker backend. The docker backend sends files in as
tars that keep links as links and takes files out through the engine's API (``get_archive``).

The room, each module depending only on those above it (and on :mod:`evolve.worlds.harbor.task`):

* ``outcome`` — the environment failing (``EnvironmentError_``) and the tests' verdict (Harbor's
  reward files, a multi-step task's aggregate); ``hostenv`` — the allowed host variables read, and
  masked; ``phases`` — the verifier, the oracle and a step's start as Harbor runs them; ``base`` —
  the interface and the phases both backends share;
* ``build`` — a task's image built by the engine; ``docker_shell`` — the episode's persistent shell
  in a container; ``docker`` — the docker backend; ``dockerfile`` — the Dockerfile subset the sandbox
  carries out; ``sandbox`` — the sandbox backend;
* this package — which backend, and :func:`open_environment`.
"""

from __future__ import annotations

import os

from evolve.errors import ConfigError
from evolve.worlds.harbor.environment.base import Environment
from evolve.worlds.harbor.environment.docker import DockerEnvironment, docker_client
from evolve.worlds.harbor.environment.outcome import EnvironmentError_, parse_reward
from evolve.worlds.harbor.environment.sandbox import SandboxEnvironment

BACKENDS = ("auto", "sandbox", "docker")


def check_backend(name: str) -> str:
    if name not in BACKENDS:
        from evolve.registry import did_you_mean

        raise ConfigError(
            f"environment {name!r} is not a backend ({did_you_mean(name, list(BACKENDS))})",
            path="dataset.params.environment",
        )
    return name


def resolve_backend(name: str) -> str:
    """The backend ``name`` (``auto`` | ``sandbox`` | ``docker``) runs on here: ``auto`` is docker
    when an engine answers (and ``$EVOLVE_HARBOR_BACKEND`` is not ``sandbox``), else the sandbox."""
    check_backend(name)
    if name != "auto":
        return name
    if os.environ.get("EVOLVE_HARBOR_BACKEND") != "sandbox" and docker_client(timeout=2) is not None:
        return "docker"
    return "sandbox"


def open_environment(task: dict, backend: str = "auto") -> Environment:
    """A fresh environment for one episode of ``task`` on ``backend`` (see the module docstring); the
    values of the host variables the user allowed it are masked in all it answers (:mod:`.hostenv`)."""
    from evolve.worlds.harbor.environment.hostenv import MaskedEnvironment, secrets

    hidden = secrets(task)
    env = _open(task, backend)
    return MaskedEnvironment(env, hidden) if hidden else env


def _open(task: dict, backend: str) -> Environment:
    if resolve_backend(backend) == "docker":
        return DockerEnvironment(task)
    from evolve.sandbox import SandboxUnavailable

    try:
        return SandboxEnvironment(task)
    except (SandboxUnavailable, EnvironmentError_):
        raise
    except (OSError, ValueError) as e:  # what the task's files made impossible, named, never a traceback
        raise EnvironmentError_(task, f"the sandbox environment could not be made: {type(e).__name__}: {e}") from None


__all__ = [
    "BACKENDS",
    "DockerEnvironment",
    "Environment",
    "EnvironmentError_",
    "SandboxEnvironment",
    "check_backend",
    "docker_client",
    "open_environment",
    "parse_reward",
    "resolve_backend",
]
