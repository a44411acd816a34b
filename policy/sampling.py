"""Sampling from a causal LM with exact log-probs: the loop the local server runs.

Not ``generate``: left padding, position ids, a KV cache (preallocated, see
:mod:`evolve.policy.batch_cache`), and per-request seeded Gumbel noise, so a request's sample does
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

from evolve.policy.batch_cache import GROUPED, GROUPS, grouping, joinable, new_cache


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


NOISE_AT_ONCE = 1 << 20  # a row's Gumbel noise is drawn at once up to this many numbers (4 MB), else a step at a time
# Above this vocabulary size a row draws one uniform per step and picks its token by inverse CDF:
# Gumbel noise costs V random numbers per row and step (about 6 ms for V = 151,936 on a CPU core,
# longer than a GPU decode step of a 0.5B model). Chosen by the model, never by the batch, so a
# seed gives the same sample whatever shares its batch.
INVERSE_CDF_VOCAB = 4096


@dataclass
class Ask:
    """What a row asks for (the server's requests carry the same fields)."""

    prompt: Sequence[int]
    temperature: float = 1.0
    max_tokens: int = 64
    seed: int | None = None
    stop: Sequence[str] = ()
    top_logprobs: int = 0


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


class Row:
    """One request's decoding state; ``done`` is its :class:`Sample` once it has ended."""

    def __init__(self, spec: Any, vocab: int, by_cdf: bool, dev: Any) -> None:
        import torch

        self.spec = spec
        t, self.max_new = max(0.0, float(spec.temperature)), max(0, int(spec.max_tokens))
        self.inv_t = 1.0 / max(t, 1e-6) if t > 0 else 1.0
        self.stops = tuple(s for s in (spec.stop or ()) if s)
        self.top = max(0, int(spec.top_logprobs))
        self.ids: list[int] = []
        self.lps: list[float] = []
        self.tops: list[list[tuple[int, float]]] = []
        self.text = ""
        self.gen: Any = None  # its seeded generator (sampled rows drawing a step at a time)
        self.noise: Any = None  # its Gumbel noise for every step, drawn at once (small vocabularies)
        if t > 0 and self.max_new > 0:
            seed = int(spec.seed) if spec.seed is not None else random.getrandbits(63)
            if not by_cdf and self.max_new * vocab <= NOISE_AT_ONCE:
                self.noise = _gumbel(seed, self.max_new, vocab).to(dev)
            else:
                self.gen = torch.Generator().manual_seed(seed)
        self.done: Sample | None = Sample([], [], "length") if self.max_new <= 0 else None
        self.cohort = 0  # which join of its Decoder brought it in

    @property
    def sampled(self) -> bool:
        return self.gen is not None or self.noise is not None

    def _end(self, reason: str, stop: str | None = None) -> None:
        self.done = Sample(self.ids, self.lps, reason, stop=stop, top_logprobs=self.tops if self.top > 0 else None)

    def take(self, tok: int, lp: float, top: tuple[list[int], list[float]] | None, eos: set[int], decode: Any) -> None:
        """Append one drawn token; end the row on EOS, a stop string or its length."""
        self.ids.append(tok)
        self.lps.append(lp)
        if self.top > 0 and top is not None:
            self.tops.append(list(zip(top[0][: self.top], top[1][: self.top])))
        if tok in eos:
            self._end("stop")
            return
        if self.stops:
            piece = decode(tok)
            self.text += piece
            hit = next((s for s in self.stops if s in self.text[-(len(s) + len(piece)) :]), None)
            if hit is not None:
                self._end("stop", hit)
                return
        if len(self.ids) >= self.max_new:
            self._end("length")


GROUP_SLACK = 64  # columns: neighbouring cohorts closer than this read the cache as one group


class Decoder:
    """A running batch: rows join (:meth:`add`: their prompts prefilled and put beside the rows
    already decoding), every :meth:`step` draws one token for each live row, and rows leave when
    they end. The server keeps one running and admits new requests as rows finish (continuous
    batching); :func:`sample` runs one to the end.

    The batch holds its rows left-padded to one column: a row that joins later is padded on the
    left, and the columns no row uses any more are dropped from the front. Position ids are each
    row's own, so a row's tokens do not depend on when it joined (up to the rounding of the batch's
    shape, which bf16 shows). Finished rows leave the cache once they are ``prune`` of the batch.
    """

    def __init__(
        self,
        model: Any,
        *,
        eos_id: int | Sequence[int],
        pad_id: int = 0,
        decode: Callable[[int], str] | None = None,
        prune: float = 0.25,
    ) -> None:
        if hasattr(model, "get_base_model"):  # a PeftModel: its injected LoRA layers live in the base model
            model = model.get_base_model()
        self.model = model
        self.eos = {int(eos_id)} if isinstance(eos_id, int) else {int(e) for e in eos_id}
        self.pad_id, self.decode, self.prune = int(pad_id), decode, float(prune)
        cache_kw, keep_kw = _forward_kwargs(model)
        self._cache_kw = cache_kw
        self._extra = {keep_kw: 1} if keep_kw else {}
        self.vocab = int(model.config.vocab_size)
        self.by_cdf = self.vocab > INVERSE_CDF_VOCAB
        self.dev = next(model.parameters()).device
        self.grouped = grouping(model)
        self.joins = 0  # how many times rows joined: a row's cohort (Row.cohort)
        self._reset()

    def _reset(self) -> None:
        self.rows: list[Row] = []  # the batch, in cache order (finished rows stay until pruned)
        self.live = 0
        self.cache: Any = None
        self.mask: Any = None  # [B, columns]
        self.last_pos: Any = None  # [B]
        self.inv_t: Any = None  # [B, 1]
        self.logits: Any = None  # [B, V]: the next token's, for every row
        self.groups: list[tuple[int, int, int]] = []  # (first row, end row, first column) to attend by

    @property
    def joinable(self) -> bool:
        """Whether rows can join a running batch (the preallocated cache layers are in use)."""
        return self.cache is None or joinable(self.cache)

    def _forward(self, ids: Any, mask: Any, pos: Any, cache: Any, groups: list | None = None) -> Any:
        config = self.model.config
        before = config._attn_implementation
        if groups:
            config._attn_implementation, GROUPS.groups = GROUPED, groups
        try:
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=pos,
                use_cache=True,
                **{self._cache_kw: cache},
                **self._extra,
            )
        finally:
            if groups:
                config._attn_implementation, GROUPS.groups = before, None
        return out.logits[:, -1].float()

    def _regroup(self) -> None:
        """The batch's rows as groups that read the cache from their own first column: one group
        per cohort (rows that joined together sit together), neighbours merged while their first
        columns are less than ``GROUP_SLACK`` apart."""
        self.groups = []
        if not self.grouped or not self.rows:
            return
        first = self.mask.argmax(1).tolist()  # each row's first column (its mask is 1 from there)
        spans: list[list[int]] = []  # [first row, end row, first column]
        for j, r in enumerate(self.rows):
            if spans and self.rows[spans[-1][1] - 1].cohort == r.cohort:
                spans[-1][1], spans[-1][2] = j + 1, min(spans[-1][2], first[j])
            else:
                spans.append([j, j + 1, first[j]])
        merged: list[list[int]] = []
        for g in spans:
            if merged and abs(g[2] - merged[-1][2]) < GROUP_SLACK:
                merged[-1][1], merged[-1][2] = g[1], min(merged[-1][2], g[2])
            else:
                merged.append(g)
        if len(merged) > 1:
            self.groups = [(a, b, c) for a, b, c in merged]

    def add(self, specs: Sequence[Any]) -> list[Row]:
        """Start decoding ``specs`` (objects with :class:`Ask`'s fields); their :class:`Row`\\ s,
        in order (a row with nothing to generate is ``done`` already and does not join)."""
        import torch

        new = [Row(s, self.vocab, self.by_cdf, self.dev) for s in specs]
        for r in new:
            if r.stops and self.decode is None:
                raise ValueError("sample: stop strings need a decode function")
        joining = [r for r in new if r.done is None]
        if not joining:
            return new
        self.joins += 1
        for r in joining:
            r.cohort = self.joins
        if self.rows and not self.joinable:
            raise RuntimeError("this cache cannot take rows into a running batch")
        with torch.inference_mode():
            L = max(len(r.spec.prompt) for r in joining)
            ids = torch.full((len(joining), L), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(joining), L), dtype=torch.long)
            for i, r in enumerate(joining):
                p = list(r.spec.prompt)
                ids[i, L - len(p) :] = torch.tensor(p, dtype=torch.long)
                mask[i, L - len(p) :] = 1
            pos = (mask.cumsum(1) - 1).clamp_(min=0)
            inv_t = torch.tensor([[r.inv_t] for r in joining], dtype=torch.float32)
            ids, mask, pos, inv_t = (t.to(self.dev) for t in (ids, mask, pos, inv_t))
            room = max(r.max_new for r in joining)
            if not self.rows:
                self.cache = new_cache(self.model, L + room)
                self.logits = self._forward(ids, mask, pos, self.cache)
                self.rows, self.mask, self.last_pos, self.inv_t = joining, mask, pos[:, -1].clone(), inv_t
            else:
                cache = new_cache(self.model, L)
                logits = self._forward(ids, mask, pos, cache)
                keep = [j for j, r in enumerate(self.rows) if r.done is None]
                room = max(room, *(r.max_new - len(r.ids) for r in (self.rows[j] for j in keep)))
                keep_t = torch.tensor(keep, dtype=torch.long, device=self.dev)
                n = int(self.mask.shape[1])
                width = max(n, L)
                for a, b in zip(self.cache.layers, cache.layers):
                    a.join(keep_t, b, width, width + room)
                old = self.mask[keep_t]
                self.mask = torch.cat(
                    [
                        torch.cat([old.new_zeros((len(keep), width - n)), old], 1),
                        torch.cat([mask.new_zeros((len(joining), width - L)), mask], 1),
                    ]
                )
                self.rows = [self.rows[j] for j in keep] + joining
                self.last_pos = torch.cat([self.last_pos[keep_t], pos[:, -1]])
                self.inv_t = torch.cat([self.inv_t[keep_t], inv_t])
                self.logits = torch.cat([self.logits[keep_t], logits])
                self._trim()
                self._regroup()
        self.live += len(joining)
        return new

    def _trim(self) -> None:
        """Drop the front columns no row attends to any more (views: nothing is copied)."""
        used = self.mask.any(0)
        c0 = int(used.int().argmax()) if bool(used.any()) else 0
        if c0 > 0 and joinable(self.cache):
            for layer in self.cache.layers:
                layer.drop_front(c0)
            self.mask = self.mask[:, c0:]

    def step(self) -> list[Row]:
        """Draw one token for every live row; the rows that ended on it."""
        import torch

        if not self.live:
            return []
        rows = self.rows
        with torch.inference_mode():
            logp = torch.log_softmax(self.logits * self.inv_t, dim=-1)
            if not any(r.sampled and r.done is None for r in rows):
                # every live row greedy (an evaluation): the argmax, without the inverse CDF's float64
                # cumulative sum over the vocabulary (13 ms a step for 32 rows of SmolLM2 on a CPU)
                tok = logp.argmax(-1)
            elif self.by_cdf:
                u = torch.tensor(
                    [
                        float(torch.rand((), generator=r.gen, dtype=torch.float64))
                        if r.gen is not None and r.done is None
                        else 0.0
                        for r in rows
                    ],
                    dtype=torch.float64,
                )
                greedy = torch.tensor([r.gen is None for r in rows], device=self.dev)
                tok = _inverse_cdf(logp, u.to(self.dev), greedy)
            else:
                zero = None
                noise = []
                for r in rows:
                    if r.done is None and r.noise is not None:
                        noise.append(r.noise[len(r.ids)])
                    elif r.done is None and r.gen is not None:
                        noise.append(
                            _to_gumbel(torch.rand(self.vocab, generator=r.gen, dtype=torch.float64)).to(self.dev)
                        )
                    else:
                        zero = zero if zero is not None else torch.zeros(self.vocab, device=self.dev)
                        noise.append(zero)
                tok = (logp + torch.stack(noise)).argmax(-1)
            lp = logp.gather(1, tok[:, None])[:, 0]
            k_top = max((r.top for r in rows if r.done is None), default=0)
            top_v: list = []
            top_i: list = []
            if k_top > 0:
                top = logp.topk(min(k_top, self.vocab), dim=-1)
                top_v, top_i = top.values.tolist(), top.indices.tolist()
            ended: list[Row] = []
            for j, (r, tk, tk_lp) in enumerate(zip(rows, tok.tolist(), lp.tolist())):
                if r.done is not None:
                    continue
                r.take(tk, tk_lp, (top_i[j], top_v[j]) if k_top > 0 else None, self.eos, self.decode)
                if r.done is not None:
                    ended.append(r)
            self.live -= len(ended)
            if not self.live:
                self._reset()
                return ended
            dead = len(rows) - self.live
            if dead >= max(1, int(self.prune * len(rows))):
                keep = [j for j, r in enumerate(rows) if r.done is None]
                keep_t = torch.tensor(keep, dtype=torch.long, device=self.dev)
                self.cache.batch_select_indices(keep_t)
                self.rows = [rows[j] for j in keep]
                self.mask, self.last_pos, self.inv_t, tok = (
                    self.mask[keep_t],
                    self.last_pos[keep_t],
                    self.inv_t[keep_t],
                    tok[keep_t],
                )
                self._trim()
                self._regroup()
            self.mask = torch.cat([self.mask, self.mask.new_ones((len(self.rows), 1))], dim=1)
            self.last_pos = self.last_pos + 1
            self.logits = self._forward(tok[:, None], self.mask, self.last_pos[:, None], self.cache, self.groups)
        return ended


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
    """Generate one completion per prompt in one batch (a :class:`Decoder` run to its end).

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
    B = len(prompts)
    if B == 0:
        return []

    def each(v: Any, cast: Any) -> list:
        return [cast(v)] * B if isinstance(v, (int, float)) else [cast(x) for x in v]

    temps, max_new, tops = each(temperatures, float), each(max_tokens, int), each(top_logprobs, int)
    seeds = list(seeds) if seeds is not None else [None] * B
    stops = [tuple(s or ()) for s in stops] if stops is not None else [()] * B
    dec = Decoder(model, eos_id=eos_id, pad_id=pad_id, decode=decode, prune=prune)
    rows = dec.add([Ask(p, t, m, s, st, k) for p, t, m, s, st, k in zip(prompts, temps, max_new, seeds, stops, tops)])
    while dec.live:
        dec.step()
    return [r.done for r in rows]  # type: ignore[misc]


__all__ = ["INVERSE_CDF_VOCAB", "NOISE_AT_ONCE", "Decoder", "Row", "Sample", "sample"]
