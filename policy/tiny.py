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

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

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

    def render_chat(self, messages: Sequence[Message | dict], add_generation_prompt: bool = True) -> list[int]:
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
    def from_dict(cls, data: dict[str, Any]) -> CharTokenizer:
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
    def _check(self) -> TinyConfig:
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
            cfg = LlamaConfig(**kwargs, rope_theta=self.rope_theta)  # type: ignore[call-arg]  # transformers < 4.5x
        # sdpa is the fastest path on CPU; eager is the fallback for old versions
        cfg._attn_implementation = "sdpa"
        return cfg


def build_model(
    cfg: TinyConfig | None = None, seed: int = 0, tokenizer: CharTokenizer | None = None
) -> LlamaForCausalLM:
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


# the sampler lives in evolve.policy.sampling; re-exported here, where it was first
from evolve.policy.sampling import Sample, sample  # noqa: E402

__all__ = ["CharTokenizer", "Sample", "TinyConfig", "build_model", "count_params", "sample", "SPECIALS", "ROLES"]
