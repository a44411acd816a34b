"""Tiny causal LMs built from a config: a character tokenizer with chat markers and a small Llama.

Nothing is downloaded: the tokenizer is a fixed character table and the model is a
``transformers.LlamaForCausalLM`` made from a ``LlamaConfig`` with random weights, small enough
(~1.8M parameters by default) to train from scratch on a laptop CPU in minutes.

    tok = CharTokenizer()
    cfg = TinyConfig()
    model = build_model(cfg, seed=0)
    ids = tok.render_chat([Message(role="user", content="hi")])   # BOS [USER] h i EOS [ASSISTANT]
"""

from __future__ import annotations

import inspect
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field, model_validator

from evolve.types import Message

if TYPE_CHECKING:  # pragma: no cover
    from transformers import LlamaForCausalLM

SPECIALS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<unk>", "<system>", "<user>", "<assistant>", "<tool>")
ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
DEFAULT_CHARS: str = "".join(chr(c) for c in range(32, 127)) + "\n"


class CharTokenizer:
    """A character-level tokenizer: one id per character, plus special tokens.

    Ids ``0..7`` are the specials ``PAD BOS EOS UNK SYSTEM USER ASSISTANT TOOL``; the characters
    follow (printable ASCII 32..126 and ``"\\n"`` by default). Characters outside the table map to
    ``UNK``. ``EOS`` ends a turn; generation stops when the model samples it.
    """

    def __init__(self, chars: str = DEFAULT_CHARS) -> None:
        if len(set(chars)) != len(chars):
            raise ValueError("CharTokenizer: the character table has duplicates")
        self.chars = chars
        self.specials = SPECIALS
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = 0, 1, 2, 3
        self.role_ids: dict[str, int] = {role: 4 + i for i, role in enumerate(ROLES)}
        self._offset = len(SPECIALS)
        self._char_to_id = {c: self._offset + i for i, c in enumerate(chars)}

    @property
    def vocab_size(self) -> int:
        return self._offset + len(self.chars)

    def __len__(self) -> int:
        return self.vocab_size

    def is_special(self, token_id: int) -> bool:
        return token_id < self._offset

    def encode(self, text: str, context: Sequence[Any] = ()) -> list[int]:
        """Characters to ids (no specials added). ``context`` (the messages before ``text``) is
        ignored here; tokenizers whose ids depend on it (:mod:`evolve.policy.pointer`) use it."""
        get, unk = self._char_to_id.get, self.unk_id
        return [get(c, unk) for c in text]

    def decode(self, ids: Iterable[int], context: Sequence[Any] = ()) -> str:
        """Ids to text; special tokens (including UNK) are skipped. ``context`` as in :meth:`encode`."""
        off, chars, n = self._offset, self.chars, len(self.chars)
        return "".join(chars[i - off] for i in ids if off <= i < off + n)

    def token_text(self, token_id: int) -> str:
        """The text of one token ('' for specials)."""
        return self.decode((token_id,))

    def render_chat(
        self, messages: Sequence[Message | dict], add_generation_prompt: bool = True
    ) -> list[int]:
        """``BOS`` then, per message, ``[ROLE] content EOS``; finally ``[ASSISTANT]`` if asked.

        The rendering is prefix-stable: the rendering of the first ``k`` messages with the
        generation prompt, followed by ``encode(reply) + [EOS]``, is exactly the rendering of the
        chat that ends with that assistant reply (then ``[ASSISTANT]`` again).
        """
        ids = [self.bos_id]
        for m in messages:
            role, content = (m.role, m.content) if isinstance(m, Message) else (m["role"], m["content"])
            if role not in self.role_ids:
                raise ValueError(f"CharTokenizer.render_chat: unknown role {role!r}")
            ids.append(self.role_ids[role])
            ids.extend(self.encode(content))
            ids.append(self.eos_id)
        if add_generation_prompt:
            ids.append(self.role_ids["assistant"])
        return ids

    def to_dict(self) -> dict[str, Any]:
        return {"type": "char", "version": 1, "chars": self.chars, "specials": list(self.specials)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CharTokenizer":
        if data.get("type") != "char" or tuple(data.get("specials", SPECIALS)) != SPECIALS:
            raise ValueError(f"CharTokenizer.from_dict: not a char tokenizer of this version: {data!r:.200}")
        return cls(chars=data["chars"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CharTokenizer) and other.chars == self.chars

    def __repr__(self) -> str:
        return f"CharTokenizer(vocab_size={self.vocab_size})"


class TinyConfig(BaseModel):
    """The architecture of a tiny Llama. The defaults give ~1.8M parameters (with the default
    tokenizer's 104-token vocabulary): 4 layers, width 192, 4 heads, MLP 512, context 512."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    d_model: int = Field(192, gt=0)
    n_layers: int = Field(4, gt=0)
    n_heads: int = Field(4, gt=0)
    n_kv_heads: int | None = None  # grouped-query attention when smaller than n_heads
    d_ff: int = Field(512, gt=0)
    max_len: int = Field(512, gt=1)
    init_std: float = Field(0.02, gt=0)
    rope_theta: float = Field(10000.0, gt=0)
    rms_norm_eps: float = 1e-5
    tie_embeddings: bool = False
    vocab_size: int | None = None  # None: the tokenizer's size, filled in by build_model

    @model_validator(mode="after")
    def _check(self) -> "TinyConfig":
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be a multiple of n_heads ({self.n_heads})")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError("the head size d_model / n_heads must be even (rotary embeddings)")
        if self.n_kv_heads is not None and self.n_heads % self.n_kv_heads:
            raise ValueError("n_heads must be a multiple of n_kv_heads")
        return self

    def llama_config(self, vocab_size: int | None = None, tokenizer: CharTokenizer | None = None) -> Any:
        """The ``transformers.LlamaConfig`` for this architecture."""
        from transformers import LlamaConfig

        tok = tokenizer or CharTokenizer()
        vocab = vocab_size or self.vocab_size or tok.vocab_size
        kwargs: dict[str, Any] = dict(
            vocab_size=vocab,
            hidden_size=self.d_model,
            intermediate_size=self.d_ff,
            num_hidden_layers=self.n_layers,
            num_attention_heads=self.n_heads,
            num_key_value_heads=self.n_kv_heads or self.n_heads,
            max_position_embeddings=self.max_len,
            initializer_range=self.init_std,
            rms_norm_eps=self.rms_norm_eps,
            tie_word_embeddings=self.tie_embeddings,
            pad_token_id=tok.pad_id,
            bos_token_id=tok.bos_id,
            eos_token_id=tok.eos_id,
            use_cache=True,
        )
        try:  # transformers >= 4.5x: rope settings live in rope_parameters
            cfg = LlamaConfig(**kwargs, rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta})
        except TypeError:
            cfg = LlamaConfig(**kwargs, rope_theta=self.rope_theta)
        # sdpa is the fastest path on CPU; eager is the fallback for old versions
        cfg._attn_implementation = "sdpa"
        return cfg


def build_model(cfg: TinyConfig | None = None, seed: int = 0, tokenizer: CharTokenizer | None = None) -> "LlamaForCausalLM":
    """A freshly initialised ``LlamaForCausalLM`` (float32, eval mode) for ``cfg``.

    Deterministic given ``seed``; the global torch RNG is left as it was.
    """
    import torch
    from transformers import LlamaForCausalLM

    cfg = cfg or TinyConfig()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg.llama_config(tokenizer=tokenizer))
    return model.float().eval()


def count_params(model: Any) -> int:
    """Number of parameters (trainable or not)."""
    return sum(p.numel() for p in model.parameters())


# ----------------------------------------------------------------------------- sampling


@dataclass
class Sample:
    """One generated completion (token ids, log-probs, why it ended)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (EOS or a stop string) | "length"
    stop: str | None = None  # the stop string that ended it, if any


def _forward_kwargs(model: Any) -> tuple[str, str | None]:
    """Names of the cache and logits-to-keep arguments across transformers versions."""
    params = inspect.signature(type(model).forward).parameters
    cache = "cache" if "cache" in params else "past_key_values"
    keep = "logits_to_keep" if "logits_to_keep" in params else ("num_logits_to_keep" if "num_logits_to_keep" in params else None)
    return cache, keep


_PREALLOC: Any = None


def _prealloc_layer_class() -> Any:
    """A DynamicLayer that writes into a preallocated buffer instead of ``torch.cat`` per step
    (which copies the whole cache every token and dominated decoding time)."""
    global _PREALLOC
    if _PREALLOC is None:
        from transformers.cache_utils import DynamicLayer

        class PreallocLayer(DynamicLayer):  # type: ignore[misc, valid-type]
            def __init__(self, capacity: int) -> None:
                super().__init__()
                self.capacity, self.n, self.kbuf, self.vbuf = capacity, 0, None, None

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
    if capacity > 0 and isinstance(getattr(cache, "layers", None), list) and len(cache.layers) == model.config.num_hidden_layers:
        try:
            cache.layers = [_prealloc_layer_class()(capacity) for _ in cache.layers]
        except Exception:  # an unexpected transformers layout: keep the plain cache
            pass
    return cache


def _gumbel(seed: int, steps: int, vocab: int) -> "Any":
    import torch

    g = torch.Generator().manual_seed(seed)
    u = torch.rand((steps, vocab), generator=g, dtype=torch.float64)
    return (-torch.log(-torch.log(u.clamp_(1e-12, 1.0 - 1e-12)))).float()


def sample(
    model: Any,
    prompts: Sequence[Sequence[int]],
    *,
    eos_id: int,
    pad_id: int = 0,
    temperatures: Sequence[float] | float = 1.0,
    max_tokens: Sequence[int] | int = 64,
    seeds: Sequence[int | None] | None = None,
    stops: Sequence[Sequence[str] | None] | None = None,
    decode: Callable[[int], str] | None = None,
    prune: float = 0.25,
) -> list[Sample]:
    """Generate one completion per prompt in one batch (the sampling loop the server runs).

    ``model`` is a causal LM (LoRA layers, if injected, apply as they are set). Rows finish on
    EOS, on a stop string (needs ``decode``: token id -> text), or after their ``max_tokens``.
    Finished rows are dropped from the batch (and the KV cache) once they are ``prune`` of it.
    """
    import torch

    B = len(prompts)
    if B == 0:
        return []
    temps = [float(temperatures)] * B if isinstance(temperatures, (int, float)) else [float(t) for t in temperatures]
    max_new = [int(max_tokens)] * B if isinstance(max_tokens, int) else [int(m) for m in max_tokens]
    seeds = list(seeds) if seeds is not None else [None] * B
    stops = [tuple(s or ()) for s in stops] if stops is not None else [()] * B
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
                ids[i, L - len(p):] = torch.tensor(list(p), dtype=torch.long)
                mask[i, L - len(p):] = 1
        pos = (mask.cumsum(1) - 1).clamp_(min=0)
        temp_t = torch.tensor(temps, dtype=torch.float32)
        inv_t = torch.where(temp_t > 0, 1.0 / temp_t.clamp(min=1e-6), torch.ones_like(temp_t))[:, None]
        noise = torch.zeros((B, T, V), dtype=torch.float32)
        for i in range(B):  # per-request noise (CPU generators): the same whatever else is in the batch
            if temps[i] > 0 and max_new[i] > 0:
                seed = seeds[i] if seeds[i] is not None else random.getrandbits(63)
                noise[i, : max_new[i]] = _gumbel(seed, max_new[i], V)
        ids, mask, pos, inv_t, noise = (t.to(dev) for t in (ids, mask, pos, inv_t, noise))

        cache = _new_cache(model, L + T)
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True, **{cache_kw: cache}, **extra)
        logits = out.logits[:, -1].float()
        rows = torch.arange(B, device=dev)  # batch position -> original row
        last_pos = pos[:, -1].clone()
        out_ids: list[list[int]] = [[] for _ in range(B)]
        out_lp: list[list[float]] = [[] for _ in range(B)]
        texts = [""] * B
        results: list[Sample | None] = [None] * B
        for i in range(B):
            if max_new[i] <= 0:
                results[i] = Sample([], [], "length")
        alive = [results[i] is None for i in range(B)]
        for t in range(T):
            r = rows
            logp = torch.log_softmax(logits * inv_t[r], dim=-1)
            tok = (logp + noise[r, t]).argmax(-1)
            lp = logp.gather(1, tok[:, None])[:, 0]
            for j, (orig, tk, l) in enumerate(zip(r.tolist(), tok.tolist(), lp.tolist())):
                if not alive[orig]:
                    continue
                out_ids[orig].append(tk)
                out_lp[orig].append(l)
                if tk == eos_id:
                    results[orig] = Sample(out_ids[orig], out_lp[orig], "stop")
                elif stops[orig]:
                    piece = decode(tk)  # type: ignore[misc]
                    texts[orig] += piece
                    hit = next((s for s in stops[orig] if s in texts[orig][-(len(s) + len(piece)):]), None)
                    if hit is not None:
                        results[orig] = Sample(out_ids[orig], out_lp[orig], "stop", stop=hit)
                if results[orig] is None and len(out_ids[orig]) >= max_new[orig]:
                    results[orig] = Sample(out_ids[orig], out_lp[orig], "length")
                if results[orig] is not None:
                    alive[orig] = False
            keep = [j for j, orig in enumerate(r.tolist()) if alive[orig]]
            if not keep:
                break
            if len(r) - len(keep) >= max(1, int(prune * len(r))):
                keep_t = torch.tensor(keep, dtype=torch.long, device=dev)
                cache.batch_select_indices(keep_t)
                mask, rows, tok, last_pos = mask[keep_t], rows[keep_t], tok[keep_t], last_pos[keep_t]
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
            last_pos = last_pos + 1
            out = model(input_ids=tok[:, None], attention_mask=mask, position_ids=last_pos[:, None],
                        use_cache=True, **{cache_kw: cache}, **extra)
            logits = out.logits[:, -1].float()
    return [s if s is not None else Sample(out_ids[i], out_lp[i], "length") for i, s in enumerate(results)]


__all__ = ["CharTokenizer", "Sample", "TinyConfig", "build_model", "count_params", "sample", "SPECIALS", "ROLES"]
