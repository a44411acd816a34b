"""How a ``local`` model starts a run (:data:`evolve.registry.model_starts`): its base weights are a
tiny model cold-started by SFT on the world's demos (cached), a file written by
:func:`evolve.policy.weights.save_base`, or a Hugging Face checkpoint (its manifest; with a cold
start, a LoRA SFT adapter on top); each stored as an artifact of the run."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.errors import ConfigError
from evolve.types import ModelSpec

if TYPE_CHECKING:
    from evolve.scoring.session import Session


def local_model(session: Session, role: str, mc: Any) -> ModelSpec:
    """The starting :class:`~evolve.types.ModelSpec` of the local model of ``role`` (task-file entry ``mc``)."""
    from evolve.policy.sft import cold_start_weights

    archive = session.archive
    params = {k: v for k, v in mc.params.items() if k != "weights"}
    ckpt = None
    if "weights" in mc.params:
        from evolve.policy.hf import resolve_checkpoint

        ckpt = resolve_checkpoint(str(mc.params["weights"]), session.base_dir)
    if ckpt is not None:  # a pretrained checkpoint, with or without a cold start on it
        return _pretrained(session, role, mc, ckpt, params)
    if mc.cold_start is not None and "weights" in mc.params:
        raise ConfigError(
            f"models.{role}: cold_start with params.weights trains a LoRA adapter on a "
            f"pretrained checkpoint, and {mc.params['weights']!r} is not a checkpoint directory "
            "or cached Hub id; drop params.weights to cold-start a tiny model"
        )
    if mc.cold_start is not None:
        path = cold_start_weights(session, role, mc)
    else:  # ready-made tiny base weights (evolve.policy.weights.save_base), relative to the task file
        path = Path(str(mc.params["weights"])).expanduser()
        path = path if path.is_absolute() else session.base_dir / path
        if not path.is_file():
            raise ConfigError(
                f"models.{role}.params.weights: no file or checkpoint directory {path}; give "
                "a Hugging Face checkpoint directory (or a Hub id in the local cache), a "
                "file written by evolve.policy.weights.save_base, or use cold_start"
            )
    base = archive.artifacts.put_file(path, "base_weights")
    demos = path.parent / "sft_examples.json"
    if demos.exists():
        params["sft_examples"] = archive.artifacts.put_file(demos, "sft_examples").model_dump()
    return _checked(ModelSpec(backend=mc.backend, name=mc.name, base=base, params=params), archive.artifacts)


def _checked(spec: ModelSpec, artifacts: Any) -> ModelSpec:
    """The spec, once the engine it asks for can sample it (``engine: ctranslate2`` converts it now)."""
    if spec.params.get("engine") == "ctranslate2":
        from evolve.policy.ct2_server import preflight

        preflight(spec, artifacts)
    return spec


def _pretrained(session: Session, role: str, mc: Any, ckpt: Path, params: dict[str, Any]) -> ModelSpec:
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
    return _checked(ModelSpec(backend=mc.backend, name=mc.name, base=base, adapter=adapter, params=params), store)


__all__ = ["local_model"]
