"""Explicit, lazy registries: name -> "module:attribute", imported on first use.

Third-party plugins register through the entry-point group ``evolvekit.<kind>``
(e.g. ``evolvekit.operators``); nothing is scanned. A name with a colon is an import path
(``my_pkg.ops:MyOperator``). An unknown name raises :class:`~evolve.errors.RegistryError`
with the closest known names.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
from pathlib import Path
from typing import Any, Protocol

from evolve.errors import RegistryError, UserError


def did_you_mean(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=3, cutoff=0.5)
    if close:
        return "did you mean " + " or ".join(repr(c) for c in close) + "?"
    return "known: " + ", ".join(sorted(choices))


class ImportGuard(Protocol):
    """What every path :func:`import_path` imports is checked against in a process that runs code
    someone else wrote (``evolve mcp``'s children install one). Each method raises a
    :class:`~evolve.errors.UserError` to refuse the path."""

    def check(self, path: str, *, what: str, search: Path | None = None) -> None:
        """Before anything is imported: may ``path`` be imported at all?"""

    def check_object(self, obj: Any, path: str, *, what: str) -> None:
        """Once ``path`` is resolved: may what it names (``obj``) be used?"""


# A process hands its guard to the processes it starts (a runner's workers, a run's children) in the
# environment: the import path of a function of no arguments that builds it from that environment.
GUARD_ENV = "EVOLVE_IMPORT_GUARD"
_guard: ImportGuard | None = None


def set_import_guard(guard: ImportGuard | None) -> None:
    """Check every later :func:`import_path` of this process against ``guard`` (None: the one
    ``$EVOLVE_IMPORT_GUARD`` names, if any)."""
    global _guard
    _guard = guard


def import_guard() -> ImportGuard | None:
    """The guard of this process: the one :func:`set_import_guard` installed, else the one that the
    function ``$EVOLVE_IMPORT_GUARD`` names builds (the process that started this one set it), else None."""
    if _guard is not None:
        return _guard
    factory = os.environ.get(GUARD_ENV)
    if not factory:
        return None
    return _import(factory, what=f"${GUARD_ENV}", search=None, guard=None)()


def import_path(path: str, *, what: str = "object", search: Path | None = None) -> Any:
    """Import ``"package.module:attr"`` (or ``"package.module.attr"``).

    ``search`` is a folder put first on ``sys.path`` while importing (the task file's folder),
    so a task can name a module that sits beside it. In a process with an import guard
    (:func:`import_guard`), the path is checked against it before anything is imported, and what it
    names once resolved.
    """
    return _import(path, what=what, search=search, guard=import_guard())


def resolve_trusted(path: str) -> Any:
    """What ``path`` names, imported without the import guard: for paths evolvekit itself
    holds (a registry's entries), never for one a task gives."""
    return _import(path, what="object", search=None, guard=None)


def _import(path: str, *, what: str, search: Path | None, guard: ImportGuard | None) -> Any:
    if ":" in path:
        mod_name, _, attr = path.partition(":")
    else:
        mod_name, _, attr = path.rpartition(".")
    if not mod_name or not attr:
        raise UserError(f"{what} {path!r} is not an import path; write it as 'package.module:name'")
    if guard is not None:
        guard.check(path, what=what, search=search)
    added = False
    if search is not None and str(search) not in sys.path:
        sys.path.insert(0, str(search))
        added = True
    try:
        module = importlib.import_module(mod_name)
    except ModuleNotFoundError as e:
        raise UserError(f"{what} {path!r}: cannot import module {mod_name!r} ({e})") from None
    except Exception as e:  # noqa: BLE001 - the user's module raised while importing
        raise UserError(f"{what} {path!r}: importing {mod_name!r} raised {type(e).__name__}: {e}") from None
    finally:
        if added:
            sys.path.remove(str(search))
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        names = [n for n in dir(module) if not n.startswith("_")]
        raise UserError(f"{what} {path!r}: module {mod_name!r} has no {attr!r}; {did_you_mean(attr, names)}") from None
    if guard is not None:
        guard.check_object(obj, path, what=what)
    return obj


class Registry:
    """name -> import path, resolved lazily."""

    def __init__(self, kind: str, entries: dict[str, str]) -> None:
        self.kind = kind
        self._paths: dict[str, str] = dict(entries)
        self._objects: dict[str, Any] = {}
        self._plugins_loaded = False

    def register(self, name: str, target: Any) -> None:
        """Register an object or an import path string under ``name``."""
        if isinstance(target, str):
            self._paths[name] = target
            self._objects.pop(name, None)
        else:
            self._objects[name] = target

    def _load_plugins(self) -> None:
        if self._plugins_loaded:
            return
        self._plugins_loaded = True
        from importlib.metadata import entry_points

        group = "evolvekit." + self.kind.replace(" ", "_") + "s"
        for ep in entry_points(group=group):
            self._paths.setdefault(ep.name, ep.value)

    def names(self) -> list[str]:
        self._load_plugins()
        return sorted(set(self._paths) | set(self._objects))

    def entries(self) -> dict[str, str]:
        """name -> import path of every entry registered by path (plugins included)."""
        self._load_plugins()
        return dict(self._paths)

    def __contains__(self, name: str) -> bool:
        if name in self._paths or name in self._objects:
            return True
        self._load_plugins()
        return name in self._paths

    def get(self, name: str) -> Any:
        """The object registered as ``name``, or at the import path ``name`` ("pkg.mod:attr")."""
        if name in self._objects:
            return self._objects[name]
        if name not in self._paths:
            self._load_plugins()
        if name not in self._paths and ":" in name:
            obj = import_path(name, what=self.kind)
            self._objects[name] = obj
            return obj
        if name not in self._paths:
            raise RegistryError(f"unknown {self.kind} {name!r}; {did_you_mean(name, self.names())}")
        # a registered entry (evolvekit's or an installed plugin's), not a task's: no import guard
        obj = _import(self._paths[name], what=f"{self.kind} {name!r}", search=None, guard=None)
        self._objects[name] = obj
        return obj


llm_backends = Registry(
    "llm backend",
    {
        "local": "evolve.policy.local:build",
        "litellm": "evolve.llm.litellm:build",
        "scripted": "evolve.llm.fake:build",
    },
)
operators = Registry(
    "operator",
    {
        "star": "evolve.policy.star:STaR",
        "from_traces": "evolve.policy.from_traces:FromTraces",
        "grpo": "evolve.policy.grpo:GRPO",
        "toolforge": "evolve.toolforge.operator:ToolForge",
        "memory": "evolve.memory.operator:MemoryOperator",
        "scripted": "evolve.loop.operators:ScriptedEdit",
        "topology": "evolve.topology.operator:TopologySearch",
        "prompt_mutation": "evolve.prompts.mutation:PromptMutation",
        "reflective": "evolve.prompts.reflective:ReflectiveMutation",
        "bootstrap_demos": "evolve.prompts.bootstrap:DemoBootstrap",
        "prompt_crossover": "evolve.prompts.crossover:Crossover",
        "prompt_choice": "evolve.prompts.choices:PromptChoice",
    },
)
selectors = Registry(
    "selector",
    {
        "best": "evolve.loop.selectors:Best",
        "tournament": "evolve.loop.selectors:Tournament",
        "pareto": "evolve.loop.selectors:Pareto",
    },
)
# Workflow node types (evolve.topology): the generic steps. A world's own steps (the SQL world's
# sql.write, sql.execute, sql.rewrite) come through the entry-point group evolvekit.node_types.
node_types = Registry(
    "node type",
    {
        "llm": "evolve.topology.nodes:LLMStep",
        "tool": "evolve.topology.nodes:ToolStep",
        "check": "evolve.topology.nodes:CheckStep",
        "vote": "evolve.topology.nodes:VoteStep",
        "reflect": "evolve.topology.nodes:ReflectStep",
        "answer": "evolve.topology.nodes:AnswerStep",
    },
)
# The loop's strategies (evolve.loop.strategies): acceptance of a child, the generation's minibatch, early stopping.
acceptances = Registry(
    "acceptance",
    {
        "two_stage": "evolve.loop.strategies:TwoStage",
        "val_only": "evolve.loop.strategies:ValOnly",
        "paired": "evolve.loop.strategies:Paired",
    },
)
minibatch_samplers = Registry(
    "minibatch sampler",
    {"random": "evolve.loop.strategies:RandomMinibatch", "fixed": "evolve.loop.strategies:FixedMinibatch"},
)
stoppings = Registry(
    "stopping rule", {"budget": "evolve.loop.strategies:BudgetOnly", "plateau": "evolve.loop.strategies:Plateau"}
)
# The CLI's command groups beside run/eval/init/serve (evolve.cli.commands): name -> a typer app.
commands = Registry(
    "command",
    {
        "archive": "evolve.cli.archive:app",
        "baseline": "evolve.prompts.cli:baseline_app",
        "traces": "evolve.cli.gateway:traces_app",
        "harbor": "evolve.worlds.harbor.cli:app",
    },
)
# What serves a system's memory outside the engine (the gateway): function(memory spec, query) -> items.
recallers = Registry("recaller", {"memory": "evolve.memory.recall:recall"})
# What serves a system's tools outside the engine (the gateway): a class(read_roots, sandbox, limits) with
# tools(system) -> {name: tool}, schema(tool) -> OpenAI function schema, run(tool, arguments) -> (ok, text), close().
tool_servers = Registry("tool server", {"toolforge": "evolve.toolforge.serve:ToolServer"})
# What the dashboard (evolve.ui) asks the layers about a system: "memory" (memory spec, since version) -> items and
# changes; "workflow" (workflow dict) -> a drawing or None; "tokens" (base weights file, token ids, messages) -> texts.
views = Registry(
    "view",
    {
        "memory": "evolve.memory.view:memory_view",
        "workflow": "evolve.topology.render:drawing_of",
        "tokens": "evolve.policy.weights:token_texts",
    },
)
# How a backend's model starts a run (evolve.scoring.bootstrap): function(session, role, model config) -> ModelSpec;
# a backend without an entry starts from its spec as written.
model_starts = Registry("model start", {"local": "evolve.policy.start:local_model"})
# Readers of the starting system's parts from files the task file names: function(path) -> JSON.
part_loaders = Registry("part loader", {"tools": "evolve.toolforge.tool:tools_from_file"})
# Checks of the task's workflow settings by the layers that read them: function(workflow) raising UserError.
workflow_checks = Registry("workflow check", {"graph": "evolve.topology.graph:check_task_workflow"})
# What the layers add to a run's report and to `evolve archive show`: a class with build(session,
# best_id, baseline_id) -> dict, markdown(report) -> lines, prepare(system, png), show(out, err, sid).
report_sections = Registry(
    "report section",
    {
        "workflow": "evolve.topology.report:WorkflowSection",
        "curriculum": "evolve.loop.curriculum:CurriculumSection",
        "world": "evolve.results.world:WorldSection",
    },
)
# What bounds the LLM calls one rollout can make (evolve.scoring.budget.calls_bound): the layers that run a
# system's workflow say, each a function(workflow dict) -> int | None.
call_bounds = Registry("call bound", {"workflow graph": "evolve.topology.runtime:graph_calls_bound"})
# Worlds (evolve.world.World): task environments a task file can name with `world:`.
worlds = Registry(
    "world",
    {
        "env": "evolve.worlds.env:WORLD",
        "harbor": "evolve.worlds.harbor:WORLD",
        "ifeval": "evolve.worlds.ifeval:WORLD",
        "reasoning_gym": "evolve.worlds.reasoning_gym:WORLD",
        "sql": "evolve.worlds.sql:WORLD",
        "toy": "evolve.worlds.toy:WORLD",
    },
)
runners = Registry(
    "runner",
    {
        "thread": "evolve.runners:ThreadRunner",
        "process": "evolve.runners:ProcessRunner",
        "ray": "evolve.runners.ray_runner:RayRunner",
    },
)
# Trackers (evolve.trackers.base.Tracker): where a run reports its generations, report and promoted system.
trackers = Registry(
    "tracker",
    {
        "mlflow": "evolve.trackers.mlflow:MLflowTracker",
        "wandb": "evolve.trackers.wandb:WandbTracker",
        "otel": "evolve.trackers.otel:OtelTracker",
    },
)
