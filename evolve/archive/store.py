"""The :class:`Archive`: its connection, transactions, current pointer, run state, events
and usage totals; systems, trajectories and export come from the mixins next to it."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from evolve.archive._checkpoint import BACKSTOP_PAGES, Checkpointer
from evolve.archive._schema import ARTIFACTS_DIR, DB_NAME, SCHEMA, SCHEMA_VERSION, migrate, split_sql
from evolve.archive.export import ExportMixin
from evolve.archive.readonly import ReadOnly
from evolve.archive.systems import SystemsMixin
from evolve.archive.trajectories import TrajectoriesMixin
from evolve.artifacts import ArtifactStore
from evolve.errors import ArchiveError, RunDirError
from evolve.types import JSON

_EVENT_KEYS = frozenset({"seq", "kind", "created_at"})  # added to every event by Archive.events

_FORKED_CONNECTIONS: list[sqlite3.Connection] = []  # see Archive.close


class Archive(SystemsMixin, TrajectoriesMixin, ExportMixin):
    """Systems, lineage, trajectories, scores, the current pointer and run state of one run.

    ``Archive(run_dir)`` creates ``run_dir/archive.sqlite`` and ``run_dir/artifacts/`` when
    missing; with ``create=False`` a missing archive raises :class:`RunDirError`.
    ``compress`` is the zlib level for the JSON of new systems and trajectories: 0 (the
    default) stores raw JSON; 1 makes the file about 2.7x smaller and ``add_trajectories``
    about 2x slower. Either setting reads blobs written with the other.
    With ``read_only=True`` the file is opened read-only (SQLite ``mode=ro``): every read works,
    every write raises, and nothing is created or migrated, not even SQLite's ``-wal`` and ``-shm``
    files beside it (:mod:`evolve.archive.readonly`; ``evolve ui`` reads live and finished runs this way).
    Usable as a context manager (closes on exit). Thread-safe.
    """

    def __init__(self, run_dir: str | Path, *, create: bool = True, compress: int = 0, read_only: bool = False) -> None:
        self.run_dir = Path(run_dir)
        self.compress = int(compress)  # zlib level for new JSON blobs; 0 stores them raw
        self.path = self.run_dir / DB_NAME
        self.read_only = bool(read_only)
        if not self.path.is_file():
            if not create or read_only:
                raise RunDirError(f"not an evolvekit run directory: {self.run_dir} (no {DB_NAME})")
            if self.run_dir.exists() and not self.run_dir.is_dir():
                raise RunDirError(f"cannot create a run directory at {self.run_dir}: it is a file")
            self.run_dir.mkdir(parents=True, exist_ok=True)
            self._create_atomically()
        self.artifacts = ArtifactStore(self.run_dir / ARTIFACTS_DIR)
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._depth = 0  # transaction nesting (0: none open)
        # (data_version, {"all": totals, "test": totals}); the deltas of the open transaction
        self._usage: tuple[int, dict[str, dict[str, Any]]] | None = None
        self._usage_delta = _no_usage()
        self._ckpt: Checkpointer | None = None
        self._ro = ReadOnly(self.path) if read_only else None
        try:
            if self._ro is not None:
                conn = self._ro.connection()
            else:
                conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30.0)
        except sqlite3.Error as e:
            raise RunDirError(f"cannot open the archive {self.path}: {e}") from e
        self._conn: sqlite3.Connection | None = conn
        try:
            self._check_version() if read_only else self._setup(create)
        except BaseException:
            conn.close()
            self._conn = None
            raise
        if create and not read_only:
            (self.run_dir / ARTIFACTS_DIR).mkdir(exist_ok=True)

    def _setup(self, create: bool) -> None:
        conn = self._conn
        assert conn is not None
        try:
            conn.execute("PRAGMA busy_timeout = 30000")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(f"PRAGMA wal_autocheckpoint = {BACKSTOP_PAGES}")
            has_version = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_version'"
            ).fetchone()
        except sqlite3.DatabaseError as e:
            raise RunDirError(f"not an evolvekit archive: {self.path} ({e})") from e
        if str(mode).lower() != "wal":
            raise ArchiveError(f"cannot put {self.path} in WAL mode (got {mode!r})")
        version = None
        if has_version:
            row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
            version = row[0] if row else None
            if version is not None and version > SCHEMA_VERSION:
                raise ArchiveError(
                    f"{self.path} has archive schema v{version}, newer than this evolvekit reads "
                    f"(v{SCHEMA_VERSION}); upgrade evolvekit"
                )
            if version == SCHEMA_VERSION:
                return
        elif not create:
            names = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            if names:
                raise RunDirError(f"not an evolvekit archive: {self.path} (foreign tables: {', '.join(names[:5])})")
        with self._write() as c:
            if version is not None:  # an archive written by an older evolvekit
                migrate(c, version)
            # executescript() would COMMIT on its own: run the statements one by one instead
            for stmt in split_sql(SCHEMA):
                c.execute(stmt)
            c.execute(
                "INSERT OR IGNORE INTO schema_version (version, applied_at) VALUES (?, ?)",
                (SCHEMA_VERSION, time.time()),
            )

    def _create_atomically(self) -> None:
        """Write a new archive's schema under a temporary name, then link it into place: a reader
        (``run_status``, ``evolve ui``) finds no archive or a whole one, never a file without tables.
        Two creators racing: the first link wins, the other opens the winner's."""
        tmp = self.run_dir / f".{DB_NAME}.{os.getpid()}.{threading.get_ident()}.tmp"
        for p in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
            p.unlink(missing_ok=True)
        try:
            conn = sqlite3.connect(tmp, isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode = WAL")
                conn.execute("BEGIN IMMEDIATE")
                for stmt in split_sql(SCHEMA):
                    conn.execute(stmt)
                conn.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)", (SCHEMA_VERSION, time.time())
                )
                conn.execute("COMMIT")
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            finally:
                conn.close()  # the last connection: the WAL is folded into the file and removed
            try:
                os.link(tmp, self.path)
            except FileExistsError:
                pass
            except OSError:  # a file system without hard links: a rename, still atomic
                if not self.path.exists():
                    os.replace(tmp, self.path)
        except (sqlite3.Error, OSError) as e:
            raise RunDirError(f"cannot create the archive {self.path}: {e}") from e
        finally:
            for p in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
                p.unlink(missing_ok=True)

    def _check_version(self) -> None:
        """Read-only opening: the archive must be one this evolvekit reads as it is (no migration)."""
        conn = self._conn
        assert conn is not None
        try:
            conn.execute("PRAGMA busy_timeout = 30000")
            row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
        except sqlite3.DatabaseError as e:
            raise RunDirError(f"not an evolvekit archive: {self.path} ({e})") from e
        version = row[0] if row else None
        if version != SCHEMA_VERSION:
            raise ArchiveError(
                f"{self.path} has archive schema v{version}; this evolvekit reads v{SCHEMA_VERSION} "
                "(open it once with evolve archive list to bring an older one up to date)"
            )

    # ------------------------------------------------------------------ plumbing

    def _c(self) -> sqlite3.Connection:
        if self._conn is None:
            raise ArchiveError(f"the archive {self.path} is closed")
        if self._pid != os.getpid():
            raise ArchiveError(
                f"this Archive of {self.path} was opened in process {self._pid} and cannot be used after fork(); "
                "open a new Archive in the child process"
            )
        if self._ro is not None:
            conn = self._ro.connection()  # opened again when the files changed (evolve.archive.readonly)
            if conn is not self._conn:
                self._conn, self._usage = conn, None
        return self._conn

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One atomic write: a transaction, or a savepoint inside an open one."""
        with self._lock:
            conn = self._c()
            if self._depth:
                name = f"sp{self._depth}"
                conn.execute(f"SAVEPOINT {name}")
                self._depth += 1
                try:
                    yield conn
                except BaseException:
                    self._depth -= 1
                    with contextlib.suppress(sqlite3.Error):
                        conn.execute(f"ROLLBACK TO {name}")
                        conn.execute(f"RELEASE {name}")
                    self._usage = None
                    raise
                self._depth -= 1
                conn.execute(f"RELEASE {name}")
                return
            conn.execute("BEGIN IMMEDIATE")
            self._depth = 1
            self._usage_delta = _no_usage()
            try:
                yield conn
                conn.execute("COMMIT")
            except BaseException:
                self._depth = 0
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
                self._usage = None
                raise
            self._depth = 0
            if self._ckpt is None:
                self._ckpt = Checkpointer(self.path)
                weakref.finalize(self, self._ckpt.stop)
            self._ckpt.kick()
            if self._usage is not None:
                for part, delta in self._usage_delta.items():
                    for k, v in delta.items():
                        self._usage[1][part][k] += v

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Archive]:
        """Group several writes into one atomic transaction (all or nothing, also under
        SIGKILL). Nested calls and the methods called inside use savepoints. Other threads
        wait until it ends."""
        with self._write():
            yield self

    def _read(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        return _Locked(self._lock, self._c, self._ro)

    def close(self) -> None:
        """Close the connection (idempotent). Later calls raise ArchiveError."""
        with self._lock:
            conn, self._conn = self._conn, None
            if conn is None:
                return
            if self._pid != os.getpid():
                # A forked child must not close the parent's connection (closing may
                # checkpoint and remove the WAL the parent is using): keep it alive, unused.
                _FORKED_CONNECTIONS.append(conn)
                return
            if self._ckpt is not None:
                self._ckpt.stop(wait=True)
                self._ckpt = None
            conn.close()
            if self._ro is not None:
                self._ro.close()

    def __enter__(self) -> Archive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Archive({str(self.run_dir)!r})"

    # ------------------------------------------------------------------ current pointer

    def set_current(self, system_id: str, reason: str = "promote") -> None:
        """Make a stored system (full id) the current one; appends a pointer row."""
        with self._write() as c:
            if not c.execute("SELECT 1 FROM systems WHERE id = ?", (system_id,)).fetchone():
                raise ArchiveError(f"cannot make {system_id!r} current: no such system in {self.run_dir}")
            c.execute(
                "INSERT INTO pointer (system_id, reason, created_at) VALUES (?, ?, ?)", (system_id, reason, time.time())
            )

    def current(self) -> str | None:
        """The current system's id, or None before the first :meth:`set_current`."""
        with self._read() as c:
            row = c.execute("SELECT system_id FROM pointer ORDER BY seq DESC LIMIT 1").fetchone()
        return row[0] if row else None

    def rollback(self, system_id_or_prefix: str) -> str:
        """Point ``current`` back at an earlier system; deletes nothing. Returns its full id."""
        sid = self.resolve(system_id_or_prefix)
        self.set_current(sid, "rollback")
        return sid

    def pointer_history(self) -> list[tuple[str, str, float]]:
        """Every pointer move ``(system_id, reason, created_at)``, oldest first."""
        with self._read() as c:
            return [tuple(r) for r in c.execute("SELECT system_id, reason, created_at FROM pointer ORDER BY seq")]

    # ------------------------------------------------------------------ run state & events

    def put_state(self, key: str, value: JSON) -> None:
        """Set a run-state value (JSON-serializable); overwrites the previous value."""
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        with self._write() as c:
            c.execute(
                "INSERT OR REPLACE INTO state (key, value, updated_at) VALUES (?, ?, ?)", (key, text, time.time())
            )

    def get_state(self, key: str, default: JSON = None) -> JSON:
        """A run-state value, or ``default``."""
        with self._read() as c:
            row = c.execute("SELECT value FROM state WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def state_items(self, prefix: str = "") -> dict[str, JSON]:
        """Every run-state ``key -> value`` whose key starts with ``prefix``."""
        with self._read() as c:
            rows = c.execute(
                "SELECT key, value FROM state WHERE substr(key, 1, ?) = ? ORDER BY key", (len(prefix), prefix)
            ).fetchall()
        return {k: json.loads(v) for k, v in rows}

    def log_event(self, kind: str, data: dict[str, Any] | None = None) -> int:
        """Append an event; returns its sequence number. ``data`` is a JSON object whose keys
        must not be ``seq``, ``kind`` or ``created_at`` (see :meth:`events`)."""
        data = dict(data or {})
        clash = _EVENT_KEYS.intersection(data)
        if clash:
            raise ValueError(f"event data may not use the reserved key(s) {sorted(clash)}")
        text = json.dumps(data, ensure_ascii=False, allow_nan=False)
        with self._write() as c:
            cur = c.execute("INSERT INTO events (kind, data, created_at) VALUES (?, ?, ?)", (kind, text, time.time()))
            return int(cur.lastrowid or 0)

    def events(self, kind: str | None = None, *, since: int = 0) -> list[dict[str, Any]]:
        """Events oldest first, each a flat dict: the logged data plus ``seq``, ``kind`` and
        ``created_at``. Filter by ``kind`` and/or ``seq > since``."""
        q = "SELECT seq, kind, data, created_at FROM events WHERE seq > ?"
        args: list[Any] = [since]
        if kind is not None:
            q += " AND kind = ?"
            args.append(kind)
        with self._read() as c:
            rows = c.execute(q + " ORDER BY seq", tuple(args)).fetchall()
        return [{**json.loads(d), "seq": s, "kind": k, "created_at": t} for s, k, d, t in rows]

    # ------------------------------------------------------------------ usage

    def usage(self, *, test: bool = True) -> dict[str, Any]:
        """Totals over the stored trajectories: ``{"rollouts", "tokens", "cost", "calls"}``
        (``calls``: LLM calls, the trajectories' ``LLMCall`` steps). ``test=False`` leaves out the
        test split: the final test scoring is outside every budget, also after a resume.

        Cached and kept up to date incrementally; recomputed when another connection wrote.
        """
        with self._read() as c:
            version = c.execute("PRAGMA data_version").fetchone()[0]
            if self._usage is None or self._usage[0] != version or self._depth:
                row = c.execute(
                    "SELECT COUNT(*), COALESCE(SUM(tokens), 0), COALESCE(SUM(cost), 0.0), COALESCE(SUM(calls), 0), "
                    "COALESCE(SUM(split = 'test'), 0), COALESCE(SUM(CASE WHEN split = 'test' THEN tokens END), 0), "
                    "COALESCE(SUM(CASE WHEN split = 'test' THEN cost END), 0.0), "
                    "COALESCE(SUM(CASE WHEN split = 'test' THEN calls END), 0) FROM trajectories"
                ).fetchone()
                parts = {"all": _totals(*row[:4]), "test": _totals(*row[4:])}
                if not self._depth:  # inside a transaction: don't cache uncommitted totals
                    self._usage = (version, parts)
            else:
                parts = self._usage[1]
            if test:
                return dict(parts["all"])
            return {k: v - parts["test"][k] for k, v in parts["all"].items()}


def _totals(rollouts: Any, tokens: Any, cost: Any, calls: Any) -> dict[str, Any]:
    return {"rollouts": int(rollouts), "tokens": int(tokens), "cost": float(cost), "calls": int(calls)}


def _no_usage() -> dict[str, dict[str, Any]]:
    return {"all": _totals(0, 0, 0.0, 0), "test": _totals(0, 0, 0.0, 0)}


class _Locked:
    """``with`` helper: hold the archive lock and hand out the open connection (read-only: tell
    :class:`ReadOnly` when the outermost read ends)."""

    __slots__ = ("_lock", "_get", "_ro")

    def __init__(self, lock: threading.RLock, get: Any, ro: ReadOnly | None = None) -> None:
        self._lock, self._get, self._ro = lock, get, ro

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        try:
            conn = self._get()
        except BaseException:
            self._lock.release()
            raise
        if self._ro is not None:
            self._ro.depth += 1
        return conn

    def __exit__(self, *exc: object) -> None:
        try:
            if self._ro is not None:
                self._ro.depth -= 1
                self._ro.done()
        finally:
            self._lock.release()
