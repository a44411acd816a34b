"""MemoryStore: an append-only event log in SQLite (the truth) with a chromadb vector index and
an in-process BM25 index derived from it. See memory/README.md for the guarantees.

Write path (one batch = one transaction): embed the new texts (outside any lock) -> BEGIN
IMMEDIATE -> validate and append the events, update the items table, store the vectors ->
COMMIT -> bring the chroma index up to the log (under a cross-process lock, idempotent
adds past the ``indexed`` watermark, then advance the watermark) — at once with
``index_lag=0``, else once more than ``index_lag`` events wait (and at search, sync, close,
open). Searches read the vectors of waiting items from the log, so they stay exact. A crash
between COMMIT and the index leaves events past the watermark; the next open (or a later
write, search or sync, in any process) applies them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from . import model as M
from .batch import Batch, Intent
from .embed import Embedder, MiniLMEmbedder
from .index import LiveIndex
from .log import EventLog
from .model import Event, Item, LogError, fold, item_id, text_hash
from .search import Hit, MemoryView, check_kinds, hybrid

if TYPE_CHECKING:
    from typing import Self


def _made(results: Sequence[str | None]) -> list[str]:
    """The ids a batch of creating writes gave back: every one of them has one."""
    ids = [r for r in results if r is not None]
    assert len(ids) == len(results), "a creating write gave no id"
    return ids


class MemoryStore:
    """A memory store in directory ``path`` (created if missing): ``memory.db`` (the log),
    ``chroma/`` (the vector index), ``index.lock``."""

    def __init__(
        self,
        path: str | Path,
        *,
        embedder: Embedder | None = None,
        durable: bool = True,
        tail_limit: int = 512,
        index_lag: int = 64,
    ) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.embedder = embedder if embedder is not None else MiniLMEmbedder()
        self.log = EventLog(self.path / "memory.db", durable=durable)
        self._check_embedder()
        self.live = LiveIndex(self.path, self.log, tail_limit=tail_limit, index_lag=index_lag)
        self.repair()

    # ------------------------------------------------------------------ opening / refs

    @classmethod
    def open_at(cls, path: str | Path, version: int, *, embedder: Embedder | None = None) -> MemoryView:
        """A read-only view of the store at ``path`` as it was at ``version``."""
        path = Path(path)
        if not (path / "memory.db").exists():
            raise FileNotFoundError(f"no memory store at {path}")
        log = EventLog(path / "memory.db", readonly=True)
        return MemoryView(log, int(version), embedder if embedder is not None else MiniLMEmbedder(), name=str(path))

    def at(self, version: int) -> MemoryView:
        return MemoryView(self.log, int(version), self.embedder, name=str(self.path))

    def snapshot_ref(self) -> dict[str, Any]:
        """What a System records about the memory it ran with: ``{"store": path, "version": k}``."""
        return {"store": str(self.path), "version": self.version}

    def _check_embedder(self) -> None:
        name, dim = self.embedder.name, str(self.embedder.dim)
        have = self.log.get_meta("embedder"), self.log.get_meta("dim")
        if have == (None, None):
            with self.log.write() as c:
                self.log.set_meta("embedder", name, c)
                self.log.set_meta("dim", dim, c)
        elif have != (name, dim):
            raise ValueError(f"{self.path} was built with embedder {have[0]} ({have[1]} dims), not {name} ({dim})")

    # ------------------------------------------------------------------ writes

    def batch(self) -> Batch:
        return Batch(self._commit)

    def add(
        self,
        text: str,
        kind: str = "lesson",
        metadata: Mapping[str, Any] | None = None,
        *,
        strength: float = 1.0,
        on_duplicate: str = "noop",
    ) -> str:
        """Add an item; an exact duplicate (same kind, same normalised text, active) adds nothing
        and returns the existing id (``on_duplicate='strengthen'`` also strengthens it)."""
        with self.batch() as b:
            b.add(text, kind, metadata, strength=strength, on_duplicate=on_duplicate)
        return _made(b.results)[0]

    def add_many(
        self, entries: Iterable[tuple[str, str] | tuple[str, str, Mapping[str, Any]] | Mapping[str, Any]]
    ) -> list[str]:
        """Add many items in one transaction and one embedding batch. Entries are ``(kind, text)``,
        ``(kind, text, metadata)`` or dicts with ``text``, ``kind``, ``metadata``."""
        b = self.batch()
        for e in entries:
            if isinstance(e, Mapping):
                b.add(e["text"], e.get("kind", "lesson"), e.get("metadata"))
            else:
                b.add(e[1], e[0], e[2] if len(e) > 2 else None)
        return _made(b.commit())

    def merge(
        self, ids: Sequence[str], text: str, kind: str | None = None, metadata: Mapping[str, Any] | None = None
    ) -> str:
        with self.batch() as b:
            b.merge(ids, text, kind, metadata)
        return _made(b.results)[0]

    def supersede(
        self,
        old: str,
        text: str,
        kind: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> str:
        with self.batch() as b:
            b.supersede(old, text, kind, metadata, reason)
        return _made(b.results)[0]

    def _single(self, method: str, *args: Any, **kw: Any) -> int:
        with self.batch() as b:
            getattr(b, method)(*args, **kw)
        return self.version

    def delete(self, item: str, reason: str) -> int:
        return self._single("delete", item, reason)

    def undelete(self, item: str) -> int:
        """Make a deleted (or merged / superseded) item active again."""
        return self._single("undelete", item)

    def use(self, item: str, n: int = 1) -> int:
        return self._single("use", item, n)

    def strengthen(self, item: str, by: float = 1.0, reason: str | None = None) -> int:
        return self._single("strengthen", item, by, reason)

    def weaken(self, item: str, by: float = 1.0, reason: str | None = None) -> int:
        return self._single("weaken", item, by, reason)

    def restore(self, version: int) -> int:
        """Append the events that make the active view equal to the one at ``version`` (nothing is
        rewritten; ``view(version)`` stays as it was). Returns the new version."""
        with self.log.write() as c:
            head = self.log.version(c)
            if not 0 <= version <= head:
                raise ValueError(f"version {version} does not exist (the store is at {head})")
            then = fold(self.log.events(upto=version, c=c), active_only=False)
            now = self.log.all_items(active_only=False, c=c)
            seq = head
            for iid, it in now.items():
                old = then.get(iid)
                if old is None:
                    if it.active:
                        seq += 1
                        self.log.append(c, seq, M.DELETE, iid, {"reason": f"restore to version {version}"})
                elif (it.active or old.active) and any(getattr(it, f) != getattr(old, f) for f in M.MUTABLE):
                    seq += 1
                    state = {f: getattr(old, f) for f in M.MUTABLE}
                    state["links"] = dict(old.links)
                    self.log.append(c, seq, M.RESTORE, iid, {"state": state, "to_version": version})
            new_version = seq
        self.live.maybe_sync()
        return new_version

    def _commit(self, intents: list[Intent]) -> list[str | None]:
        if not intents:
            return []
        for it in intents:
            if it.text is not None and not str(it.text).strip():
                raise ValueError(f"{it.op}: empty text")
        # 1. embed what may be new, outside any lock (duplicates of active items are skipped)
        vecs: dict[str, np.ndarray] = {}  # text -> vector
        todo = [
            it.text
            for it in intents
            if it.text is not None
            and it.op in M.CREATING
            and not (
                it.op == M.ADD and self.log.find_active(it.kind or "lesson", text_hash(it.kind or "lesson", it.text))
            )
        ]
        todo = list(dict.fromkeys(todo))
        if todo:
            vecs = dict(zip(todo, self.embedder.embed(todo)))
        # 2. one transaction for the whole batch
        results: list[str | None] = []
        with self.log.write() as c:
            seq = self.log.version(c)
            for it in intents:
                op, data = it.op, dict(it.data)
                if op in M.CREATING:
                    text = it.text
                    assert text is not None  # a creating intent carries its text (Batch.add, merge, supersede)
                    kind, meta = it.kind, it.metadata
                    if op != M.ADD:
                        kind, meta = self._inherit(op, data, kind, meta, c)
                    kind = kind or "lesson"
                    if kind not in M.KINDS:
                        raise LogError(f"{op}: kind must be one of {M.KINDS}, got {kind!r}")
                    h = text_hash(kind, text)
                    if op == M.ADD:
                        on_dup = data.pop("on_duplicate", "noop")
                        dup = self.log.find_active(kind, h, c)
                        if dup is not None:
                            if on_dup == "strengthen":
                                seq += 1
                                self.log.append(c, seq, M.STRENGTHEN, dup, {"by": 1.0, "reason": "duplicate add"})
                            results.append(dup)
                            continue
                    if text not in vecs:  # it was a duplicate a moment ago, is not any more
                        vecs[text] = self.embedder.embed([text])[0]
                    seq += 1
                    data.update(kind=kind, text=text, hash=h, metadata=dict(meta or {}))
                    self.log.append(c, seq, op, item_id(seq), data, vec=vecs[text])
                    results.append(item_id(seq))
                else:
                    seq += 1
                    self.log.append(c, seq, op, it.item, {k: v for k, v in data.items() if v is not None})
                    results.append(it.item)
        # 3. bring the index up to the log (or leave up to index_lag events for later: reads stay exact)
        self.live.maybe_sync()
        return results

    def _inherit(self, op: str, data: dict, kind: str | None, meta: Mapping | None, c) -> tuple[str | None, Mapping]:
        srcs = list(data["sources"]) if op == M.MERGE else [data["old"]]
        got = self.log.items_by_id(srcs, c)
        missing = [s for s in srcs if s not in got]
        if missing:
            raise LogError(f"{op}: unknown item(s) {missing}")
        if kind is None:
            kinds = {got[s].kind for s in srcs}
            if len(kinds) != 1:
                raise LogError(f"{op}: sources of different kinds {sorted(kinds)}; give the kind")
            kind = kinds.pop()
        if meta is None:
            meta = {}
            for s in srcs:
                meta = {**meta, **got[s].metadata}
        return kind, meta

    # ------------------------------------------------------------------ the index

    def repair(self) -> int:
        """Apply to the vector index whatever the log has past the watermark (a crash between the
        two). Runs on open; safe to call any time. Returns how many vectors it wrote."""
        return self.live.sync()

    def reindex(self) -> int:
        """Rebuild the vector index from the vectors kept in the log."""
        return self.live.rebuild()

    # ------------------------------------------------------------------ reads

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
        """The ``k`` best active items for ``query`` by hybrid score (see ``evolve.memory.search``).
        ``kinds`` restricts the kinds, ``where`` requires metadata keys equal to the given scalars,
        ``min_similarity`` drops items whose embedding cosine similarity is below it, ``alpha``
        weighs embedding similarity against keywords (1: embeddings only, 0: keywords only)."""
        kinds = check_kinds(kinds)
        self.live.maybe_sync()
        self.live.catch_up()
        allowed = self.log.ids_where(kinds, where) if where else None
        mask = self.live.catalog.mask(kinds, allowed)
        qv = self.embedder.embed([query])[0]
        return hybrid(
            query,
            qv,
            k,
            catalog=self.live.catalog,
            mask=mask,
            vector_hits=self.live.vector_hits,
            vectors=self.log.vectors,
            items=self.log.items_by_id,
            min_similarity=min_similarity,
            alpha=alpha,
        )

    @property
    def version(self) -> int:
        return self.log.version()

    def get(self, item: str) -> Item | None:
        return self.log.items_by_id([item]).get(item)

    def items(self, *, kinds: Iterable[str] | str | None = None, include_inactive: bool = False) -> list[Item]:
        kinds = check_kinds(kinds)
        out = self.log.all_items(active_only=not include_inactive).values()
        return [it for it in out if kinds is None or it.kind in kinds]

    def view(self, version: int | None = None) -> dict[str, Item]:
        """The active items (id -> Item) at ``version`` (default: now), folded from the log."""
        if version is None:
            return self.log.all_items(active_only=True)
        head = self.version
        if not 0 <= version <= head:
            raise ValueError(f"version {version} does not exist (the store is at {head})")
        return fold(self.log.events(upto=version))

    def events(self, since: int = 0, upto: int | None = None) -> list[Event]:
        return list(self.log.events(since=since, upto=upto))

    def history(self, item: str) -> list[Event]:
        """Every event that touched ``item`` (created, merged, superseded, deleted, counted it)."""
        return self.log.history(item)

    def record_rejection(self, source: str, reason: str, raw: str | None = None, context: Any = None) -> int:
        return self.log.add_rejection(source, reason, raw, context)

    def rejections(self) -> list[dict[str, Any]]:
        return self.log.rejections()

    def check(self) -> dict[str, Any]:
        """Consistency report: the items table equals the fold of the log, and the vector index
        holds exactly the items ever created (after catching up). ``ok`` is True when both hold."""
        self.live.sync()
        folded = fold(self.log.events(), active_only=False)
        table = self.log.all_items(active_only=False)
        view_ok = folded.keys() == table.keys() and all(folded[k].to_dict() == table[k].to_dict() for k in folded)
        in_index = self.live.chroma.ids()
        return {
            "ok": view_ok and in_index == set(folded),
            "view_matches_log": view_ok,
            "index_matches_log": in_index == set(folded),
            "missing_from_index": sorted(set(folded) - in_index),
            "unknown_in_index": sorted(in_index - set(folded)),
            "version": self.version,
            "watermark": self.live.watermark(),
        }

    def __len__(self) -> int:
        return self.log.conn().execute("SELECT COUNT(*) FROM items WHERE status = 'active'").fetchone()[0]

    def sync(self) -> int:
        """Bring the vector index up to the log now; returns how many vectors it added."""
        return self.live.sync()

    def close(self) -> None:
        """Flush what waits for the index (``index_lag``), then release the store."""
        if getattr(self, "_closed", False):
            return
        self._closed = True
        try:
            self.live.sync()
        finally:
            self.live.close()
            self.log.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MemoryStore({str(self.path)!r}, version={self.version})"
