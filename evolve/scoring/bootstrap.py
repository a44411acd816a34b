"""The starting system Π₀ of a run, built from the task file: its models, prompts, workflow, tool
library and memory. A backend whose models need more than their spec to start (a local model's
weights, cold-started or read, stored as artifacts) registers how in
:data:`evolve.registry.model_starts`; a tool library file is read by the loader registered in
:data:`evolve.registry.part_loaders`."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from evolve.errors import ConfigError
from evolve.registry import model_starts, part_loaders
from evolve.task.config import TaskConfig
from evolve.types import ModelSpec, System


class Run(Protocol):
    """What the starting system is built from: the run's session (:class:`evolve.scoring.session.Session`,
    which calls :func:`starting_system`; named here by its shape, so this module does not depend
    back on it)."""

    task: TaskConfig
    archive: Any
    agent: Any
    base_dir: Path


def starting_system(session: Run) -> System:
    """Build Π₀ (cold-starting local models), archive it and record it as the run's baseline."""
    task, archive = session.task, session.archive
    models = {}
    for role, mc in task.models.items():
        start = model_starts.get(mc.backend) if mc.backend in model_starts else None
        if start is not None:  # e.g. a local model: weights cold-started or read, stored as artifacts
            models[role] = start(session, role, mc)
            continue
        params = {k: v for k, v in mc.params.items() if k != "weights"}
        models[role] = ModelSpec(backend=mc.backend, name=mc.name, params=params)
    prompts = dict(task.prompts)
    hook = getattr(session.agent, "initial_prompts", None)
    if not prompts and callable(hook):  # e.g. a DSPy program's own instructions and demos
        prompts = dict(hook(dict(task.workflow), session.base_dir))
    system = System(
        workflow=dict(task.workflow),
        models=models,
        prompts=prompts,
        tools=initial_tools(task, session.base_dir),
        memory=initial_memory(task, session.base_dir),
    )
    archive.add_system(system, operator="init", generation=0, rationale="the starting system")
    archive.put_state("baseline", system.id)
    return system


def initial_tools(task: TaskConfig, base_dir: Path) -> dict[str, Any]:
    """The task file's tool library (``tools: file.json``), checked, as ``System.tools``."""
    if not task.tools:
        return {}
    path = Path(task.tools).expanduser()
    return part_loaders.get("tools")(path if path.is_absolute() else base_dir / path)


def initial_memory(task: TaskConfig, base_dir: Path) -> dict[str, Any]:
    """The task file's ``memory`` with its store folder made absolute (it must exist)."""
    spec = dict(task.memory)
    if spec.get("store"):
        path = Path(str(spec["store"])).expanduser()
        path = path if path.is_absolute() else base_dir / path
        if not (path / "memory.db").exists():
            raise ConfigError(
                f"no memory store at {path} (a folder made by evolve.memory.MemoryStore)", path="memory.store"
            )
        spec["store"] = str(path.resolve())
    return spec
