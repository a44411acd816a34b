"""Sampling from a causal LM with exact log-probs: the loop the local server runs.

Not ``generate``: left padding, position ids, a KV cache (preallocated, see
:func:`_prealloc_layer_class`), and per-request seeded Gumbel noise, so a request's sample does
not depend on the other requests in its batch and ``logprobs[i]`` is exactly
``log_softmax(logits / T)[token_ids[i]]``. Works for the tiny models and for pretrained
checkpoints (:mod:`evolve.policy.hf`) alike.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Sample:
    """One generated completion (token ids, log-probs, why it ended)."""

    token_ids: list[int]
    logprobs: list[float] | None  # None only where they were not asked for and cost extra (CTranslate2 at T not 0 or 1)
    finish_reason: str  # "stop" (EOS or a stop string) | "length"
    stop: str | None = None  # the stop string that ended it, if any
    # asked for (top_logprobs=k): each token's k likeliest ids at its step with their log-probs, likeliest first
    top_logprobs: list[list[tuple[int, float]]] | None = None


def _forward_kwargs(model: Any) -> tuple[str, str | None]:
    """Names of the cache and logits-to-keep arguments across transformers versions."""
    params = inspect.signature(type(model).forward).parameters
    cache = "cache" if "cache" in params else "past_key_values"
    keep = (
        "logits_to_keep"
        if "logits_to_keep" in params
        else ("num_logits_to_keep" if "num_logits_to_keep" in params else None)
    )
    return cache, keep


_PREALLOC: Any = None


def _prealloc_layer_class() -> Any:
    """A DynamicLayer that writes into a preallocated buffer instead of ``torch.cat`` per step
    (which copies the whole cache every token and dominated decoding time)."""
    global _PREALLOC
    if _PREALLOC is None:
        from transformers.cache_utils import DynamicLayer

        class PreallocLayer(DynamicLayer):
            def __init__(self, capacity: int) -> None:
                super().__init__()
                self.capacity, self.n = capacity, 0
                self.kbuf: Any = None
                self.vbuf: Any = None

            def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
                if not self.is_initialized:
                    self.lazy_initialization(key_states, value_states)
                k, v, n, m = key_states, value_states, self.n, key_states.shape[-2]
                if self.kbuf is None or n + m > self.kbuf.shape[-2]:
                    cap = max(self.capacity, 2 * (n + m))
                    kb = k.new_empty(k.shape[0], k.shape[1], cap, k.shape[3])
                    vb = v.new_empty(v.shape[0], v.shape[1], cap, v.shape[3])
                    if n:
                        kb[:, :, :n] = self.kbuf[:, :, :n]
                        vb[:, :, :n] = self.vbuf[:, :, :n]
                    self.kbuf, self.vbuf = kb, vb
                self.kbuf[:, :, n : n + m] = k
                self.vbuf[:, :, n : n + m] = v
                self.n = n + m
                self.keys, self.values = self.kbuf[:, :, : self.n], self.vbuf[:, :, : self.n]
                return self.keys, self.values

            def batch_select_indices(self, indices: Any) -> None:
                if self.kbuf is not None:
                    self.kbuf, self.vbuf = self.kbuf[indices], self.vbuf[indices]
                    self.keys, self.values = self.kbuf[:, :, : self.n], self.vbuf[:, :, : self.n]

        _PREALLOC = PreallocLayer
    return _PREALLOC


def _new_cache(model: Any, capacity: int = 0) -> Any:
    from transformers import DynamicCache

    try:
        cache = DynamicCache(config=model.config)
    except TypeError:  # older transformers
        return DynamicCache()
    if (
        capacity > 0
        and isinstance(getattr(cache, "layers", None), list)
        and len(cache.layers) == model.config.num_hidden_layers
    ):
        try:
            cache.layers = [_prealloc_layer_class()(capacity) for _ in cache.layers]
        except Exception:  # noqa: BLE001 - an unexpected transformers layout: keep the plain cache
            pass
    return cache


NOISE_AT_ONCE = 1 << 24  # a batch's Gumbel noise is drawn at once up to this many numbers (64 MB)
# Above this vocabulary size a row draws one uniform per step and picks its token by inverse CDF:
# Gumbel noise costs V random numbers per row and step (about 6 ms for V = 151,936 on a CPU core,
# longer than a GPU decode step of a 0.5B model). Chosen by the model, never by the batch, so a
# seed gives the same sample whatever shares its batch.
INVERSE_CDF_VOCAB = 4096


def _inverse_cdf(logp: Any, u: Any, greedy: Any) -> Any:
    """Tokens drawn from ``exp(logp)`` (rows ``[B, V]``) by the uniforms ``u`` ``[B]``; argmax where ``greedy``."""
    import torch

    p = logp.exp()
    cdf = (p if p.device.type == "mps" else p.double()).cumsum(-1)
    x = (u.to(cdf.dtype) * cdf[:, -1]).unsqueeze(1)
    pick = torch.searchsorted(cdf, x, right=True).squeeze(1).clamp_(max=logp.shape[-1] - 1)
    return torch.where(greedy, logp.argmax(-1), pick)


def _to_gumbel(u: Any) -> Any:
    import torch

    return (-torch.log(-torch.log(u.clamp_(1e-12, 1.0 - 1e-12)))).float()


def _gumbel(seed: int, steps: int, vocab: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(seed)
    return _to_gumbel(torch.rand((steps, vocab), generator=g, dtype=torch.float64))


def _step_gumbel(gens: list, rows: list[int], alive: list[bool], vocab: int) -> Any:
    """One step's noise for the batch rows ``rows``: the next ``vocab`` draws of each live row's generator."""
    import torch

    out = torch.zeros((len(rows), vocab), dtype=torch.float32)
    for j, row in enumerate(rows):
        if gens[row] is not None and alive[row]:
            out[j] = _to_gumbel(torch.rand(vocab, generator=gens[row], dtype=torch.float64))
    return out


def sample(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    eos_id: int | Sequence[int],
    pad_id: int = 0,
    temperatures: Sequence[float] | float = 1.0,
    max_tokens: Sequence[int] | int = 64,
    seeds: Sequence[int | None] | None = None,
    stops: Sequence[Sequence[str] | None] | None = None,
    decode: Callable[[int], str] | None = None,
    prune: float = 0.25,
    top_logprobs: Sequence[int] | int = 0,
) -> list[Sample]:
    """Generate one completion per prompt in one batch (the sampling loop the server runs).

    ``model`` is a causal LM (LoRA layers, if injected, apply as they are set). Rows finish on
    EOS (``eos_id``: one id or several, e.g. a chat model's end-of-turn and end-of-text), on a stop
    string (needs ``decode``: token id -> text), or after their ``max_tokens``. Finished rows are
    dropped from the batch (and the KV cache) once they are ``prune`` of it. Each row's randomness
    comes from its own seeded CPU generator: Gumbel noise (drawn at once when small, else a step at
    a time: the same numbers either way), or above :data:`INVERSE_CDF_VOCAB` tokens one uniform per
    step for an inverse-CDF draw. So a seed gives the same sample whatever else is in the batch.
    ``top_logprobs`` (one k, or one a row): each token's k likeliest ids under the distribution it
    was drawn from, with their log-probs (``Sample.top_logprobs``).
    """
    import torch

    B = len(prompts)
    if B == 0:
        return []
    temps = [float(temperatures)] * B if isinstance(temperatures, (int, float)) else [float(t) for t in temperatures]
    max_new = [int(max_tokens)] * B if isinstance(max_tokens, int) else [int(m) for m in max_tokens]
    seeds = list(seeds) if seeds is not None else [None] * B
    stops = [tuple(s or ()) for s in stops] if stops is not None else [()] * B
    tops = [int(top_logprobs)] * B if isinstance(top_logprobs, int) else [int(k) for k in top_logprobs]
    any_top = any(k > 0 for k in tops)
    if any(stops) and decode is None:
        raise ValueError("sample: stop strings need a decode function")
    if hasattr(model, "get_base_model"):  # a PeftModel: its injected LoRA layers live in the base model
        model = model.get_base_model()
    cache_kw, keep_kw = _forward_kwargs(model)
    extra = {keep_kw: 1} if keep_kw else {}
    V = int(model.config.vocab_size)
    T = max(max_new)
    dev = next(model.parameters()).device
    with torch.inference_mode():
        L = max(len(p) for p in prompts)
        ids = torch.full((B, L), pad_id, dtype=torch.long)
        mask = torch.zeros((B, L), dtype=torch.long)
        for i, p in enumerate(prompts):
            if len(p):
                ids[i, L - len(p) :] = torch.tensor(list(p), dtype=torch.long)
                mask[i, L - len(p) :] = 1
        pos = (mask.cumsum(1) - 1).clamp_(min=0)
        temp_t = torch.tensor(temps, dtype=torch.float32)
        inv_t = torch.where(temp_t > 0, 1.0 / temp_t.clamp(min=1e-6), torch.ones_like(temp_t))[:, None]
        eos = {int(eos_id)} if isinstance(eos_id, int) else {int(e) for e in eos_id}
        sampled = [temps[i] > 0 and max_new[i] > 0 for i in range(B)]
        row_seeds = [(s if s is not None else random.getrandbits(63)) if ok else 0 for s, ok in zip(seeds, sampled)]
        gens: list = [None] * B
        noise, by_cdf = None, V > INVERSE_CDF_VOCAB
        if by_cdf or B * T * V > NOISE_AT_ONCE:  # drawn a step at a time below
            gens = [torch.Generator().manual_seed(s) if ok else None for s, ok in zip(row_seeds, sampled)]
        else:  # per-request noise (CPU generators): the same whatever else is in the batch
            noise = torch.zeros((B, T, V), dtype=torch.float32)
            for i in range(B):
                if sampled[i]:
                    noise[i, : max_new[i]] = _gumbel(row_seeds[i], max_new[i], V)
            noise = noise.to(dev)
        ids, mask, pos, inv_t = (t.to(dev) for t in (ids, mask, pos, inv_t))

        cache = _new_cache(model, L + T)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{cache_kw: cache}, **extra)
        logits = out.logits[:, -1].float()
        rows = torch.arange(B, device=dev)  # batch position -> original row
        last_pos = pos[:, -1].clone()
        out_ids: list[list[int]] = [[] for _ in range(B)]
        out_lp: list[list[float]] = [[] for _ in range(B)]
        out_top: list[list[list[tuple[int, float]]]] = [[] for _ in range(B)]
        texts = [""] * B
        results: list[Sample | None] = [None] * B
        for i in range(B):
            if max_new[i] <= 0:
                results[i] = Sample([], [], "length")
        alive = [results[i] is None for i in range(B)]
        for t in range(T):
            r = rows
            logp = torch.log_softmax(logits * inv_t[r], dim=-1)
            rl = r.tolist()
            if by_cdf and not any(gens[o] is not None and alive[o] for o in rl):
                # every live row greedy (an evaluation): the argmax, without the inverse CDF's float64
                # cumulative sum over the vocabulary (13 ms a step for 32 rows of SmolLM2 on a CPU)
                tok = logp.argmax(-1)
            elif by_cdf:
                u = torch.tensor(
                    [
                        float(torch.rand((), generator=gens[o], dtype=torch.float64))
                        if gens[o] is not None and alive[o]
                        else 0.0
                        for o in rl
                    ],
                    dtype=torch.float64,
                )
                greedy = torch.tensor([gens[o] is None for o in rl], device=dev)
                tok = _inverse_cdf(logp, u.to(dev), greedy)
            else:
                step_noise = noise[r, t] if noise is not None else _step_gumbel(gens, rl, alive, V).to(dev)
                tok = (logp + step_noise).argmax(-1)
            lp = logp.gather(1, tok[:, None])[:, 0]
            k_top = max((tops[o] for o in rl if alive[o]), default=0) if any_top else 0
            if k_top > 0:
                top = logp.topk(min(k_top, V), dim=-1)
                top_v, top_i = top.values.tolist(), top.indices.tolist()
            for j, (orig, tk, tk_lp) in enumerate(zip(rl, tok.tolist(), lp.tolist())):
                if not alive[orig]:
                    continue
                out_ids[orig].append(tk)
                out_lp[orig].append(tk_lp)
                if tops[orig] > 0:
                    out_top[orig].append(list(zip(top_i[j][: tops[orig]], top_v[j][: tops[orig]])))
                if tk in eos:
                    results[orig] = Sample(out_ids[orig], out_lp[orig], "stop")
                elif stops[orig]:
                    piece = decode(tk)  # type: ignore[misc]
                    texts[orig] += piece
                    hit = next((s for s in stops[orig] if s in texts[orig][-(len(s) + len(piece)) :]), None)
                    if hit is not None:
                        results[orig] = Sample(out_ids[orig], out_lp[orig], "stop", stop=hit)
                if results[orig] is None and len(out_ids[orig]) >= max_new[orig]:
                    results[orig] = Sample(out_ids[orig], out_lp[orig], "length")
                if results[orig] is not None:
                    alive[orig] = False
            keep = [j for j, orig in enumerate(rl) if alive[orig]]
            if not keep:
                break
            if len(r) - len(keep) >= max(1, int(prune * len(r))):
                keep_t = torch.tensor(keep, dtype=torch.long, device=dev)
                cache.batch_select_indices(keep_t)
                mask, rows, tok, last_pos = mask[keep_t], rows[keep_t], tok[keep_t], last_pos[keep_t]
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
            last_pos = last_pos + 1
            out = model(
                input_ids=tok[:, None],
                attention_mask=mask,
                position_ids=last_pos[:, None],
                use_cache=True,
                **{cache_kw: cache},
                **extra,
            )
            logits = out.logits[:, -1].float()
    done = [s if s is not None else Sample(out_ids[i], out_lp[i], "length") for i, s in enumerate(results)]
    for i, s in enumerate(done):
        if tops[i] > 0:
            s.top_logprobs = out_top[i]
    return done


__all__ = ["INVERSE_CDF_VOCAB", "NOISE_AT_ONCE", "Sample", "sample"]
