"""Memory store vs Mem0 (open-source ``mem0.Memory``): add and search latency and throughput at
10k and 100k items, side by side in one run, on the same texts, the same embedding model
(all-MiniLM-L6-v2 from the local PyPI package) and the same vector store (chroma, local path).

    .venv/bin/python bench/layers/memory_speed.py                        # 10k and 100k (tens of minutes)
    .venv/bin/python bench/layers/memory_speed.py --sizes 2000 --adds 50 --queries 50 --batch 100   # a quick look

What is measured, per size N (both systems hold the same N items first):

* single add: ``store.add(text, kind)`` vs ``Memory.add(text, user_id=..., infer=False)``, one new
  text at a time (``--adds`` texts, the same for both, interleaved ours / Mem0), each with its
  own embedding computed by the system itself; p50 / p95 / mean and adds/s. Twice: ours with
  ``index_lag=0`` (each add written to chroma before it returns), then with the default lag
  (chroma writes batched; searches stay exact); adds/s include the final flush.
* batch add: ``store.add_many(B)`` vs ``Memory.add([B messages], infer=False)`` (Mem0's only
  multi-item add: it embeds and inserts the messages one by one); items/s.
* search: ``store.search(q, k)`` (hybrid: embeddings + BM25; and ``alpha=1``, embeddings only)
  vs ``Memory.search(q, top_k=k, filters={"user_id": ...})`` (Mem0 requires a user/agent/run
  filter; with chroma it is semantic only), interleaved per query; p50 / p95 / queries/s, and
  the overlap of the top-k ids of our embedding-only search with Mem0's (same model: the
  results should agree).

How the N items get there (not part of the measurements): the corpus is embedded once in
batches with our MiniLM embedder (cached under ``--workdir``); our store is built with
``add_many`` over those cached vectors (its normal write path: log, items, vectors, chroma),
Mem0's by inserting the same vectors into its chroma collection in batches with the payload
``Memory.add(infer=False)`` writes (``data``, ``hash``, timestamps, ``user_id``, ``role``,
``text_lemmatized``, the metadata), without its history rows. Mem0 has no batch add that
would do this in reasonable time: 100k single adds take over an hour on 2 cores.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import sys
import time
import uuid
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from memory_data import make_queries, make_texts

USER = "bench"


def stats(lat: list[float]) -> dict[str, float]:
    a = np.sort(np.asarray(lat)) * 1000
    return {
        "n": len(a),
        "p50_ms": float(np.percentile(a, 50)),
        "p95_ms": float(np.percentile(a, 95)),
        "mean_ms": float(a.mean()),
        "per_s": float(1000 / a.mean()),
    }


class CachedEmbedder:
    """Serves the corpus vectors computed once; anything else goes to the real model."""

    def __init__(self, inner, cache: dict[str, np.ndarray]) -> None:
        self.inner, self.cache = inner, cache
        self.name, self.dim = inner.name, inner.dim

    def embed(self, texts):
        missing = [t for t in texts if t not in self.cache]
        got = dict(zip(missing, self.inner.embed(missing))) if missing else {}
        return np.stack([self.cache[t] if t in self.cache else got[t] for t in texts]).astype(np.float32)


def corpus_vectors(texts: list[str], embedder, cache_file: Path) -> np.ndarray:
    if cache_file.exists():
        vecs = np.load(cache_file)
        if len(vecs) >= len(texts):
            return vecs[: len(texts)]
    t0 = time.perf_counter()
    out = []
    for b in range(0, len(texts), 2048):
        out.append(embedder.embed(texts[b : b + 2048]))
        print(f"  embedded {b + len(out[-1])}/{len(texts)} ({time.perf_counter() - t0:.0f} s)", flush=True)
    vecs = np.concatenate(out)
    np.save(cache_file, vecs)
    return vecs


def mem0_memory(folder: Path):
    from mem0 import Memory

    from evolve.memory.embed import minilm_path

    return Memory.from_config(
        {
            "vector_store": {
                "provider": "chroma",
                "config": {"collection_name": "bench", "path": str(folder / "chroma")},
            },
            "embedder": {"provider": "huggingface", "config": {"model": minilm_path(), "embedding_dims": 384}},
            # never called with infer=False; an unroutable local address so that it could not reach anything
            "llm": {
                "provider": "openai",
                "config": {"api_key": "unused-offline", "openai_base_url": "http://127.0.0.1:9/v1"},
            },
            "history_db_path": str(folder / "history.db"),
        }
    )


def mem0_bulk_insert(m, entries: list[tuple[str, str]], vecs: np.ndarray) -> None:
    now = dt.datetime.now(dt.UTC).isoformat()
    for b in range(0, len(entries), 5000):
        chunk = entries[b : b + 5000]
        payloads = [
            {
                "data": t,
                "hash": hashlib.md5(t.encode()).hexdigest(),
                "created_at": now,
                "updated_at": now,
                "user_id": USER,
                "role": "user",
                "text_lemmatized": t,
                "kind": k,
            }
            for k, t in chunk
        ]
        m.vector_store.insert(
            vectors=vecs[b : b + len(chunk)].tolist(), payloads=payloads, ids=[str(uuid.uuid4()) for _ in chunk]
        )


def run_size(n: int, args, ours_embedder, work: Path, all_texts, all_vecs) -> dict:
    from evolve.memory import MemoryStore

    entries, vecs = all_texts[:n], all_vecs[:n]
    folder = work / f"n{n}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    res: dict = {"items": n}

    print(f"[{n}] building our store (add_many over cached vectors)", flush=True)
    cache = {t: v for (_, t), v in zip(entries, vecs)}
    store = MemoryStore(folder / "ours", embedder=CachedEmbedder(ours_embedder, cache))
    t0 = time.perf_counter()
    for b in range(0, n, 5000):
        store.add_many(entries[b : b + 5000])
    res["ours_build_s"] = time.perf_counter() - t0
    cache.clear()  # from here on every text is embedded by the model
    print(f"[{n}] building Mem0's store (batch insert into its chroma collection)", flush=True)
    mem = mem0_memory(folder / "mem0")
    t0 = time.perf_counter()
    mem0_bulk_insert(mem, entries, vecs)
    res["mem0_build_s"] = time.perf_counter() - t0
    assert len(store) == n and mem.vector_store.collection.count() == n

    # search: first our catalog load, then warm-up, then interleaved measurements
    queries = make_queries(args.queries + 5, seed=7 + n)
    t0 = time.perf_counter()
    store.search(queries[0], args.k)
    res["ours_first_search_s"] = time.perf_counter() - t0  # loads the in-process BM25 catalog of n items
    for q in queries[:5]:
        store.search(q, args.k)
        store.search(q, args.k, alpha=1.0)
        mem.search(q, top_k=args.k, filters={"user_id": USER})
    lat = {"ours_hybrid": [], "ours_vector": [], "mem0": []}
    overlap = []
    print(f"[{n}] searching ({args.queries} queries, k={args.k})", flush=True)
    for q in queries[5:]:
        t0 = time.perf_counter()
        store.search(q, args.k)
        t1 = time.perf_counter()
        vec = store.search(q, args.k, alpha=1.0)
        t2 = time.perf_counter()
        m0 = mem.search(q, top_k=args.k, filters={"user_id": USER})["results"]
        t3 = time.perf_counter()
        lat["ours_hybrid"].append(t1 - t0)
        lat["ours_vector"].append(t2 - t1)
        lat["mem0"].append(t3 - t2)
        ours_texts, their_texts = {h.text for h in vec}, {r["memory"] for r in m0}
        overlap.append(len(ours_texts & their_texts) / max(len(their_texts), 1))
    res["search"] = {k: stats(v) for k, v in lat.items()}
    res["search_top_k_overlap_vector_vs_mem0"] = float(np.mean(overlap))

    # single adds, interleaved, each system embedding its own text; ours first with every add
    # written to chroma before it returns (index_lag=0), then with the default index_lag
    res["add"] = {}
    lag = store.live.index_lag
    for phase, (our_lag, seed) in {"sync": (0, 1000 + n), "default": (lag, 3000 + n)}.items():
        singles = make_texts(args.adds, seed=seed)
        store.live.index_lag = our_lag
        lat = {"ours": [], "mem0": []}
        print(f"[{n}] single adds ({args.adds}, our index_lag={our_lag})", flush=True)
        store.add("warm-up " + singles[0][1], singles[0][0])
        mem.add("warm-up " + singles[0][1], user_id=USER, infer=False, metadata={"kind": singles[0][0]})
        for kind, text in singles:
            t0 = time.perf_counter()
            store.add(text, kind)
            t1 = time.perf_counter()
            mem.add(text, user_id=USER, infer=False, metadata={"kind": kind})
            t2 = time.perf_counter()
            lat["ours"].append(t1 - t0)
            lat["mem0"].append(t2 - t1)
        t0 = time.perf_counter()
        store.sync()  # what still waits for the index is part of our cost
        flush = time.perf_counter() - t0
        res["add"][phase] = {
            "index_lag": our_lag,
            "ours": stats(lat["ours"]),
            "mem0": stats(lat["mem0"]),
            "ours_final_flush_ms": flush * 1000,
            "ours_per_s_with_flush": len(singles) / (sum(lat["ours"]) + flush),
        }

    # batch adds: the same B new texts for both
    batch = make_texts(args.batch, seed=2000 + n)
    print(f"[{n}] batch add ({args.batch})", flush=True)
    t0 = time.perf_counter()
    store.add_many(batch)
    t1 = time.perf_counter()
    mem.add([{"role": "user", "content": t} for _, t in batch], user_id=USER, infer=False)
    t2 = time.perf_counter()
    res["batch_add"] = {
        "ours_items_per_s": args.batch / (t1 - t0),
        "mem0_items_per_s": args.batch / (t2 - t1),
        "ours_s": t1 - t0,
        "mem0_s": t2 - t1,
        "size": args.batch,
    }
    report = store.check()
    res["ours_check_ok"] = report["ok"]
    res["ours_items_after"] = len(store)
    res["mem0_items_after"] = mem.vector_store.collection.count()
    store.close()
    del mem
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return res


def table(results: list[dict]) -> str:
    rows = ["| items | measure | ours | Mem0 | ours / Mem0 |", "|---|---|---|---|---|"]

    def row(n, what, a, b, unit, better_low=True):
        ratio = (b / a) if better_low else (a / b)
        rows.append(
            f"| {n:,} | {what} | {a:,.1f} {unit} | {b:,.1f} {unit} | {ratio:.2f}x {'faster' if ratio > 1 else 'slower'} |"
        )

    for r in results:
        n, s, b = r["items"], r["search"], r["batch_add"]
        for a in r["add"].values():
            how = f"index_lag={a['index_lag']}"
            row(n, f"single add p50 ({how})", a["ours"]["p50_ms"], a["mem0"]["p50_ms"], "ms")
            row(n, f"single add p95 ({how})", a["ours"]["p95_ms"], a["mem0"]["p95_ms"], "ms")
            row(
                n,
                f"single adds / s ({how}; ours incl. final flush)",
                a["ours_per_s_with_flush"],
                a["mem0"]["per_s"],
                "/s",
                better_low=False,
            )
        row(
            n,
            f"batch add ({b['size']} items) items / s",
            b["ours_items_per_s"],
            b["mem0_items_per_s"],
            "/s",
            better_low=False,
        )
        row(n, "search p50 (ours hybrid)", s["ours_hybrid"]["p50_ms"], s["mem0"]["p50_ms"], "ms")
        row(n, "search p95 (ours hybrid)", s["ours_hybrid"]["p95_ms"], s["mem0"]["p95_ms"], "ms")
        row(n, "search p50 (ours embeddings only)", s["ours_vector"]["p50_ms"], s["mem0"]["p50_ms"], "ms")
        row(n, "search p95 (ours embeddings only)", s["ours_vector"]["p95_ms"], s["mem0"]["p95_ms"], "ms")
        row(n, "searches / s (ours hybrid)", s["ours_hybrid"]["per_s"], s["mem0"]["per_s"], "/s", better_low=False)
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--adds", type=int, default=200, help="single adds measured per size and system")
    ap.add_argument("--batch", type=int, default=500, help="items in the measured batch add")
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch threads while measuring (both systems): one sentence per call runs faster on one "
        "thread of 2 cores, and does not fight other jobs on a shared machine",
    )
    ap.add_argument("--embed-threads", type=int, default=2, help="torch threads for embedding the corpus")
    ap.add_argument("--workdir", default="/tmp/evolve-memory-bench")
    ap.add_argument("--keep", action="store_true", help="keep the stores on disk")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("MEM0_DIR", str(work / "mem0-home"))  # Mem0 writes its config there, not in ~
    from evolve._env import quiet_defaults

    quiet_defaults()
    import torch

    torch.set_num_threads(args.embed_threads)
    from evolve.memory import MiniLMEmbedder

    ours_embedder = MiniLMEmbedder()
    top = max(args.sizes)
    all_texts = make_texts(top, seed=0)
    print(f"embedding the corpus ({top} texts, cached in {work})", flush=True)
    all_vecs = corpus_vectors([t for _, t in all_texts], ours_embedder, work / f"corpus_{top}.npy")
    torch.set_num_threads(args.torch_threads)
    results = []
    for n in sorted(args.sizes):
        t0 = time.perf_counter()
        results.append(run_size(n, args, ours_embedder, work, all_texts, all_vecs))
        results[-1]["wall_s"] = time.perf_counter() - t0
        print(json.dumps(results[-1], indent=1), flush=True)
    meta = {
        "date": dt.datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "torch_threads": args.torch_threads,
        "k": args.k,
        "command": " ".join([".venv/bin/python", "bench/layers/memory_speed.py", *sys.argv[1:]]),
    }
    if args.out:
        Path(args.out).write_text(json.dumps({"meta": meta, "results": results}, indent=1))
    print(json.dumps(meta))
    print(table(results))


if __name__ == "__main__":
    main()
