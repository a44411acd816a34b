"""evolvekit: make an agent system better from its own experience.

A system Π = (workflow Γ, models ψ, context C, tools W) is run on tasks; its trajectories τ
and rewards r feed operators that propose better versions; the archive keeps every version
with its lineage and scores, and can roll back to any of them.

``import evolve`` is cheap, silent and offline: every name below is imported on first use,
and heavy parts (torch, transformers, peft, litellm, ...) only where they are used.

The core (this folder; the layers are ``evolve.policy``, ``.memory``, ``.prompts``, ``.toolforge``,
``.topology``, ``.sandbox``, and the worlds ``evolve.worlds``):

* the data model — ``types`` (System, Trajectory, Reward, Candidate), ``errors`` (the one tree),
  ``artifacts`` (content-addressed files);
* the task file — ``config`` (the schema), ``taskfile`` (reading, overrides, a world's defaults,
  checks), ``reference`` (the generated reference), ``fingerprint`` (what a resume must match),
  ``data`` (splits from a generator or JSONL);
* one rollout — ``rollout`` (the agent's context, recording, scoring), ``failures`` (the agent's
  failure or the world's), ``runners/`` (thread, process), ``retry`` (the world failing, retried),
  ``llm/`` (backends, params, the model cache);
* scoring — ``session`` (splits, runner, memoised rollouts, the ledger), ``budget``, ``recorder``
  (writing a batch down), ``state`` (the run state, typed), ``rundir`` (a run directory's life),
  ``bootstrap`` (the starting system);
* the loop — ``engine`` (generations), ``loop`` (acceptance, minibatch, stopping), ``judge`` (two
  stages), ``selectors`` and ``pool`` (parents), ``pareto``, ``operators`` (the protocol),
  ``registry`` (every name → import path);
* results — ``archive/`` (SQLite, append-only), ``report`` (report.json/.md), ``stats`` (paired
  tests), ``estimate`` (the dry run);
* deploying — ``deploy/`` (the lifecycle, gates, pinned evaluation, the canary; ``evolve.promote``,
  ``evolve.rollback``), ``gateway/`` (the one OpenAI-compatible server: an unmodified agent's traffic
  recorded, the evolved system served, ``evolve serve``, each rollout's own endpoint);
* surfaces — ``api`` (``evolve.run``, ``evolve.load``), ``cli`` and ``archive_cli``, ``serve``
  (the serving names, from ``gateway/``), ``reflexion/`` (Reflexion mode).
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
    "RunReport": ("evolve.report", "RunReport"),
    "Engine": ("evolve.engine", "Engine"),
    "Session": ("evolve.session", "Session"),
    "Archive": ("evolve.archive", "Archive"),
    "load_task": ("evolve.taskfile", "load_task"),
    "TaskConfig": ("evolve.config", "TaskConfig"),
    # the data model
    "System": ("evolve.types", "System"),
    "ModelSpec": ("evolve.types", "ModelSpec"),
    "Trajectory": ("evolve.types", "Trajectory"),
    "Reward": ("evolve.types", "Reward"),
    "Candidate": ("evolve.types", "Candidate"),
    "Message": ("evolve.types", "Message"),
    # the protocols a user implements (docs/extending.md)
    "Operator": ("evolve.operators", "Operator"),
    "OperatorContext": ("evolve.operators", "OperatorContext"),
    "Selector": ("evolve.selectors", "Selector"),
    "Scored": ("evolve.selectors", "Scored"),
    "Runner": ("evolve.runners", "Runner"),
    "RolloutJob": ("evolve.runners", "RolloutJob"),
    "WorkerSpec": ("evolve.runners", "WorkerSpec"),
    "LLM": ("evolve.llm.base", "LLM"),
    "Completion": ("evolve.llm.base", "Completion"),
    "World": ("evolve.worlds.base", "World"),
    "Acceptance": ("evolve.loop", "Acceptance"),
    "MinibatchSampler": ("evolve.loop", "MinibatchSampler"),
    "Stopping": ("evolve.loop", "Stopping"),
    "Verdict": ("evolve.judge", "Verdict"),
    "NodeType": ("evolve.topology.base", "NodeType"),
    "MemoryPolicy": ("evolve.memory.base", "Policy"),
    "Sandbox": ("evolve.sandbox.base", "Sandbox"),
    # errors
    "EvolveError": ("evolve.errors", "EvolveError"),
    "UserError": ("evolve.errors", "UserError"),
    "InfraError": ("evolve.errors", "InfraError"),
    "RunFailed": ("evolve.errors", "RunFailed"),
    "ScriptedLM": ("evolve.llm.fake", "ScriptedLM"),
}

__all__ = sorted(_LAZY) + ["__version__"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'evolve' has no attribute {name!r}")


def __dir__() -> list[str]:
    return __all__
