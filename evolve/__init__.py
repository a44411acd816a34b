"""evolvekit: make an agent system better from its own experience.

A system Π = (workflow Γ, models ψ, context C, tools W) is run on tasks; its trajectories τ
and rewards r feed operators that propose better versions; the archive keeps every version
with its lineage and scores, and can roll back to any of them.

``import evolve`` is cheap, silent and offline: every name below is imported on first use,
and heavy parts (torch, transformers, peft, litellm, ...) only where they are used.

The core (this folder; the layers are ``evolve.policy``, ``.memory``, ``.prompts``, ``.toolforge``,
``.topology``, ``.sandbox``, and the worlds ``evolve.worlds``) stands in floors, lowest first; a module
imports only its own floor and those below (``tests/test_structure.py`` holds it, from the same list):

* foundations — ``types`` (System, Trajectory, Reward, Candidate), ``errors`` (the one tree),
  ``failures`` (the world failing under a rollout, told from the agent failing), ``registry``
  (every name → import path), ``artifacts`` (content-addressed files), ``otel``, ``world`` (the
  World protocol a task file's ``world:`` names); ``archive/`` (SQLite, append-only), ``llm/`` (backends);
* ``task/`` — the task file: ``config`` (the schema), ``deploy`` (its ``deploy:`` section),
  ``taskfile`` (reading, overrides, checks), ``data`` (splits), ``reference``, ``fingerprint``
  (what a resume must match), ``content``;
* ``gateway/`` — the HTTP engine: an unmodified agent's traffic recorded, the evolved system
  served, and each rollout's own OpenAI endpoint;
* rollouts — ``rollout`` (the agent contract: ``RolloutContext``, ``run_agent``, ``score``),
  ``runners/`` (thread, process, Ray), ``cluster/`` (Ray's model servers and training);
* ``scoring/`` — ``session`` (splits, runner, memoised rollouts), ``retry`` (the world failing is
  retried, never scored), ``budget``, ``estimate`` (the dry run), ``recorder``, ``state``,
  ``rundir``, ``bootstrap``, ``holdout``, ``progress`` (the terminal's display);
* ``results/`` — ``report`` (report.json/.md), ``stats`` (paired tests); ``reflexion/`` (Reflexion mode);
* ``deploy/`` — promotion: gates, canary, approval, rollback; ``evolve gateway``'s composition root;
* ``trackers/`` — MLflow, W&B, OpenTelemetry;
* ``loop/`` — ``engine`` (generations), ``strategies`` (acceptance, minibatch, stopping), ``acceptance``,
  ``selectors``, ``pool``, ``pareto``, ``operators`` (the protocol);
* surfaces — ``api`` (``evolve.run``, ``evolve.load``), ``ui/``, ``mcp/``; ``serve/`` is a deprecated alias of
  serving names now in ``gateway/``;
* ``cli/`` — the command line.

Each package's ``__init__`` says what it holds. ``scoring.rollout``, ``scoring.failures``,
``deploy.config`` and ``worlds.base`` are deprecated aliases of the modules' new homes.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    # running
    "run": ("evolve.api", "run_task"),
    "load": ("evolve.api", "load"),
    "evaluate": ("evolve.api", "evaluate"),
    "dry_run": ("evolve.api", "dry_run"),
    # deploying (evolve.deploy)
    "promote": ("evolve.deploy.manage", "promote"),
    "approve": ("evolve.deploy.manage", "approve"),
    "rollback": ("evolve.deploy.manage", "rollback"),
    "deploy_status": ("evolve.deploy.manage", "status"),
    "LoadedSystem": ("evolve.api", "LoadedSystem"),
    "RunReport": ("evolve.results.report", "RunReport"),
    "Engine": ("evolve.loop.engine", "Engine"),
    "Session": ("evolve.scoring.session", "Session"),
    "Archive": ("evolve.archive", "Archive"),
    "load_task": ("evolve.task.taskfile", "load_task"),
    "TaskConfig": ("evolve.task.config", "TaskConfig"),
    # the data model
    "System": ("evolve.types", "System"),
    "ModelSpec": ("evolve.types", "ModelSpec"),
    "Trajectory": ("evolve.types", "Trajectory"),
    "Reward": ("evolve.types", "Reward"),
    "Candidate": ("evolve.types", "Candidate"),
    "Message": ("evolve.types", "Message"),
    # the protocols a user implements (docs/extending.md)
    "Operator": ("evolve.loop.operators", "Operator"),
    "OperatorContext": ("evolve.loop.operators", "OperatorContext"),
    "Selector": ("evolve.loop.selectors", "Selector"),
    "Scored": ("evolve.loop.selectors", "Scored"),
    "Runner": ("evolve.runners", "Runner"),
    "RolloutJob": ("evolve.runners", "RolloutJob"),
    "WorkerSpec": ("evolve.runners", "WorkerSpec"),
    "LLM": ("evolve.llm.base", "LLM"),
    "Completion": ("evolve.llm.base", "Completion"),
    "World": ("evolve.world", "World"),
    "Acceptance": ("evolve.loop.strategies", "Acceptance"),
    "MinibatchSampler": ("evolve.loop.strategies", "MinibatchSampler"),
    "Stopping": ("evolve.loop.strategies", "Stopping"),
    "Verdict": ("evolve.loop.acceptance", "Verdict"),
    "NodeType": ("evolve.topology.base", "NodeType"),
    "MemoryCurator": ("evolve.memory.base", "Curator"),
    "Sandbox": ("evolve.sandbox.base", "Sandbox"),
    # errors
    "EvolveError": ("evolve.errors", "EvolveError"),
    "UserError": ("evolve.errors", "UserError"),
    "InfraError": ("evolve.errors", "InfraError"),
    "RunFailed": ("evolve.errors", "RunFailed"),
    "ScriptedLM": ("evolve.llm.fake", "ScriptedLM"),
}

# names renamed since (still resolved, with a DeprecationWarning; not in __all__)
_DEPRECATED = {"MemoryPolicy": "MemoryCurator"}

__all__ = sorted(_LAZY) + ["__version__"]  # noqa: PLE0605 - the lazy table above is the one list


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:
        import warnings

        warnings.warn(
            f"evolve.{name} is deprecated: it is evolve.{_DEPRECATED[name]}", DeprecationWarning, stacklevel=2
        )
        return __getattr__(_DEPRECATED[name])
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'evolve' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
