"""The memory store's data model and guarantees, with known answers: the fold, duplicates,
MERGE / SUPERSEDE / DELETE that keep everything recoverable, versions, restore, views at a
version, hybrid search and its filters. A tiny deterministic embedder; chromadb on disk."""

from __future__ import annotations

import random
import re
from typing import ClassVar

import numpy as np
import pytest

pytest.importorskip("chromadb")

from evolve.memory import HashingEmbedder, Item, LogError, MemoryStore, fold, same_view
from evolve.memory.model import Event, text_hash


@pytest.fixture
def store(tmp_path):
    s = MemoryStore(tmp_path / "mem", embedder=HashingEmbedder())
    yield s
    s.close()


# ----------------------------------------------------------------------------- the fold (no SQLite)


def _add(seq, text, kind="lesson", **meta):
    return Event(seq, "ADD", f"m{seq}", {"kind": kind, "text": text, "hash": text_hash(kind, text), "metadata": meta})


def test_fold_of_a_known_log_gives_the_known_view():
    events = [
        _add(1, "check the schema first"),
        _add(2, "orders.amount is in cents", "fact"),
        _add(3, "use LEFT JOIN for unmatched rows"),
        Event(
            4,
            "MERGE",
            "m4",
            {
                "kind": "lesson",
                "text": "schema first; LEFT JOIN keeps unmatched rows",
                "hash": "h4",
                "sources": ["m1", "m3"],
            },
        ),
        Event(
            5,
            "SUPERSEDE",
            "m5",
            {"kind": "fact", "text": "orders.amount is in euros", "hash": "h5", "old": "m2", "reason": "contradicted"},
        ),
        Event(6, "STRENGTHEN", "m4", {"by": 2}),
        Event(7, "USE", "m4", {"n": 1}),
        _add(8, "temporary note"),
        Event(9, "DELETE", "m8", {"reason": "wrong"}),
    ]
    view = fold(events)
    assert sorted(view) == ["m4", "m5"]
    assert view["m4"].strength == 4.0  # 1 + 1 carried from the sources, + 2
    assert view["m4"].uses == 1 and view["m4"].links == {"merged_from": ["m1", "m3"]}
    assert view["m5"].links == {"supersedes": "m2"}
    everything = fold(events, active_only=False)
    assert {k: v.status for k, v in everything.items()} == {
        "m1": "merged",
        "m2": "superseded",
        "m3": "merged",
        "m4": "active",
        "m5": "active",
        "m8": "deleted",
    }
    assert everything["m2"].links["superseded_by"] == "m5" and everything["m2"].reason == "contradicted"
    assert everything["m8"].reason == "wrong"
    assert fold(events[:3]).keys() == {"m1", "m2", "m3"}  # the view at version 3


def test_fold_refuses_events_that_do_not_fit():
    with pytest.raises(LogError):
        fold([_add(1, "a"), Event(2, "DELETE", "m9", {"reason": "x"})])  # unknown id
    with pytest.raises(LogError):
        fold([_add(1, "a"), Event(2, "DELETE", "m1", {"reason": "x"}), Event(3, "USE", "m1", {})])  # inactive
    with pytest.raises(LogError):
        fold([_add(2, "a"), _add(1, "b")])  # out of order


# ----------------------------------------------------------------------------- writes keep everything


def test_duplicate_add_is_a_noop_that_returns_the_existing_id(store):
    a = store.add("Check the schema before writing SQL.", "lesson")
    v = store.version
    assert store.add("  check the SCHEMA before writing sql ", "lesson") == a  # same normalised text
    assert store.version == v and len(store) == 1  # nothing appended, nothing deleted
    assert store.add("Check the schema before writing SQL.", "fact") != a  # another kind is another item
    assert store.add("Check the schema before writing SQL.", on_duplicate="strengthen") == a
    assert store.get(a).strength == 2.0 and store.get(a).active
    ids = store.add_many([("lesson", "x one"), ("lesson", "X one"), ("fact", "y two")])
    assert ids[0] == ids[1] != ids[2]


def test_merge_keeps_its_sources_recoverable(store):
    a = store.add("check the schema first")
    b = store.add("inspect table columns before querying")
    m = store.merge([a, b], "inspect the schema (tables, columns) before querying")
    assert set(store.view()) == {m}
    assert store.get(m).links["merged_from"] == [a, b] and store.get(m).strength == 2.0
    for src in (a, b):
        it = store.get(src)
        assert it.status == "merged" and it.links["merged_into"] == m and it.text  # still there, linked
    assert [e.op for e in store.history(a)] == ["ADD", "MERGE"]
    store.undelete(a)  # a merged source can come back
    assert set(store.view()) == {m, a} and "merged_into" not in store.get(a).links


def test_delete_is_a_tombstone_that_can_be_undone(store):
    a = store.add("a wrong lesson")
    with pytest.raises(ValueError):
        store.delete(a, "")  # a reason is required
    store.delete(a, "it misled two tasks")
    assert store.view() == {} and store.get(a).status == "deleted" and store.get(a).reason == "it misled two tasks"
    assert store.search("wrong lesson") == []
    store.undelete(a)
    assert list(store.view()) == [a] and store.get(a).reason is None
    assert store.search("wrong lesson")[0].id == a
    assert [e.op for e in store.history(a)] == ["ADD", "DELETE", "RESTORE"]


def test_contradiction_supersedes_and_keeps_both(store):
    old = store.add("orders.amount is stored in cents", "fact")
    new = store.supersede(old, "orders.amount is stored in euros", reason="contradicted by task 17")
    assert list(store.view()) == [new]
    o, n = store.get(old), store.get(new)
    assert o.status == "superseded" and o.links["superseded_by"] == new and o.reason == "contradicted by task 17"
    assert n.kind == "fact" and n.links["supersedes"] == old
    assert [h.id for h in store.search("amount stored", 5)] == [new]


def test_bad_writes_change_nothing(store):
    a = store.add("keep me")
    v = store.version
    with pytest.raises(LogError), store.batch() as b:
        b.add("a new one")
        b.delete("m999", "no such item")  # the whole batch rolls back
    with pytest.raises(LogError):
        store.merge([a, "m404"], "x")
    with pytest.raises(LogError):
        store.add("x", kind="opinion")
    with pytest.raises(ValueError):
        store.add("   ")
    assert store.version == v and list(store.view()) == [a] and store.check()["ok"]


# ----------------------------------------------------------------------------- versions


def _scenario(store):
    a = store.add("check the schema first", metadata={"task": "sql"})
    b = store.add("orders.amount is in cents", "fact", {"task": "sql"})
    c = store.add("use LEFT JOIN for unmatched rows")
    store.strengthen(a)
    m = store.merge([a, c], "schema first; LEFT JOIN keeps unmatched rows")
    store.use(m)
    n = store.supersede(b, "orders.amount is in euros")
    d = store.add("a note to delete")
    store.delete(d, "useless")
    store.weaken(m)
    store.undelete(d)
    return n


def test_restore_to_every_version_gives_exactly_its_items(store):
    _scenario(store)
    head = store.version
    snapshots = {k: store.view(k) for k in range(head + 1)}
    assert snapshots[0] == {} and len(snapshots[3]) == 3
    for k in list(range(head + 1)) + [head, 2]:
        before = store.version
        new = store.restore(k)
        assert new >= before and same_view(store.view(), snapshots[k]), k
        assert store.view(k) == snapshots[k]  # history is never rewritten
    assert store.check()["ok"]


def test_views_at_a_version_and_snapshot_refs(store, tmp_path):
    _scenario(store)
    ref = store.snapshot_ref()
    assert ref == {"store": str(tmp_path / "mem"), "version": store.version}
    store.add("something learned later about the schema")
    view = MemoryStore.open_at(ref["store"], ref["version"], embedder=HashingEmbedder())
    assert same_view(view.view(), store.view(ref["version"])) and view.version == ref["version"]
    assert "later" not in " ".join(h.text for h in view.search("schema", 10))
    early = store.at(3)
    assert {h.id for h in early.search("schema", 5)} >= {"m1"}  # m1 was merged later, active at 3
    with pytest.raises(ValueError):
        store.at(10_000)


def test_random_histories_stay_consistent(store):
    rng = random.Random(7)
    words = ["schema", "join", "amount", "cents", "euros", "table", "rows", "column", "index", "query", "date", "null"]
    for _ in range(120):
        active = list(store.view())
        everything = [i.id for i in store.items(include_inactive=True)]
        r = rng.random()
        text = " ".join(rng.sample(words, 3))
        if r < 0.4 or not active:
            store.add(text, rng.choice(["lesson", "fact", "experience"]))
        elif r < 0.5 and len(active) >= 2:
            srcs = rng.sample(active, 2)
            if store.get(srcs[0]).kind == store.get(srcs[1]).kind:
                store.merge(srcs, text)
        elif r < 0.6:
            store.supersede(rng.choice(active), text)
        elif r < 0.7:
            store.delete(rng.choice(active), "random")
        elif r < 0.8:
            inactive = [i for i in everything if i not in active]
            if inactive:
                store.undelete(rng.choice(inactive))
        elif r < 0.9:
            store.strengthen(rng.choice(active))
        else:
            store.restore(rng.randrange(store.version + 1))
    assert same_view(store.view(), fold(store.events()))
    report = store.check()
    assert report["ok"], report


# ----------------------------------------------------------------------------- search


class ConceptEmbedder:
    """Words map to concepts (synonyms share one); other words (codes, names) embed to nothing."""

    name, dim = "concepts", 4
    CONCEPTS: ClassVar[dict[str, int]] = {
        "car": 0,
        "automobile": 0,
        "vehicle": 0,
        "bread": 1,
        "bake": 1,
        "oven": 1,
        "sql": 2,
        "join": 2,
        "query": 2,
        "museum": 3,
        "painting": 3,
    }

    def embed(self, texts):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for r, t in enumerate(texts):
            for w in re.findall(r"[a-z]+", t.lower()):
                if w in self.CONCEPTS:
                    out[r, self.CONCEPTS[w]] += 1.0
        n = np.linalg.norm(out, axis=1, keepdims=True)
        return out / np.where(n == 0, 1, n)


@pytest.fixture(params=["chroma", "exact"])
def concept_store(tmp_path, request):
    """Searched through chromadb (written at once, no exact path), or exactly from the log's vectors."""
    chroma = request.param == "chroma"
    s = MemoryStore(tmp_path / "concepts", embedder=ConceptEmbedder(), index_lag=0 if chroma else 64)
    if chroma:
        s.live.brute_max = 0
    s.add_many(
        [
            ("fact", "The automobile would not start in the cold"),
            ("lesson", "Bake bread in a hot oven"),
            ("lesson", "An SQL join needs matching keys", {"task": "sql", "split": 1}),
            ("fact", "Ticket QZ7781 was escalated to billing", {"task": "support"}),
            ("experience", "Visited the museum to see a painting", {"task": "art", "done": True}),
        ]
    )
    yield s
    s.close()


def test_hybrid_search_finds_keyword_only_and_embedding_only_matches(concept_store):
    s = concept_store
    car = s.search("my car is broken", 3)  # no shared keyword: found by the embedding alone
    assert car[0].text.startswith("The automobile") and car[0].keyword == 0.0 and car[0].similarity > 0.9
    code = s.search("QZ7781", 3)  # embeds to nothing: found by BM25 alone
    assert code[0].text.startswith("Ticket QZ7781") and code[0].similarity == 0.0 and code[0].keyword == 1.0
    assert s.search("QZ7781", 3, alpha=1.0) == []  # embeddings only: nothing
    assert s.search("my car is broken", 3, alpha=0.0) == []  # keywords only: nothing


def test_search_filters_kinds_metadata_and_similarity(concept_store):
    s = concept_store
    assert [h.item.kind for h in s.search("automobile oven join painting", 10, kinds="lesson")] == ["lesson"] * 2
    assert [h.text for h in s.search("join query", 5, where={"task": "sql"})] == ["An SQL join needs matching keys"]
    assert s.search("join query", 5, where={"task": "art"}) == []
    assert s.search("join", 5, where={"split": True}) == []  # 1 is not True
    assert len(s.search("painting", 5, where={"done": True})) == 1
    assert s.search("painting", 5, where={"done": 1}) == []
    with pytest.raises(ValueError):
        s.search("x", kinds=["opinion"])
    close = s.search("car oven", 5, min_similarity=0.5)  # cos 0.707 to each of the two matching items
    assert {h.text.split()[1] for h in close} == {"automobile", "bread"}
    assert s.search("car oven", 5, min_similarity=0.8) == []
    s.delete(s.search("QZ7781", 1)[0].id, "closed")
    assert s.search("QZ7781", 3) == []  # only active items are returned


def test_search_over_many_items_uses_the_index_and_stays_exact(tmp_path):
    s = MemoryStore(tmp_path / "many", embedder=HashingEmbedder(64))
    s.live.brute_max = 100  # make the filtered paths go through chroma
    rng = random.Random(0)
    texts = [
        f"note {i} about {rng.choice(['cats', 'dogs', 'owls'])} and {rng.choice(['rivers', 'hills'])} code{i}"
        for i in range(3000)
    ]
    ids = s.add_many([("lesson" if i % 4 else "fact", t, {"group": i % 10}) for i, t in enumerate(texts)])
    assert len(set(ids)) == 3000 and s.check()["ok"]
    top = s.search("code1234", 1)
    assert top[0].text.startswith("note 1234 ")
    facts = s.search("owls hills", 20, kinds="fact")  # a quarter of the items: over-fetch and filter
    assert len(facts) == 20 and all(h.item.kind == "fact" for h in facts)
    g3 = s.search("owls hills", 50, where={"group": 3}, alpha=1.0)  # a tenth: chroma searches those ids only
    exact = s.at(s.version).search("owls hills", 50, where={"group": 3}, alpha=1.0)  # exact (numpy) search
    assert len(g3) == 50 and all(h.item.metadata["group"] == 3 for h in g3)
    assert len({h.id for h in g3} & {h.id for h in exact}) >= 45  # HNSW is approximate
    with s.batch() as b:
        for i in ids[:2500]:
            b.delete(i, "bulk")
    rest = s.search("owls hills rivers", 50)  # most items inactive: still 50 active answers
    assert len(rest) == 50 and all(h.item.active for h in rest)
    s.close()


def test_item_roundtrip_and_store_refuses_another_embedder(store, tmp_path):
    a = store.add("x y z", metadata={"k": [1, 2]})
    it = store.get(a)
    assert Item.from_dict(it.to_dict()) == it
    store.close()
    with pytest.raises(ValueError, match="embedder"):
        MemoryStore(tmp_path / "mem", embedder=HashingEmbedder(dim=32))
