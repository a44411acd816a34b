"""Hybrid retrieval (embedding similarity + BM25 keywords), shared by the live store and by
read-only views at a past version, and :class:`MemoryView` itself.

Scoring: every candidate (the best ``n`` by embedding and the best ``n`` by BM25, among the
allowed items) gets its exact cosine similarity to the query and its BM25 score divided by the
best BM25 score of the query; ``score = alpha * max(similarity, 0) + (1 - alpha) * keyword``.
``min_similarity`` drops candidates whose cosine similarity is below it (keyword matches too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .catalog import Catalog
from .embed import Embedder
from .model import KINDS, Item, fold

VectorHits = Callable[[np.ndarray, int, np.ndarray], list[tuple[str, float]]]


@dataclass(frozen=True)
class Hit:
    item: Item
    score: float  # the fused score results are ranked by
    similarity: float  # cosine similarity of the query and item embeddings
    keyword: float  # BM25 score / the query's best BM25 score (0 when no keyword matched)

    @property
    def id(self) -> str:
        return self.item.id

    @property
    def text(self) -> str:
        return self.item.text


def check_kinds(kinds: Iterable[str] | str | None) -> list[str] | None:
    if kinds is None:
        return None
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown kind(s) {bad}; kinds are {KINDS}")
    return kinds


def hybrid(
    query: str,
    qv: np.ndarray,
    k: int,
    *,
    catalog: Catalog,
    mask: np.ndarray,
    vector_hits: VectorHits,
    vectors: Callable[[Sequence[str]], Mapping[str, np.ndarray]],
    items: Callable[[Sequence[str]], Mapping[str, Item]],
    min_similarity: float | None,
    alpha: float,
) -> list[Hit]:
    if k <= 0 or not mask.any():
        return []
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must lie in [0, 1], got {alpha}")
    n = max(4 * k, 40)
    sims = dict(vector_hits(qv, n, mask)) if alpha > 0 or min_similarity is not None else {}
    kw = catalog.bm25(query, n, mask) if alpha < 1 else []
    best_kw = kw[0][1] if kw else 1.0
    kws = {i: s / best_kw for i, s in kw}
    missing = [i for i in kws if i not in sims]
    if missing:
        got = vectors(missing)
        for i in missing:
            if i in got:
                sims[i] = float(np.dot(got[i], qv))
    scored = []
    for i, sim in sims.items():
        if min_similarity is not None and sim < min_similarity:
            continue
        key = kws.get(i, 0.0)
        if sim <= 0.0 and key <= 0.0:  # neither similar nor sharing a keyword: not a match
            continue
        scored.append((alpha * max(sim, 0.0) + (1 - alpha) * key, sim, key, i))
    scored.sort(key=lambda t: (-t[0], -t[1], t[3]))
    top = scored[: 2 * k]
    got_items = items([t[3] for t in top])
    out = [
        Hit(got_items[i], float(s), float(sim), float(key))
        for s, sim, key, i in top
        if i in got_items and got_items[i].active
    ]
    return out[:k]


def metadata_matches(meta: Mapping[str, Any], where: Mapping[str, Any] | None) -> bool:
    for key, value in (where or {}).items():
        if key not in meta:
            return False
        have = meta[key]
        if isinstance(value, bool) or isinstance(have, bool):
            if type(have) is not type(value) or have != value:
                return False
        elif have != value:
            return False
    return True


class MemoryView:
    """The store as it was at ``version``: read-only, with the same ``search`` as the live store
    (exact vector search over the items active at that version, BM25 over their texts)."""

    def __init__(self, log: Any, version: int, embedder: Embedder, *, name: str = "") -> None:
        head = log.version()
        if not 0 <= version <= head:
            raise ValueError(f"version {version} does not exist (the store is at {head})")
        self._log = log
        self.version = version
        self.embedder = embedder
        self.name = name
        self._all = fold(log.events(upto=version), active_only=False)
        self.catalog = Catalog(KINDS)
        self.catalog.update((it.id, it.kind, it.text, it.status, it.created) for it in self._all.values())
        self.catalog.seen = version
        self._matrix: np.ndarray | None = None

    def view(self) -> dict[str, Item]:
        return {k: v for k, v in self._all.items() if v.active}

    def get(self, item_id: str) -> Item | None:
        return self._all.get(item_id)

    def snapshot_ref(self) -> dict[str, Any]:
        return {"store": self.name, "version": self.version}

    def _vectors(self) -> np.ndarray:
        if self._matrix is None:
            got = self._log.vectors(self.catalog.ids)
            m = np.zeros((len(self.catalog.ids), self.embedder.dim), dtype=np.float32)
            for j, i in enumerate(self.catalog.ids):
                m[j] = got[i]
            self._matrix = m
        return self._matrix

    def _vector_hits(self, qv: np.ndarray, n: int, mask: np.ndarray) -> list[tuple[str, float]]:
        idx = np.flatnonzero(mask)
        sims = self._vectors()[idx] @ qv
        top = np.argsort(-sims, kind="stable")[:n]
        return [(self.catalog.ids[idx[j]], float(sims[j])) for j in top]

    def search(
        self,
        query: str,
        k: int = 5,
        *,
        kinds: Iterable[str] | str | None = None,
        where: Mapping[str, Any] | None = None,
        min_similarity: float | None = None,
        alpha: float = 0.7,
    ) -> list[Hit]:
        kinds = check_kinds(kinds)
        ids = (
            [i for i, it in self._all.items() if it.active and metadata_matches(it.metadata, where)] if where else None
        )
        mask = self.catalog.mask(kinds, ids)
        qv = self.embedder.embed([query])[0]
        return hybrid(
            query,
            qv,
            k,
            catalog=self.catalog,
            mask=mask,
            vector_hits=self._vector_hits,
            vectors=lambda ids: {i: self._vectors()[self.catalog.pos[i]] for i in ids},
            items=lambda ids: {i: self._all[i] for i in ids if i in self._all},
            min_similarity=min_similarity,
            alpha=alpha,
        )

    def __len__(self) -> int:
        return sum(1 for it in self._all.values() if it.active)

    def __repr__(self) -> str:
        return f"MemoryView({self.name or Path('.')!s}, version={self.version}, items={len(self)})"
