"""The starting system Π₀ of a run, built from the task file: its models (a local model's
base weights cold-started or read from a file, stored as artifacts), prompts, workflow,
tool library and memory."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.config import TaskConfig
from evolve.errors import ConfigError
from evolve.types import ModelSpec, System

if TYPE_CHECKING:
    from evolve.session import Session


def starting_system(session: "Session") -> System:
    """Build Π₀ (cold-starting local models), archive it and record it as the run's baseline."""
    task, archive = session.task, session.archive
    models = {}
    for role, mc in task.models.items():
        params = {k: v for k, v in mc.params.items() if k != "weights"}
        base = None
        if mc.backend == "local":
            from evolve.policy.sft import cold_start_weights

            ckpt = None
            if "weights" in mc.params:
                from evolve.policy.hf import resolve_checkpoint

                ckpt = resolve_checkpoint(str(mc.params["weights"]), session.base_dir)
            if ckpt is not None:  # a pretrained checkpoint, with or without a cold start on it
                models[role] = _pretrained(session, role, mc, ckpt, params)
                continue
            if mc.cold_start is not None and "weights" in mc.params:
                raise ConfigError(f"models.{role}: cold_start with params.weights trains a LoRA adapter on a "
                                  f"pretrained checkpoint, and {mc.params['weights']!r} is not a checkpoint directory "
                                  "or cached Hub id; drop params.weights to cold-start a tiny model")
            if mc.cold_start is not None:
                path = cold_start_weights(session, role, mc)
            else:  # ready-made tiny base weights (evolve.policy.weights.save_base), relative to the task file
                path = Path(str(mc.params["weights"])).expanduser()
                path = path if path.is_absolute() else session.base_dir / path
                if not path.is_file():
                    raise ConfigError(f"models.{role}.params.weights: no file or checkpoint directory {path}; give "
                                      "a Hugging Face checkpoint directory (or a Hub id in the local cache), a "
                                      "file written by evolve.policy.weights.save_base, or use cold_start")
            base = archive.artifacts.put_file(path, "base_weights")
            demos = path.parent / "sft_examples.json"
            if demos.exists():
                params["sft_examples"] = archive.artifacts.put_file(demos, "sft_examples").model_dump()
        models[role] = ModelSpec(backend=mc.backend, name=mc.name, base=base, params=params)
    prompts = dict(task.prompts)
    hook = getattr(session.agent, "initial_prompts", None)
    if not prompts and callable(hook):  # e.g. a DSPy program's own instructions and demos
        prompts = dict(hook(dict(task.workflow), session.base_dir))
    system = System(workflow=dict(task.workflow), models=models, prompts=prompts,
                    tools=initial_tools(task, session.base_dir), memory=initial_memory(task, session.base_dir))
    archive.add_system(system, operator="init", generation=0, rationale="the starting system")
    archive.put_state("baseline", system.id)
    return system


def _pretrained(session: "Session", role: str, mc: Any, ckpt: Path, params: dict[str, Any]) -> ModelSpec:
    """A checkpoint's manifest as the base (the archive keeps no copy of the weights); with a cold
    start, its LoRA SFT adapter on top and the demos beside for replay."""
    from evolve.policy.hf import manifest
    from evolve.policy.sft import cold_start_adapter

    store, m = session.archive.artifacts, manifest(ckpt)  # hashes every file of the checkpoint: once
    base = store.put_bytes(m, "base_weights")
    adapter = None
    if mc.cold_start is not None:
        path = cold_start_adapter(session, role, mc, ckpt, m)
        adapter = store.put_file(path, "adapter")
        params["sft_examples"] = store.put_file(path.parent / "sft_examples.json", "sft_examples").model_dump()
    return ModelSpec(backend=mc.backend, name=mc.name, base=base, adapter=adapter, params=params)


def initial_tools(task: TaskConfig, base_dir: Path) -> dict[str, Any]:
    """The task file's tool library (``tools: file.json``), checked, as ``System.tools``."""
    if not task.tools:
        return {}
    from evolve.toolforge.tool import load_library

    path = Path(task.tools).expanduser()
    return load_library(path if path.is_absolute() else base_dir / path).to_json()


def initial_memory(task: TaskConfig, base_dir: Path) -> dict[str, Any]:
    """The task file's ``memory`` with its store folder made absolute (it must exist)."""
    spec = dict(task.memory)
    if spec.get("store"):
        path = Path(str(spec["store"])).expanduser()
        path = path if path.is_absolute() else base_dir / path
        if not (path / "memory.db").exists():
            raise ConfigError(f"no memory store at {path} (a folder made by evolve.memory.MemoryStore)",
                              path="memory.store")
        spec["store"] = str(path.resolve())
    return spec
