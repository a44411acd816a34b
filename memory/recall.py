"""Recall for anything that serves a system outside the engine (the gateway): the items a system's
memory gives for a query, from the store as it was at the version the system names.

``System.memory`` is ``{"store": path, "version": k, "k": 3, "kinds": ["experience"],
"min_similarity": 0.2, "embedder": "minilm" | "hashing"}``; views are cached per (store, version).
Registered as :data:`evolve.registry.recallers` ``memory``.
"""

from __future__ import annotations

import threading
from typing import Any

_VIEWS: dict[tuple[str, int, str], Any] = {}
_LOCK = threading.Lock()


def view(spec: dict) -> Any:
    """The read-only store view ``spec`` names (cached)."""
    key = (str(spec["store"]), int(spec["version"]), str(spec.get("embedder", "minilm")))
    with _LOCK:
        v = _VIEWS.get(key)
        if v is None:
            from evolve.memory import HashingEmbedder, MemoryStore

            embedder = HashingEmbedder() if key[2] == "hashing" else None
            v = _VIEWS[key] = MemoryStore.open_at(key[0], key[1], embedder=embedder)
        return v


def recall(spec: dict | None, query: str) -> list[dict[str, Any]]:
    """``[{"id", "text", "metadata", "similarity"}]``: the ``k`` best items for ``query``."""
    if not spec or not spec.get("store") or spec.get("version") is None:
        return []
    k = int(spec.get("k", 3))
    if k <= 0 or not query.strip():
        return []
    hits = view(spec).search(query, k, kinds=spec.get("kinds") or None, min_similarity=spec.get("min_similarity"))
    return [
        {
            "id": h.item.id,
            "text": h.item.text,
            "metadata": dict(h.item.metadata),
            "similarity": round(float(h.similarity), 4),
        }
        for h in hits
    ]
