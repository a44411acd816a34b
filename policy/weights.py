"""Base weights and LoRA adapters as single safetensors files (content-addressable artifacts).

Each file holds the tensors plus ONE metadata entry, ``"evolvekit"``: the canonical JSON of
what is needed to rebuild the object (TinyConfig + tokenizer for a base; the LoRA config for an
adapter; any ``info`` given). Saving the same weights twice gives byte-identical files, so the
sha256 of the file is a faithful id.

    sha = save_base(model, tok, cfg, "base.safetensors")
    model, tok, cfg = load_base("base.safetensors")
    adapter = read_adapter("a.safetensors")             # an Adapter value (config + tensors)
    peft_model = load_adapter(model, "a.safetensors")   # or attach it to a model (base untouched)
"""

from __future__ import annotations

import functools
import json
import os
import uuid
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.artifacts import file_sha256
from evolve.policy.tiny import CharTokenizer, TinyConfig, build_model
from evolve.types import canonical_json

if TYPE_CHECKING:  # pragma: no cover
    import torch

PathLike = str | os.PathLike
META_KEY = "evolvekit"
BASE_FORMAT = "evolvekit.base/1"
ADAPTER_FORMAT = "evolvekit.lora/1"
# LoRA settings kept in the artifact (the rest of peft's LoraConfig is left at its defaults)
LORA_FIELDS = (
    "r",
    "lora_alpha",
    "lora_dropout",
    "target_modules",
    "bias",
    "use_rslora",
    "rank_pattern",
    "alpha_pattern",
    "use_dora",
    "fan_in_fan_out",
    "layers_to_transform",
)


@dataclass(eq=False)
class Adapter:
    """A LoRA adapter as a value: its LoRA config (JSON) and its tensors (peft state-dict keys
    without the adapter name, e.g. ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``)."""

    config: dict[str, Any]
    weights: dict[str, torch.Tensor]
    info: dict[str, Any] = field(default_factory=dict)  # saved in the file's metadata
    stats: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # training stats, not saved

    def lora_config(self) -> Any:
        from peft import LoraConfig

        return LoraConfig(**self.config)

    def save(self, path: PathLike) -> str:
        """Write it as one safetensors file; returns the file's sha256."""
        return save_adapter(self, None, path)

    def num_params(self) -> int:
        return sum(t.numel() for t in self.weights.values())


def _write(tensors: dict[str, torch.Tensor], meta: dict[str, Any], path: PathLike) -> str:
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous().clone() for k, v in sorted(tensors.items())}
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}-{uuid.uuid4().hex[:8]}")
    save_file(tensors, str(tmp), metadata={META_KEY: canonical_json(meta)})
    os.replace(tmp, path)
    return file_sha256(path)


def _read(path: PathLike, fmt: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    from safetensors import safe_open

    tensors = {}
    with safe_open(str(path), framework="pt") as f:
        raw = (f.metadata() or {}).get(META_KEY)
        if raw is None:
            raise ValueError(f"{path}: not an evolvekit safetensors file (no {META_KEY!r} metadata)")
        meta = json.loads(raw)
        if meta.get("format") != fmt:
            raise ValueError(f"{path}: expected format {fmt!r}, found {meta.get('format')!r}")
        for k in f.keys():
            tensors[k] = f.get_tensor(k)
    return tensors, meta


# ----------------------------------------------------------------------------- base weights


def _base_state(model: Any) -> dict[str, torch.Tensor]:
    """The base weights of a model, leaving out any LoRA layers peft injected (never merged)."""
    state = model.state_dict()
    if not any("lora_" in k or ".base_layer." in k for k in state):
        return state
    out = {}
    for k, v in state.items():
        if "lora_" in k:
            continue
        if k.startswith("base_model.model."):
            k = k[len("base_model.model.") :]
        out[k.replace(".base_layer.", ".")] = v
    return out


def save_base(model: Any, tok: CharTokenizer, cfg: TinyConfig, path: PathLike, *, info: dict | None = None) -> str:
    """Save base weights with their TinyConfig and tokenizer; returns the file's sha256.

    A PeftModel is accepted: its base weights (never merged with an adapter) are saved.
    """
    state = _base_state(model)
    if cfg.tie_embeddings:
        state.pop("lm_head.weight", None)
    meta = {
        "format": BASE_FORMAT,
        "tiny_config": cfg.model_dump(mode="json"),
        "tokenizer": tok.to_dict(),
        "vocab_size": int(model.config.vocab_size),
        "info": info or {},
    }
    return _write(state, meta, path)


def drop_base_info(path: PathLike, keys: Sequence[str]) -> str | None:
    """Rewrite a base file without ``info[k]`` for ``k`` in ``keys`` (the tensors untouched), so it
    has the bytes :func:`save_base` writes without them; its new sha256, or None if none was there."""
    meta = read_base_meta(path)
    if not set(keys) & set(meta.get("info") or {}):
        return None
    tensors, meta = _read(path, BASE_FORMAT)
    meta["info"] = {k: v for k, v in meta["info"].items() if k not in keys}
    return _write(tensors, meta, path)


def read_base_meta(path: PathLike) -> dict[str, Any]:
    """The metadata of a base file (format, tiny_config, tokenizer, info) without its tensors (nor torch)."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        return json.loads((f.metadata() or {})[META_KEY])


def token_texts(path: PathLike, token_ids: Sequence[int], context: Sequence[Any] = ()) -> list[str] | None:
    """The text of each sampled token, decoded with the tokenizer a tiny base file stores (pointers
    against ``context``, the call's messages): what the dashboard colours by log-prob. None for a
    file that is not a tiny base (a pretrained checkpoint's manifest)."""
    tok = _stored_tokenizer(str(path))
    if tok is None:
        return None
    return [tok.decode([i], context) for i in token_ids]  # tiny tokenizers: a token's text is its own


@functools.lru_cache(maxsize=16)
def _stored_tokenizer(path: str) -> Any:
    from evolve.policy.pointer import tokenizer_from_dict

    try:
        return tokenizer_from_dict(read_base_meta(path)["tokenizer"])
    except Exception:  # noqa: BLE001 - not a tiny base (a manifest, a foreign file): no tokenizer here
        return None


def load_base(
    path: PathLike,
    *,
    device: str | None = None,
    dtype: str | None = None,
    gradient_checkpointing: bool = False,
    sampling: bool = False,
) -> tuple[Any, Any, TinyConfig | None]:
    """Load ``(model, tokenizer, cfg)`` saved by :func:`save_base`; the model is in eval mode.

    ``path`` may also be the manifest of a pretrained checkpoint (:mod:`evolve.policy.hf`): then
    ``cfg`` is None, the tokenizer an :class:`~evolve.policy.hf.HFTokenizer`, and ``device``/``dtype``
    default to ``auto``; ``sampling`` (a copy that only samples) lets ``auto`` take bfloat16 on a CPU
    that has it (:func:`~evolve.policy.hf.resolve_dtype`). A tiny base stays on the CPU in float32
    unless ``device``/``dtype`` say otherwise. ``gradient_checkpointing``: see :func:`checkpoint_activations`.
    """
    from evolve.policy.hf import check_manifest, load_pretrained, read_manifest, resolve_device, resolve_dtype

    m = read_manifest(path)
    if m is not None:
        model, tok = load_pretrained(check_manifest(m), device=device, dtype=dtype, sampling=sampling)
        cfg = None
    else:
        model, tok, cfg = _load_tiny(path)
        if device is not None or dtype is not None:
            dev = resolve_device(device) if device is not None else "cpu"
            model = model.to(device=dev, dtype=resolve_dtype(dtype, dev) if dtype is not None else None)
    if gradient_checkpointing:
        checkpoint_activations(model)
    return model, tok, cfg


def checkpoint_activations(model: Any) -> Any:
    """Turn on gradient checkpointing (``params.gradient_checkpointing: true`` on a local model):
    in training, each decoder layer keeps only its input and recomputes the rest during the
    backward pass, trading about a third more compute for activation memory that no longer grows
    with the number of layers. Sampling (eval mode) is unaffected, and so are the gradients.
    Non-reentrant checkpointing, so LoRA training needs no ``enable_input_require_grads``."""
    if not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(
            f"{type(model).__name__} does not support gradient checkpointing; "
            "remove gradient_checkpointing from the model's params"
        )
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.x's name for it
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    return model


def _load_tiny(path: PathLike) -> tuple[Any, CharTokenizer, TinyConfig]:
    tensors, meta = _read(path, BASE_FORMAT)
    cfg = TinyConfig.model_validate(meta["tiny_config"])
    from evolve.policy.pointer import tokenizer_from_dict

    tok = tokenizer_from_dict(meta["tokenizer"])
    if cfg.vocab_size is None and meta.get("vocab_size") not in (None, tok.vocab_size):
        cfg = cfg.model_copy(update={"vocab_size": meta["vocab_size"]})
    model = build_model(cfg, seed=0, tokenizer=tok)
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    missing = [k for k in missing if not (cfg.tie_embeddings and k == "lm_head.weight")]
    if missing or unexpected:
        raise ValueError(f"{path}: weights do not fit the config (missing {missing[:5]}, unexpected {unexpected[:5]})")
    if cfg.tie_embeddings:
        model.tie_weights()
    return model.eval(), tok, cfg


# ----------------------------------------------------------------------------- adapters


def _jsonable(value: Any) -> Any:
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if hasattr(value, "value") and not isinstance(value, (str, int, float, bool)):  # enums
        return value.value
    return value


def lora_config_dict(config: Any) -> dict[str, Any]:
    """The JSON dict kept for a peft ``LoraConfig`` (only settings LoRA inference needs)."""
    if getattr(config, "modules_to_save", None):
        raise ValueError("adapters with modules_to_save are not supported (they would carry base weights)")
    d = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    return {k: _jsonable(d[k]) for k in LORA_FIELDS if k in d}


def adapter_from_model(model: Any, adapter_name: str = "default") -> Adapter:
    """Copy one adapter out of a PeftModel as an :class:`Adapter` value."""
    from peft import get_peft_model_state_dict

    cfg = lora_config_dict(model.peft_config[adapter_name])
    state = get_peft_model_state_dict(model, adapter_name=adapter_name, save_embedding_layers=False)
    return Adapter(config=cfg, weights={k: v.detach().to("cpu", copy=True) for k, v in state.items()})


def save_adapter(model: Any, adapter_name: str | None, path: PathLike, *, info: dict | None = None) -> str:
    """Save one adapter of a PeftModel (or an :class:`Adapter` value; ``adapter_name`` is then
    ignored) as one safetensors file; returns the file's sha256. Base weights are not written."""
    adapter = model if isinstance(model, Adapter) else adapter_from_model(model, adapter_name or "default")
    meta = {"format": ADAPTER_FORMAT, "lora_config": adapter.config, "info": {**adapter.info, **(info or {})}}
    return _write(adapter.weights, meta, path)


def read_adapter(path: PathLike) -> Adapter:
    """Read an adapter file as an :class:`Adapter` value."""
    tensors, meta = _read(path, ADAPTER_FORMAT)
    return Adapter(config=meta["lora_config"], weights=tensors, info=meta.get("info") or {})


def attach_adapter(model: Any, adapter: Adapter, adapter_name: str = "default", *, activate: bool = True) -> Any:
    """Add ``adapter`` to ``model`` under ``adapter_name`` and return the PeftModel.

    A plain model is wrapped in place (peft injects LoRA layers around the original linear
    layers; the base tensors are neither copied nor changed). A PeftModel gets one more adapter.
    The weights are restored exactly (bitwise).
    """
    from peft import PeftModel, get_peft_model, set_peft_model_state_dict

    config = adapter.lora_config()
    if isinstance(model, PeftModel):
        if adapter_name in model.peft_config:
            raise ValueError(f"attach_adapter: the model already has an adapter named {adapter_name!r}")
        model.add_adapter(adapter_name, config)
    else:
        with warnings.catch_warnings():  # transformers' FutureWarning from inside peft
            warnings.simplefilter("ignore", FutureWarning)
            model = get_peft_model(model, config, adapter_name=adapter_name)
    result = set_peft_model_state_dict(model, adapter.weights, adapter_name=adapter_name)
    bad = [k for k in getattr(result, "unexpected_keys", []) if "lora_" in k]
    if bad:
        raise ValueError(f"attach_adapter: adapter tensors do not fit the model: {bad[:5]}")
    if activate:
        model.set_adapter(adapter_name)
    for p in model.parameters():
        p.requires_grad_(False)
    return model.eval()


def load_adapter(model: Any, path: PathLike, adapter_name: str = "default", *, activate: bool = True) -> Any:
    """Read an adapter file and attach it to ``model`` (see :func:`attach_adapter`)."""
    return attach_adapter(model, read_adapter(path), adapter_name, activate=activate)


__all__ = [
    "Adapter",
    "adapter_from_model",
    "attach_adapter",
    "checkpoint_activations",
    "file_sha256",
    "load_adapter",
    "load_base",
    "lora_config_dict",
    "read_adapter",
    "read_base_meta",
    "save_adapter",
    "save_base",
]
