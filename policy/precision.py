"""Training precision: bfloat16 matmuls on a frozen base where the hardware has them, float32 else.

``params.precision`` of a local model (``auto`` | ``bf16`` | ``fp32``) sets how the LoRA trainings
run: the SFT cold start of a checkpoint, STaR's adapters and GRPO's updates. Sampling is not
affected. In ``bf16``:

- the base's frozen weights are cast to bfloat16 once (they are never written, so nothing
  accumulates in that precision); the trained parameters (the LoRA matrices) and the optimiser's
  state stay float32 (master weights);
- the forward pass runs under ``torch.autocast(bfloat16)``: every linear layer is a bfloat16
  matmul (AMX or AVX512-BF16 on a CPU, tensor cores on a GPU), the LoRA factors are cast for
  the product and their gradients come back to the float32 masters;
- the logits are upcast before the log-softmax: losses, log-probs, importance ratios and KL
  are computed in float32;
- peft's cast of each LoRA layer's input to the factors' dtype is turned off: under autocast it
  would only convert the activations to float32 and back for every layer;
- attention over up to :data:`MATMUL_ATTENTION_MAX` positions is two bfloat16 matmuls and a
  float32 softmax (:func:`bf16_attention`): torch's fused CPU attention is slow backwards in
  bfloat16 at short lengths (a SmolLM2 layer, 8 x 62 tokens, forward and backward: 19 ms fused,
  5 ms as matmuls; at 4 x 480 the fused kernel is faster, 83 against 126 ms, and is used).

``auto`` is ``bf16`` on a CUDA device that supports it and on a CPU whose flags say it has
``amx_bf16`` or ``avx512_bf16`` (or torch reports AMX / AVX512-BF16), ``fp32`` everywhere else;
the tiny from-scratch models keep float32 under ``auto`` (their matmuls are too small to gain,
and their seeded results stay as they were). ``fp32`` is exact: the same numbers as before this
setting existed.

    with BF16Base(model) as mixed:          # cast once; the float32 weights come back at exit
        with mixed.autocast():
            loss = ...                      # forward
        loss.backward()
        with mixed.full_precision():        # e.g. a validation that samples in float32
            score = evaluate(model)
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from evolve.llm.params import LOCAL_PRECISIONS as PRECISIONS
from evolve.llm.params import check_precision

ATTENTION = "evolvekit_bf16"  # the attention function's name in transformers' registry while mixed
MATMUL_ATTENTION_MAX = 256  # longer sequences take torch's fused attention (faster there in bfloat16)
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The CPU's feature flags from /proc/cpuinfo (empty where there is none, e.g. macOS)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split())
    return frozenset()


def cpu_has_bf16() -> bool:
    """Whether this CPU does bfloat16 matmuls in hardware: the ``amx_bf16`` or ``avx512_bf16``
    flag, or torch's own detection of AMX tiles / AVX512-BF16. Detected, never assumed."""
    if set(CPU_BF16_FLAGS) & cpu_flags():
        return True
    import torch

    cpu = getattr(torch, "cpu", None)
    for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
        fn = getattr(cpu, probe, None)
        try:
            if fn is not None and fn():
                return True
        except Exception:  # noqa: BLE001 - a probe missing from this torch build: not detected
            pass
    return False


def resolve_precision(value: Any, device: Any = "cpu", *, tiny: bool = False) -> str:
    """``bf16`` or ``fp32`` for a training on ``device``: ``auto`` is ``bf16`` where the device does
    bfloat16 matmuls (:func:`cpu_has_bf16`, or a CUDA device with bf16) and the model is not a tiny
    from-scratch one. An explicit ``bf16`` on a CPU without it still runs (emulated, slower), with a
    warning that says so."""
    v = check_precision(value)
    kind = str(getattr(device, "type", device) or "cpu")
    if v == "auto":
        if tiny:
            return "fp32"
        if kind.startswith("cuda"):
            import torch

            return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
        return "bf16" if kind == "cpu" and cpu_has_bf16() else "fp32"
    if v == "bf16" and kind == "cpu" and not cpu_has_bf16():
        import warnings

        warnings.warn(
            "precision: bf16 on a CPU without AMX or AVX512-BF16: torch emulates bfloat16 there, "
            "which is slower than float32; use precision: auto or fp32",
            stacklevel=2,
        )
    return v


def bf16_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Any, None]:
    """A transformers attention function: softmax(q kᵀ · scaling + mask) v as two matmuls in the
    inputs' dtype with the softmax in float32, for training forwards (no cache) up to
    :data:`MATMUL_ATTENTION_MAX` positions; anything else goes to transformers' SDPA function. No
    mask means causal (what the SDPA mask function gives when nothing is padded); a boolean mask
    is True where a position may be attended to, a float one is added."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    T, S = query.shape[-2], key.shape[-2]
    if (
        T != S
        or S > MATMUL_ATTENTION_MAX
        or dropout
        or kwargs.get("sliding_window") is not None
        or kwargs.get("softcap") is not None
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    rep = query.shape[1] // key.shape[1]
    if rep > 1:  # grouped-query attention: each key/value head serves `rep` query heads
        key, value = key.repeat_interleave(rep, dim=1), value.repeat_interleave(rep, dim=1)
    w = torch.matmul(query, key.transpose(2, 3)) * (scaling if scaling is not None else query.shape[-1] ** -0.5)
    if attention_mask is None:
        if getattr(module, "is_causal", True) and T > 1:
            w = w.masked_fill(torch.ones(T, S, dtype=torch.bool, device=w.device).triu(1), float("-inf"))
    elif attention_mask.dtype == torch.bool:
        w = w.masked_fill(~attention_mask[..., :S], float("-inf"))
    else:
        w = w + attention_mask[..., :S]
    w = torch.softmax(w, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(w, value).transpose(1, 2).contiguous(), None


@functools.lru_cache(maxsize=1)
def _register_attention() -> str:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, bf16_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    return ATTENTION


class BF16Base:
    """Mixed precision on ``model`` for as long as the context lasts (see the module docstring):
    its frozen floating-point parameters cast to bfloat16, the trained ones left as they are. At
    exit, and inside :meth:`full_precision`, the frozen parameters are the original float32 tensors
    again (kept, not recomputed: bit for bit). A disabled one (``enabled=False``: float32 training)
    changes nothing."""

    def __init__(self, model: Any, enabled: bool = True) -> None:
        self.model, self.enabled = model, bool(enabled)
        self._kept: dict[str, tuple[Any, Any]] = {}  # name -> (parameter, its float32 tensor)
        self._casting: list[tuple[Any, bool]] = []
        self._attention: list[tuple[Any, str]] = []  # (config, its attention implementation)

    def __enter__(self) -> BF16Base:
        if self.enabled:
            self.cast()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.restore()

    def cast(self) -> None:
        if not self.enabled:  # float32 training: nothing to cast
            return
        import torch

        for name, p in self.model.named_parameters():
            if not p.requires_grad and p.dtype == torch.float32 and name not in self._kept:
                self._kept[name] = (p, p.data)
                p.data = p.data.to(torch.bfloat16)
        for mod in self.model.modules():  # peft LoRA layers: no float32 round trip of their input
            if hasattr(mod, "cast_input_dtype_enabled"):
                self._casting.append((mod, mod.cast_input_dtype_enabled))
                mod.cast_input_dtype_enabled = False
        config: Any = getattr(self.model, "config", None)
        if getattr(config, "_attn_implementation", None) == "sdpa" and not self._attention:
            self._attention.append((config, "sdpa"))
            config._attn_implementation = _register_attention()

    def restore(self) -> None:
        for p, data in self._kept.values():
            p.data = data
        self._kept.clear()
        for mod, was in self._casting:
            mod.cast_input_dtype_enabled = was
        self._casting.clear()
        for config, impl in self._attention:
            config._attn_implementation = impl
        self._attention.clear()

    def autocast(self) -> Any:
        """``torch.autocast(bfloat16)`` on the model's device when enabled, else nothing."""
        if not self.enabled:
            return contextlib.nullcontext()
        import torch

        device = next(self.model.parameters()).device.type
        return torch.autocast(device, dtype=torch.bfloat16)

    @contextlib.contextmanager
    def full_precision(self) -> Iterator[None]:
        """The float32 model for a while (a validation that samples), mixed again after."""
        if not self.enabled:
            yield
            return
        self.restore()
        try:
            yield
        finally:
            self.cast()


__all__ = [
    "BF16Base",
    "CPU_BF16_FLAGS",
    "PRECISIONS",
    "bf16_attention",
    "check_precision",
    "cpu_has_bf16",
    "cpu_flags",
    "resolve_precision",
]
