"""The vector index: a chromadb PersistentClient collection in the store's directory, and the
cross-process lock that serialises writes to it.

The index holds one vector per item ever created (items' texts never change, so a vector never
changes either); activity is not stored in chroma but filtered on our side, because chroma's
metadata-filtered queries cost 0.2-0.9 s at 100k items on the dev machine against 3-4 ms
unfiltered. Writes are idempotent adds by id, so re-applying the log after a crash is safe.

chromadb's local client caches its HNSW index in memory and does not see vectors that another
process added until it writes itself; the store compensates (see ``MemoryStore._vector_hits``).
"""

from __future__ import annotations

import fcntl
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from .catalog import Catalog

COLLECTION = "evolve-memory"


class IndexMiss(LookupError):
    """chromadb refused a query (e.g. an id filter naming a vector this client cannot see)."""


class ChromaIndex:
    def __init__(self, directory: str | Path, *, collection: str = COLLECTION) -> None:
        from evolve._env import quiet_defaults

        quiet_defaults()
        self.directory = Path(directory)
        self.collection_name = collection
        self._client: Any = None
        self._col: Any = None
        self.open()

    def open(self) -> None:
        import chromadb
        from chromadb.config import Settings

        if not self.directory.exists():  # a system cached for this path would point at deleted files
            self._forget()
        self._client = chromadb.PersistentClient(
            path=str(self.directory), settings=Settings(anonymized_telemetry=False)
        )
        self._col = self._client.get_or_create_collection(
            self.collection_name, configuration={"hnsw": {"space": "cosine"}}, embedding_function=None
        )

    def reload(self) -> None:
        """A fresh client that reads the collection from disk again (sees other processes' writes)."""
        self._forget()
        self.open()

    def _forget(self) -> None:
        """chromadb (1.x) caches one system per path and process, and a new client on the same path
        reuses it; drop this path's entry so the next client is really new. Clients others hold
        keep working on the old system; other paths are not touched."""
        from chromadb.api.shared_system_client import SharedSystemClient as S

        key = str(self.directory)
        lock = getattr(S, "_refcount_lock", None)
        table = getattr(S, "_identifier_to_system", None)
        if lock is None or not isinstance(table, dict):
            S.clear_system_cache()
            return
        with lock:
            table.pop(key, None)
            getattr(S, "_identifier_to_refcount", {}).pop(key, None)

    def add(self, ids: Sequence[str], vectors: np.ndarray, kinds: Sequence[str]) -> None:
        """Add vectors; ids already present are left as they are (chromadb ignores them), which is
        what re-applying the log needs: an item's vector never changes. (``add`` costs less than
        ``upsert``: 28 vs 36 ms per single call at 10k items on the dev machine.)"""
        for b in range(0, len(ids), 4096):
            self._col.add(
                ids=list(ids[b : b + 4096]),
                embeddings=np.asarray(vectors[b : b + 4096], dtype=np.float32),
                metadatas=[{"kind": k} for k in kinds[b : b + 4096]],
            )

    def query(self, vector: np.ndarray, n: int, ids: Sequence[str] | None = None) -> list[tuple[str, float]]:
        """The ``n`` nearest (id, cosine similarity), optionally only among ``ids`` (all must exist)."""
        if n <= 0 or (ids is not None and not ids):
            return []
        from chromadb.errors import ChromaError

        kw = {"ids": list(ids)} if ids is not None else {}
        try:
            r = self._col.query(
                query_embeddings=[np.asarray(vector, dtype=np.float32)], n_results=int(n), include=["distances"], **kw
            )
        except ChromaError as e:
            raise IndexMiss(str(e)) from e
        return [(i, 1.0 - float(d)) for i, d in zip(r["ids"][0], r["distances"][0])]

    def count(self) -> int:
        return self._col.count()

    def ids(self) -> set[str]:
        out: set[str] = set()
        total, off = self.count(), 0
        while off < total:
            got = self._col.get(include=[], limit=10000, offset=off)["ids"]
            if not got:
                break
            out.update(got)
            off += len(got)
        return out

    def close(self) -> None:
        self._client = self._col = None


class IndexLock:
    """Serialises index maintenance across the threads of a process (a lock) and across
    processes (``flock`` on a file in the store directory)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._thread = threading.RLock()

    @contextmanager
    def hold(self) -> Iterator[None]:
        with self._thread:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)


WATERMARK = "indexed"  # log meta key: every item created at seq <= this has its vector in chroma


class LiveIndex:
    """The derived indexes of a live store, kept up to its log: the chroma collection (shared by
    all processes, through the ``indexed`` watermark) and this process's :class:`Catalog`.

    ``fresh`` is the watermark when this process's chroma client loaded: every item created at
    or before it is visible to the client, and so is every item this process added (``own``).
    Other items (created later by other processes: the "tail") are searched exactly from the
    vectors in the log; when the tail grows past ``tail_limit`` the client is reloaded.

    ``index_lag``: how many events past the watermark a write may leave for later (0: every
    write adds its vectors to chroma before it returns). Waiting items are part of the tail, so
    searches stay exact; they reach chroma at the next write past the lag, a search past the
    lag, ``sync()``, the store's close, or the next open (in any process).
    """

    def __init__(self, directory: str | Path, log: Any, *, tail_limit: int = 512, index_lag: int = 64) -> None:
        from .model import KINDS

        self.log = log
        self.tail_limit = tail_limit
        self.index_lag = max(0, min(int(index_lag), tail_limit // 2))
        self.brute_max = 300  # allowed sets this small are searched exactly from the log's vectors (~7 µs each)
        self.lock = IndexLock(Path(directory) / "index.lock")
        self.catalog = Catalog(KINDS)
        self._cat_lock = threading.Lock()
        self._tail_lock = threading.Lock()  # fresh / own are read and moved by concurrent searches
        self.own: set[str] = set()
        with self.lock.hold():
            self.fresh = int(log.get_meta(WATERMARK, "0"))
            self.chroma = ChromaIndex(Path(directory) / "chroma")
            if self.fresh and self.chroma.count() == 0:  # the index folder was lost: rebuild it from the log
                self._set_watermark(0)
                self.fresh = 0

    def watermark(self) -> int:
        return int(self.log.get_meta(WATERMARK, "0"))

    def _set_watermark(self, v: int) -> None:
        c = self.log.conn()
        c.execute("PRAGMA synchronous=OFF")  # losing it only means re-applying idempotent adds
        try:
            with self.log.write() as w:
                self.log.set_meta(WATERMARK, v, w)
        finally:
            c.execute(f"PRAGMA synchronous={'FULL' if self.log.durable else 'NORMAL'}")

    def behind(self) -> int:
        """Events in the log past the watermark."""
        with self.log.read() as c:
            return self.log.version(c) - int(self.log.get_meta(WATERMARK, "0", c))

    def maybe_sync(self) -> int:
        """``sync()`` when more than ``index_lag`` events wait for the index."""
        return self.sync() if self.behind() > self.index_lag else 0

    def sync(self) -> int:
        """Add the vectors of every item created past the watermark, then advance it.
        Returns how many vectors it wrote."""
        ids: list[str] = []
        with self.lock.hold():
            done = self.watermark()
            head = self.log.version()
            if head <= done:
                return 0
            rows = (
                self.log.conn()
                .execute(
                    "SELECT v.id, v.vec, i.kind FROM vectors v JOIN items i ON i.id = v.id "
                    "WHERE v.seq > ? AND v.seq <= ? ORDER BY v.seq",
                    (done, head),
                )
                .fetchall()
            )
            if rows:
                ids = [r[0] for r in rows]
                self.chroma.add(
                    ids, np.stack([np.frombuffer(r[1], dtype=np.float32) for r in rows]), [r[2] for r in rows]
                )
            self._set_watermark(head)
        if ids:  # until this line they count as others' (searched from the log): slower, still right
            with self._tail_lock:
                self.own.update(ids)
        return len(ids)

    def rebuild(self) -> int:
        with self.lock.hold():
            self.chroma._client.delete_collection(self.chroma.collection_name)
            self.chroma.reload()
            self.own.clear()
            self.fresh = 0
            self._set_watermark(0)
        return self.sync()

    def catch_up(self) -> None:
        """Bring the catalog up to the log (rows touched since the version it reflects)."""
        with self._cat_lock:
            with self.log.read() as c:
                v = self.log.version(c)
                if v == self.catalog.seen:
                    return
                rows = self.log.changed_since(self.catalog.seen, c)
            self.catalog.update(rows)
            self.catalog.seen = v

    def _tail(self) -> np.ndarray:
        """Catalog indices of the items this process's chroma client may not see. Also moves
        ``fresh`` up to just below the first of them (or to the newest item when there is none),
        so that the next call looks only at newer items."""
        cat = self.catalog
        idx = np.flatnonzero(cat.created.view > self.fresh)
        if not len(idx):
            return idx
        own = np.zeros(len(idx), dtype=bool)
        if self.own:
            own = np.fromiter((cat.ids[i] in self.own for i in idx), dtype=bool, count=len(idx))
        tail = idx[~own]
        created = cat.created.view
        self.fresh = int(created[tail].min()) - 1 if len(tail) else int(created[idx].max())
        self.own = {i for i in self.own if int(i[1:]) > self.fresh}  # ids are "m<seq of creation>"
        return tail

    def vector_hits(self, qv: np.ndarray, n: int, mask: np.ndarray) -> list[tuple[str, float]]:
        """The ``n`` most similar (id, cosine) among the catalog items where ``mask`` is true."""
        cat = self.catalog
        with self._tail_lock:
            tail = self._tail()
            if len(tail) > self.tail_limit:  # many foreign writes: load the index from disk again
                with self.lock.hold():
                    self.fresh = self.watermark()
                    self.chroma.reload()
                    self.own.clear()
                tail = self._tail()
        visible = mask.copy()
        visible[tail] = False
        hits: list[tuple[str, float]] = []
        m = int(visible.sum())
        if 0 < m <= self.brute_max:  # few allowed items: exact, from the log's vectors
            hits = self._brute(np.flatnonzero(visible), qv)
        elif m:
            frac = m / max(len(cat), 1)
            fetch = int(n / frac * 1.3) + 10
            done = False
            if frac >= 0.25 or fetch <= 400:  # mostly allowed: over-fetch unfiltered, filter here
                got = self.chroma.query(qv, fetch)
                hits = [(i, s) for i, s in got if i in cat.pos and visible[cat.pos[i]]]
                done = len(hits) >= n or len(got) < fetch
            if not done:  # selective filters: let chroma search among the allowed ids only
                allowed = np.flatnonzero(visible)
                try:
                    hits = self.chroma.query(qv, n, ids=[cat.ids[i] for i in allowed])
                except IndexMiss:  # an id the client cannot see: exact search from the log instead
                    hits = self._brute(allowed, qv)
        tail = tail[mask[tail]] if len(tail) else tail
        if len(tail):
            hits += self._brute(tail, qv)
        hits.sort(key=lambda t: -t[1])
        return hits[:n]

    def _brute(self, idx: np.ndarray, qv: np.ndarray) -> list[tuple[str, float]]:
        ids = [self.catalog.ids[i] for i in idx]
        got = self.log.vectors(ids)
        return [(i, float(np.dot(got[i], qv))) for i in ids if i in got]

    def close(self) -> None:
        self.chroma.close()
