"""Experience memory: an append-only event log (ADD / MERGE / SUPERSEDE / DELETE / RESTORE and
usage / strength counters) in SQLite, folded into the active items; a chromadb vector index and
a BM25 keyword index derived from it; hybrid search; versions that a System can record and
re-open; curators that decide the updates (heuristic, LLM). See memory/README.md and docs/memory.md.

* the store — ``model`` (items, events, the fold), ``log`` (the SQLite event log and items
  table), ``batch`` (several ops in one transaction), ``store`` (:class:`MemoryStore`);
* search — ``embed`` (embedders: MiniLM, hashing), ``index`` (the chromadb vector index),
  ``catalog`` (the in-process item mirror and BM25 keyword index), ``search`` (hybrid search, views);
* updates — ``base`` (the Curator protocol, Op, Evidence), ``curator`` (the heuristic curator and
  ``apply``), ``llm_curator`` (an LLM decides);
* ``operator`` — the ``memory`` operator for the engine.

    from evolve.memory import MemoryStore, HeuristicCurator, apply
    store = MemoryStore("runs/memory")                 # all-MiniLM-L6-v2 + chroma, offline
    mid = store.add("Check the schema before writing SQL.", kind="lesson")
    hits = store.search("schema first?", k=3)
    ref = store.snapshot_ref()                         # {"store": ..., "version": k}
    old = MemoryStore.open_at(ref["store"], ref["version"])

Everything is imported lazily: ``import evolve.memory`` loads neither numpy, chromadb nor
sentence-transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "MemoryStore": "store",
    "Batch": "batch",
    "MemoryView": "search",
    "Hit": "search",
    "Item": "model",
    "Event": "model",
    "LogError": "model",
    "fold": "model",
    "same_view": "model",
    "normalize_text": "model",
    "text_hash": "model",
    "KINDS": "model",
    "Embedder": "embed",
    "MiniLMEmbedder": "embed",
    "HashingEmbedder": "embed",
    "Op": "base",
    "Evidence": "base",
    "Curator": "base",
    "apply": "curator",
    "HeuristicCurator": "curator",
    "LLMCurator": "llm_curator",
}
# the curators' names until 2026-12-06 ("policy" names the weights layer): still resolved, with a warning
_DEPRECATED = {"Policy": "Curator", "HeuristicPolicy": "HeuristicCurator", "LLMPolicy": "LLMCurator"}

__all__ = [  # noqa: RUF022 (grouped by module, as _EXPORTS)
    "MemoryStore",
    "Batch",
    "MemoryView",
    "Hit",
    "Item",
    "Event",
    "LogError",
    "fold",
    "same_view",
    "normalize_text",
    "text_hash",
    "KINDS",
    "Embedder",
    "MiniLMEmbedder",
    "HashingEmbedder",
    "Op",
    "Evidence",
    "Curator",
    "apply",
    "HeuristicCurator",
    "LLMCurator",
]


def __getattr__(name: str) -> Any:
    if name in _DEPRECATED:
        import warnings

        warnings.warn(
            f"evolve.memory.{name} is deprecated: it is evolve.memory.{_DEPRECATED[name]}",
            DeprecationWarning,
            stacklevel=2,
        )
        return __getattr__(_DEPRECATED[name])
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'evolve.memory' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
