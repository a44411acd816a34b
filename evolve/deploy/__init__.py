"""Promotion you can trust: what happens between "the engine found a better system" and "users are
served it". Configured by the task file's ``deploy:`` section; driven by ``evolve promote``,
``evolve rollback`` and ``evolve status`` (or the same functions here).

* :mod:`~evolve.task.deploy` — the ``deploy:`` section (regression gate, guards, canary, approval), with the
  rest of the task file's schema;
* :mod:`~evolve.deploy.lifecycle` — proposed → gated → canary → pending → active → retired /
  rejected / rolled back, each move an audit event, moved atomically with the current pointer;
* :mod:`~evolve.deploy.pins` — the evaluation pinned: the code the reward and agent run and the files
  they read, by content (installed copies of packages by version), run from source during a gate;
* :mod:`~evolve.deploy.reads` — files a gate read that the pins did not hold, refused until a person
  accepts each (``evolve promote --accept-read``);
* :mod:`~evolve.deploy.integrity` — candidates that reach the reward's code or files, address the
  evaluator or carry a gate's answers, refused;
* :mod:`~evolve.deploy.gates` — the gate split held out from selection, the paired no-worse-than-active
  test and the guarded floors and ceilings;
* :mod:`~evolve.deploy.canary` — the gateway's share of new sessions and the anytime-valid test on feedback;
* :mod:`~evolve.deploy.gateway` — ``evolve gateway``'s composition root (:class:`GatewayServer`): a config to routes that follow deployments;
* :mod:`~evolve.deploy.manage` — ``promote``, ``approve``, ``rollback``, ``status``;
* :mod:`~evolve.deploy.cli` — the commands.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name in ("promote", "approve", "rollback", "status"):
        from evolve.deploy import manage

        return getattr(manage, name)
    if name == "accept_reads":
        from evolve.deploy import reads

        return reads.accept_reads
    if name in ("Deployment", "Move", "DeployError"):
        from evolve.deploy import lifecycle

        return getattr(lifecycle, name)
    raise AttributeError(name)


__all__ = ["DeployError", "Deployment", "Move", "accept_reads", "approve", "promote", "rollback", "status"]
