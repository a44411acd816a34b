"""A Harbor task folder as the harbor world reads it: the task format, apart from where it runs
(:mod:`evolve.worlds.harbor.environment`).

The room, each module depending only on those above it:

* ``hostenv`` — which of the host's environment variables a task's ``${VAR}`` may read (the user
  allows each by name);
* ``sections`` — task.toml's sections by Harbor's rules (users, env tables, network policies, the
  verifier's environment, steps' healthchecks; what is refused by name);
* ``load`` — reading one task folder strictly (``task.toml`` keys, timeouts, named errors, steps),
  never through a link: :func:`load_task`, :func:`find_tasks`.
"""

from __future__ import annotations

from evolve.worlds.harbor.task.load import KNOWN, TaskError, UnsupportedTask, digest, find_tasks, load_task

__all__ = ["KNOWN", "TaskError", "UnsupportedTask", "digest", "find_tasks", "load_task"]
