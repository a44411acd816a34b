"""The SQLite side of the store: the append-only event log (the truth), the items table (the
head view, kept in the same transaction as each event by the same :func:`apply_event` that
:func:`fold` uses), the items' vectors, small metadata, and the rejected-decisions table.

Every write is one ``BEGIN IMMEDIATE`` transaction (WAL, busy timeout), so threads and
processes writing the same file serialise on SQLite's write lock and no event is lost.
Connections are per thread (and per process: a forked child opens its own).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from .model import CREATING, Event, Item, apply_event

SCHEMA = """
CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, op TEXT NOT NULL, item TEXT, data TEXT NOT NULL,
                                   ts REAL NOT NULL);
CREATE TABLE IF NOT EXISTS touches (item TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (item, seq)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS items (id TEXT PRIMARY KEY, kind TEXT NOT NULL, text TEXT NOT NULL, hash TEXT NOT NULL,
                                  metadata TEXT NOT NULL, status TEXT NOT NULL, created INTEGER NOT NULL,
                                  updated INTEGER NOT NULL, strength REAL NOT NULL, uses INTEGER NOT NULL,
                                  links TEXT NOT NULL, reason TEXT);
CREATE INDEX IF NOT EXISTS items_dup ON items (kind, hash) WHERE status = 'active';
CREATE INDEX IF NOT EXISTS items_updated ON items (updated);
CREATE TABLE IF NOT EXISTS vectors (seq INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, vec BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS rejections (n INTEGER PRIMARY KEY AUTOINCREMENT, version INTEGER NOT NULL, ts REAL NOT NULL,
                                       source TEXT NOT NULL, reason TEXT NOT NULL, raw TEXT, context TEXT);
"""

ITEM_COLS = "id, kind, text, hash, metadata, status, created, updated, strength, uses, links, reason"


def _dumps(x: Any) -> str:
    return json.dumps(x, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def row_item(r: tuple) -> Item:
    return Item(
        id=r[0],
        kind=r[1],
        text=r[2],
        hash=r[3],
        metadata=json.loads(r[4]),
        status=r[5],
        created=r[6],
        updated=r[7],
        strength=r[8],
        uses=r[9],
        links=json.loads(r[10]),
        reason=r[11],
    )


def row_event(r: tuple) -> Event:
    return Event(seq=r[0], op=r[1], item=r[2], data=json.loads(r[3]), ts=r[4])


class EventLog:
    def __init__(
        self,
        path: str | Path,
        *,
        durable: bool = True,
        timeout: float = 60.0,
        readonly: bool = False,
        leave_no_files: bool = False,
    ) -> None:
        """``readonly``: SQLite ``mode=ro``. ``leave_no_files`` (with ``readonly``, for a reader that
        closes the log soon, the dashboard): opened ``immutable`` while no writer has it open, so no
        ``-wal`` or ``-shm`` is created beside it (:mod:`evolve.archive.readonly`)."""
        self.path = Path(path)
        self.durable = durable
        self.timeout = timeout
        self.readonly = readonly
        self.leave_no_files = readonly and leave_no_files
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        if not readonly:
            c = self.conn()
            c.execute("PRAGMA journal_mode=WAL")
            with self.write() as w:
                for stmt in SCHEMA.strip().split(";"):
                    if stmt.strip():
                        w.execute(stmt)

    # ------------------------------------------------------------------ connections

    def conn(self) -> sqlite3.Connection:
        c = getattr(self._local, "c", None)
        if c is None or self._local.pid != os.getpid():
            if self.leave_no_files:
                from evolve.archive.readonly import connect_read_only

                c = connect_read_only(self.path, timeout=self.timeout)[0]
            elif self.readonly:
                c = sqlite3.connect(
                    f"{self.path.resolve().as_uri()}?mode=ro",
                    uri=True,
                    timeout=self.timeout,
                    isolation_level=None,
                    check_same_thread=False,
                )
            else:
                c = sqlite3.connect(str(self.path), timeout=self.timeout, isolation_level=None, check_same_thread=False)
                c.execute(f"PRAGMA synchronous={'FULL' if self.durable else 'NORMAL'}")
            c.execute(f"PRAGMA busy_timeout={int(self.timeout * 1000)}")
            self._local.c, self._local.pid = c, os.getpid()
            with self._lock:
                self._all.append(c)
        return c

    def close(self) -> None:
        with self._lock:
            for c in self._all:
                try:
                    c.close()
                except sqlite3.Error:
                    pass
            self._all.clear()
        self._local = threading.local()

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: BEGIN IMMEDIATE (takes the write lock, waits up to the busy
        timeout), COMMIT on success, ROLLBACK on any exception."""
        c = self.conn()
        for attempt in range(50):
            try:
                c.execute("BEGIN IMMEDIATE")
                break
            except sqlite3.OperationalError as e:  # busy past the timeout, or a locked WAL reset
                if "locked" not in str(e) or attempt == 49:
                    raise
                time.sleep(0.01 * (attempt + 1))
        try:
            yield c
        except BaseException:
            c.execute("ROLLBACK")
            raise
        c.execute("COMMIT")

    @contextmanager
    def read(self) -> Iterator[sqlite3.Connection]:
        """A consistent read snapshot (a deferred transaction) over several statements."""
        c = self.conn()
        c.execute("BEGIN")
        try:
            yield c
        finally:
            c.execute("COMMIT")

    # ------------------------------------------------------------------ events

    def version(self, c: sqlite3.Connection | None = None) -> int:
        return (c or self.conn()).execute("SELECT COALESCE(MAX(seq), 0) FROM events").fetchone()[0]

    def append(
        self,
        c: sqlite3.Connection,
        seq: int,
        op: str,
        item: str | None,
        data: Mapping[str, Any],
        vec: np.ndarray | None = None,
    ) -> tuple[Event, dict[str, Item]]:
        """Inside a write transaction: validate ``op`` against the current items, then write the
        event, the changed item rows and (for a new item) its vector. Raises LogError before
        writing anything when the event does not fit."""
        ev = Event(seq=seq, op=op, item=item, data=dict(data), ts=time.time())
        state = self.items_by_id(ev.touched()[1 if op in CREATING else 0 :], c)
        changed = apply_event(state, ev)
        c.execute(
            "INSERT INTO events (seq, op, item, data, ts) VALUES (?,?,?,?,?)", (seq, op, item, _dumps(ev.data), ev.ts)
        )
        c.executemany("INSERT OR IGNORE INTO touches (item, seq) VALUES (?,?)", [(i, seq) for i in ev.touched()])
        self.save_items(c, [state[i] for i in changed])
        if op in CREATING:
            if vec is None:
                raise ValueError(f"{op} needs the new item's vector")
            c.execute(
                "INSERT INTO vectors (seq, id, vec) VALUES (?,?,?)",
                (seq, item, np.asarray(vec, dtype=np.float32).tobytes()),
            )
        return ev, {i: state[i] for i in changed}

    def events(
        self, *, since: int = 0, upto: int | None = None, c: sqlite3.Connection | None = None
    ) -> Iterator[Event]:
        c = c or self.conn()
        sql, args = "SELECT seq, op, item, data, ts FROM events WHERE seq > ?", [since]
        if upto is not None:
            sql, args = sql + " AND seq <= ?", args + [upto]
        for r in c.execute(sql + " ORDER BY seq", args):
            yield row_event(r)

    def history(self, item: str) -> list[Event]:
        rows = (
            self.conn()
            .execute(
                "SELECT e.seq, e.op, e.item, e.data, e.ts FROM touches t JOIN events e ON e.seq = t.seq "
                "WHERE t.item = ? ORDER BY e.seq",
                (item,),
            )
            .fetchall()
        )
        return [row_event(r) for r in rows]

    def count_ops(self, item: str, op: str) -> int:
        return (
            self.conn()
            .execute(
                "SELECT COUNT(*) FROM touches t JOIN events e ON e.seq = t.seq WHERE t.item = ? AND e.op = ?",
                (item, op),
            )
            .fetchone()[0]
        )

    # ------------------------------------------------------------------ items

    def save_items(self, c: sqlite3.Connection, items: Iterable[Item]) -> None:
        c.executemany(
            f"INSERT OR REPLACE INTO items ({ITEM_COLS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            [
                (
                    it.id,
                    it.kind,
                    it.text,
                    it.hash,
                    _dumps(dict(it.metadata)),
                    it.status,
                    it.created,
                    it.updated,
                    float(it.strength),
                    int(it.uses),
                    _dumps(dict(it.links)),
                    it.reason,
                )
                for it in items
            ],
        )

    def items_by_id(self, ids: Iterable[str], c: sqlite3.Connection | None = None) -> dict[str, Item]:
        ids = list(dict.fromkeys(ids))
        c = c or self.conn()
        out: dict[str, Item] = {}
        for b in range(0, len(ids), 500):
            chunk = ids[b : b + 500]
            q = f"SELECT {ITEM_COLS} FROM items WHERE id IN ({','.join('?' * len(chunk))})"
            out.update((r[0], row_item(r)) for r in c.execute(q, chunk))
        return out

    def all_items(self, *, active_only: bool = True, c: sqlite3.Connection | None = None) -> dict[str, Item]:
        q = f"SELECT {ITEM_COLS} FROM items" + (" WHERE status = 'active'" if active_only else "") + " ORDER BY created"
        return {r[0]: row_item(r) for r in (c or self.conn()).execute(q)}

    def find_active(self, kind: str, h: str, c: sqlite3.Connection | None = None) -> str | None:
        r = (
            (c or self.conn())
            .execute(
                "SELECT id FROM items WHERE kind = ? AND hash = ? AND status = 'active' ORDER BY created LIMIT 1",
                (kind, h),
            )
            .fetchone()
        )
        return r[0] if r else None

    def changed_since(self, seq: int, c: sqlite3.Connection) -> list[tuple]:
        """(id, kind, text, status, created) of the items touched after ``seq``."""
        return c.execute(
            "SELECT id, kind, text, status, created FROM items WHERE updated > ? ORDER BY created", (seq,)
        ).fetchall()

    def ids_where(self, kinds: Iterable[str] | None, where: Mapping[str, Any] | None) -> list[str]:
        """Active ids of the given kinds whose metadata has each ``where`` key equal to its value."""
        sql, args = "SELECT id FROM items WHERE status = 'active'", []
        if kinds:
            kinds = list(kinds)
            sql += f" AND kind IN ({','.join('?' * len(kinds))})"
            args += kinds
        for k, v in (where or {}).items():
            if isinstance(v, (dict, list)):
                raise TypeError(f"where: only scalar equality filters are supported ({k!r})")
            if v is None:
                sql += " AND json_type(metadata, ?) = 'null'"
                args.append(_json_path(k))
            else:
                is_bool = "IN" if isinstance(v, bool) else "NOT IN"  # JSON true is 1 to SQL: keep them apart
                sql += f" AND json_extract(metadata, ?) = ? AND json_type(metadata, ?) {is_bool} ('true', 'false')"
                args += [_json_path(k), v, _json_path(k)]
        return [r[0] for r in self.conn().execute(sql, args)]

    # ------------------------------------------------------------------ vectors, meta, rejections

    def vectors(self, ids: Iterable[str]) -> dict[str, np.ndarray]:
        ids = list(dict.fromkeys(ids))
        out: dict[str, np.ndarray] = {}
        c = self.conn()
        for b in range(0, len(ids), 500):
            chunk = ids[b : b + 500]
            for i, blob in c.execute(f"SELECT id, vec FROM vectors WHERE id IN ({','.join('?' * len(chunk))})", chunk):
                out[i] = np.frombuffer(blob, dtype=np.float32)
        return out

    def created_between(self, lo: int, hi: int) -> list[tuple[int, str, bytes]]:
        """(seq, id, vector bytes) of the items created at lo < seq <= hi."""
        return (
            self.conn()
            .execute("SELECT seq, id, vec FROM vectors WHERE seq > ? AND seq <= ? ORDER BY seq", (lo, hi))
            .fetchall()
        )

    def get_meta(self, key: str, default: str | None = None, c: sqlite3.Connection | None = None) -> str | None:
        r = (c or self.conn()).execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return r[0] if r else default

    def set_meta(self, key: str, value: Any, c: sqlite3.Connection | None = None) -> None:
        (c or self.conn()).execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, str(value)))

    def add_rejection(self, source: str, reason: str, raw: str | None, context: Any = None) -> int:
        with self.write() as c:
            cur = c.execute(
                "INSERT INTO rejections (version, ts, source, reason, raw, context) VALUES (?,?,?,?,?,?)",
                (self.version(c), time.time(), source, reason, raw, None if context is None else _dumps(context)),
            )
            assert cur.lastrowid is not None  # an INSERT sets it
            return cur.lastrowid

    def rejections(self) -> list[dict[str, Any]]:
        rows = self.conn().execute("SELECT n, version, ts, source, reason, raw, context FROM rejections ORDER BY n")
        return [
            {
                "n": r[0],
                "version": r[1],
                "ts": r[2],
                "source": r[3],
                "reason": r[4],
                "raw": r[5],
                "context": None if r[6] is None else json.loads(r[6]),
            }
            for r in rows
        ]


def _json_path(key: str) -> str:
    return '$."' + key.replace('"', '\\"') + '"'
