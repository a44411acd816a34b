"""The archive: every system, its lineage, every trajectory and score of a run, in one place.

A run directory holds ``archive.sqlite`` (an embedded SQLite database in WAL mode) and
``artifacts/`` (an :class:`~evolve.artifacts.ArtifactStore` for weights, adapters, tool code,
memory snapshots). The history is append-only: systems, lineage edges, trajectories, pointer
moves and events are only ever inserted (triggers refuse UPDATE and DELETE on them), so a
rollback is one more pointer row and nothing is lost. Only the run-state key-value table
(the engine's resume journal) is overwritten in place.

Every write is one SQLite transaction, so a process killed at any moment (SIGKILL included)
leaves whole transactions only; trajectories are keyed, and re-adding a key is a no-op, so
an engine that resumes after a crash can replay its last batch safely.

One :class:`Archive` holds one connection guarded by a lock and can be shared by threads.
Do not use an Archive across ``fork()``: open a new one in the child.

``import evolve.archive`` is light: sqlite3, json, zlib and the pydantic data model only.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import sqlite3
import tempfile
import threading
import time
import weakref
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from pydantic import BaseModel

from evolve.artifacts import ArtifactStore
from evolve.errors import ArchiveError, RunDirError
from evolve.types import JSON, ArtifactRef, Candidate, System, Trajectory, canonical_json

SCHEMA_VERSION = 1
DB_NAME = "archive.sqlite"
ARTIFACTS_DIR = "artifacts"
EXPORT_FORMAT = "evolvekit-system/1"

# With Archive(compress=N > 0), JSON blobs at least this long are zlib-compressed at level N
# (1 is the sensible choice: ~2.7x smaller; slower levels gain a few percent more). Off by
# default: on a small 2-core machine it doubles the cost of add_trajectories.
_COMPRESS_MIN = 256
_ENC_RAW, _ENC_ZLIB = 0, 1
_CHUNK = 500  # keys per "IN (...)" query

_EVENT_KEYS = frozenset({"seq", "kind", "created_at"})  # added to every event by Archive.events

_FORKED_CONNECTIONS: list[sqlite3.Connection] = []  # see Archive.close

# WAL checkpoints (copying the log back into the database file, with an fsync) run on a
# background thread with its own connection once the log passes _CKPT_BYTES, so writers do
# not pay for them; the writer's own auto-checkpoint stays on as a backstop at _BACKSTOP_PAGES.
_CKPT_BYTES = 4 << 20
_BACKSTOP_PAGES = 16384

_HISTORY_TABLES = ("systems", "lineage", "rediscoveries", "trajectories", "trajectory_data", "pointer", "events")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (
    version    INTEGER PRIMARY KEY,
    applied_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS systems (
    seq        INTEGER PRIMARY KEY,
    id         TEXT NOT NULL UNIQUE,
    operator   TEXT NOT NULL,
    rationale  TEXT NOT NULL,
    generation INTEGER NOT NULL,
    info       TEXT NOT NULL,
    created_at REAL NOT NULL,
    enc        INTEGER NOT NULL,
    data       BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS lineage (
    child      TEXT NOT NULL,
    position   INTEGER NOT NULL,
    parent     TEXT NOT NULL,
    operator   TEXT NOT NULL,
    rationale  TEXT NOT NULL,
    generation INTEGER NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (child, position)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS lineage_by_parent ON lineage (parent);
CREATE TABLE IF NOT EXISTS rediscoveries (
    seq        INTEGER PRIMARY KEY,
    id         TEXT NOT NULL,
    parents    TEXT NOT NULL,
    operator   TEXT NOT NULL,
    rationale  TEXT NOT NULL,
    generation INTEGER NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS trajectories (
    seq          INTEGER PRIMARY KEY,
    key          TEXT NOT NULL UNIQUE,
    split        TEXT NOT NULL,
    phase        TEXT NOT NULL,
    generation   INTEGER NOT NULL,
    system_id    TEXT NOT NULL,
    task_id      TEXT NOT NULL,
    sample       INTEGER NOT NULL,
    score        REAL NOT NULL,
    error        INTEGER NOT NULL,
    reward_error INTEGER NOT NULL,
    tokens       INTEGER NOT NULL,
    cost         REAL NOT NULL,
    created_at   REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS trajectories_by_system ON trajectories (system_id, split, phase, task_id, score);
CREATE TABLE IF NOT EXISTS trajectory_data (
    seq  INTEGER PRIMARY KEY,
    enc  INTEGER NOT NULL,
    data BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS pointer (
    seq        INTEGER PRIMARY KEY,
    system_id  TEXT NOT NULL,
    reason     TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS state (
    key        TEXT PRIMARY KEY,
    value      TEXT NOT NULL,
    updated_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    seq        INTEGER PRIMARY KEY,
    kind       TEXT NOT NULL,
    data       TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS events_by_kind ON events (kind, seq);
""" + "".join(
    f"""
CREATE TRIGGER IF NOT EXISTS {t}_no_{op} BEFORE {op.upper()} ON {t}
BEGIN SELECT RAISE(ABORT, 'the archive history is append-only ({t})'); END;"""
    for t in _HISTORY_TABLES
    for op in ("update", "delete")
)


# ----------------------------------------------------------------------------- records


@dataclass(frozen=True)
class SystemRecord:
    """How a system entered the archive: its parents, the operator that made it and why."""

    id: str
    parents: tuple[str, ...]
    operator: str
    rationale: str
    generation: int
    created_at: float
    info: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "parents": list(self.parents),
            "operator": self.operator,
            "rationale": self.rationale,
            "generation": self.generation,
            "created_at": self.created_at,
            "info": self.info,
        }


@dataclass(frozen=True)
class TrajectoryRow:
    """A stored trajectory with the bookkeeping it was filed under."""

    key: str
    split: str
    phase: str
    generation: int
    trajectory: Trajectory


# ----------------------------------------------------------------------------- helpers


def _pack(text: str, level: int = 0) -> tuple[int, bytes]:
    """Encode a JSON text for storage: zlib when it is long enough and it helps, else raw.

    The window and memory level are sized to the input (any zlib reader inflates them):
    a full 32 KiB window costs a fixed ~50 us per call in allocation alone, more than
    compressing a typical 3 KB trajectory, and gains nothing on inputs that are shorter.
    """
    raw = text.encode("utf-8")
    if level and len(raw) >= _COMPRESS_MIN:
        wbits = min(15, max(9, (len(raw) - 1).bit_length()))
        c = zlib.compressobj(level, zlib.DEFLATED, wbits, max(1, min(8, wbits - 7)))
        z = c.compress(raw) + c.flush()
        if len(z) < len(raw):
            return _ENC_ZLIB, z
    return _ENC_RAW, raw


def _unpack(enc: int, data: bytes) -> str:
    if enc == _ENC_ZLIB:
        data = zlib.decompress(data)
    elif enc != _ENC_RAW:
        raise ArchiveError(f"unknown blob encoding {enc} in the archive (written by a newer evolvekit?)")
    return bytes(data).decode("utf-8")


def _finite(x: float) -> float:
    # SQLite stores NaN as NULL; keep the columns numeric (the full JSON keeps the truth).
    return 0.0 if x is None or math.isnan(x) else float(x)


def _chunks(seq: Sequence[str], n: int = _CHUNK) -> Iterator[Sequence[str]]:
    for i in range(0, len(seq), n):
        yield seq[i : i + n]


def _dump(value: Any) -> dict[str, Any]:
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    return value


def find_artifact_refs(value: Any) -> list[ArtifactRef]:
    """Every artifact a JSON value references: dicts with ``sha256`` and ``kind`` keys,
    found at any depth, deduplicated by sha256, in the order first met."""
    found: dict[str, ArtifactRef] = {}

    def walk(v: Any) -> None:
        if isinstance(v, BaseModel):
            v = v.model_dump(mode="json")
        if isinstance(v, dict):
            sha, kind = v.get("sha256"), v.get("kind")
            if isinstance(sha, str) and isinstance(kind, str) and sha not in found:
                size = v.get("size", 0)
                found[sha] = ArtifactRef(sha256=sha, kind=kind, size=size if isinstance(size, int) else 0)
            for item in v.values():
                walk(item)
        elif isinstance(v, (list, tuple)):
            for item in v:
                walk(item)

    walk(value)
    return list(found.values())


def diff(a: System | dict[str, Any], b: System | dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """Component-by-component differences between two systems.

    Returns ``(path, value in a, value in b)`` for every leaf that differs, recursing into
    dicts; paths are dotted (``"prompts.instruction"``, ``"models.policy.adapter.sha256"``).
    A key present on one side only shows ``None`` on the other. Lists and other values are
    compared whole; ``1`` and ``1.0`` or ``True`` differ (JSON types are kept apart).
    Top-level components come in System field order, nested keys in ``a``'s order and then
    the keys only ``b`` has.
    """
    out: list[tuple[str, Any, Any]] = []

    def same(x: Any, y: Any) -> bool:
        return type(x) is type(y) and (x == y if not isinstance(x, (dict, list)) else canonical_json(x) == canonical_json(y))

    def walk(x: Any, y: Any, path: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            keys = list(x) + [k for k in y if k not in x]
            for k in keys:
                walk(x.get(k), y.get(k), f"{path}.{k}" if path else str(k))
        elif not same(x, y):
            out.append((path, x, y))

    walk(_dump(a), _dump(b), "")
    return out


def load_export(path: str | Path) -> tuple[System, ArtifactStore]:
    """Load a folder written by :meth:`Archive.export`: the system and its artifact store.

    Checks the system's id against the file and that every referenced artifact is there.
    """
    path = Path(path)
    f = path / "system.json"
    if not f.is_file():
        raise RunDirError(f"not an exported evolvekit system: {path} (no system.json)")
    try:
        doc = json.loads(f.read_text(encoding="utf-8"))
        system = System.model_validate(doc["system"])
    except (ValueError, KeyError, TypeError) as e:
        raise ArchiveError(f"{f} is damaged: {e}") from e
    if doc.get("id") not in (None, system.id):
        raise ArchiveError(f"{f} is damaged: its id {doc.get('id')} does not match its content ({system.id})")
    store = ArtifactStore(path / ARTIFACTS_DIR)
    for ref in find_artifact_refs(doc["system"]):
        store.path(ref)  # raises ArchiveError when missing
    return system, store


# ----------------------------------------------------------------------------- archive


class Archive:
    """Systems, lineage, trajectories, scores, the current pointer and run state of one run.

    ``Archive(run_dir)`` creates ``run_dir/archive.sqlite`` and ``run_dir/artifacts/`` when
    missing; with ``create=False`` a missing archive raises :class:`RunDirError`.
    ``compress`` is the zlib level for the JSON of new systems and trajectories: 0 (the
    default) stores raw JSON; 1 makes the file about 2.7x smaller and ``add_trajectories``
    about 2x slower. Either setting reads blobs written with the other.
    Usable as a context manager (closes on exit). Thread-safe.
    """

    def __init__(self, run_dir: str | Path, *, create: bool = True, compress: int = 0) -> None:
        self.run_dir = Path(run_dir)
        self.compress = int(compress)  # zlib level for new JSON blobs; 0 stores them raw
        self.path = self.run_dir / DB_NAME
        if not self.path.is_file():
            if not create:
                raise RunDirError(f"not an evolvekit run directory: {self.run_dir} (no {DB_NAME})")
            if self.run_dir.exists() and not self.run_dir.is_dir():
                raise RunDirError(f"cannot create a run directory at {self.run_dir}: it is a file")
            self.run_dir.mkdir(parents=True, exist_ok=True)
        self.artifacts = ArtifactStore(self.run_dir / ARTIFACTS_DIR)
        self._lock = threading.RLock()
        self._pid = os.getpid()
        self._depth = 0  # transaction nesting (0: none open)
        self._usage: tuple[int, dict[str, Any]] | None = None  # (data_version, totals)
        self._usage_delta = [0, 0, 0.0]
        self._ckpt: _Checkpointer | None = None
        try:
            conn = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30.0)
        except sqlite3.Error as e:
            raise RunDirError(f"cannot open the archive {self.path}: {e}") from e
        self._conn: sqlite3.Connection | None = conn
        try:
            self._setup(create)
        except BaseException:
            conn.close()
            self._conn = None
            raise
        if create:
            (self.run_dir / ARTIFACTS_DIR).mkdir(exist_ok=True)

    def _setup(self, create: bool) -> None:
        conn = self._conn
        assert conn is not None
        try:
            conn.execute("PRAGMA busy_timeout = 30000")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(f"PRAGMA wal_autocheckpoint = {_BACKSTOP_PAGES}")
            has_version = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type='table' AND name='schema_version'"
            ).fetchone()
        except sqlite3.DatabaseError as e:
            raise RunDirError(f"not an evolvekit archive: {self.path} ({e})") from e
        if str(mode).lower() != "wal":
            raise ArchiveError(f"cannot put {self.path} in WAL mode (got {mode!r})")
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
            # executescript() would COMMIT on its own: run the statements one by one instead
            for stmt in _split_sql(_SCHEMA):
                c.execute(stmt)
            c.execute(
                "INSERT OR IGNORE INTO schema_version (version, applied_at) VALUES (?, ?)",
                (SCHEMA_VERSION, time.time()),
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
            self._usage_delta = [0, 0, 0.0]
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
                self._ckpt = _Checkpointer(self.path)
                weakref.finalize(self, self._ckpt.stop)
            self._ckpt.kick()
            if self._usage is not None:
                u = self._usage[1]
                u["rollouts"] += self._usage_delta[0]
                u["tokens"] += self._usage_delta[1]
                u["cost"] += self._usage_delta[2]

    @contextlib.contextmanager
    def transaction(self) -> Iterator["Archive"]:
        """Group several writes into one atomic transaction (all or nothing, also under
        SIGKILL). Nested calls and the methods called inside use savepoints. Other threads
        wait until it ends."""
        with self._write():
            yield self

    def _read(self) -> "contextlib.AbstractContextManager[sqlite3.Connection]":
        return _Locked(self._lock, self._c)

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

    def __enter__(self) -> "Archive":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Archive({str(self.run_dir)!r})"

    # ------------------------------------------------------------------ systems & lineage

    def add_system(
        self,
        system: System,
        *,
        parents: Sequence[str] = (),
        operator: str = "init",
        rationale: str = "",
        generation: int = 0,
        info: dict[str, Any] | None = None,
    ) -> str:
        """Store a system (once, by id) with its lineage; return its id.

        Parents must already be in the archive (full ids). Adding an id that is already
        stored changes nothing: the first record stands. When it comes back with other
        parents (an operator rediscovered an existing system) that is noted in
        :meth:`rediscoveries`, not in the lineage, so the lineage stays a DAG.
        """
        if not isinstance(system, System):
            raise TypeError(f"add_system expects a System, got {type(system).__name__}")
        if isinstance(parents, str):
            raise TypeError("parents must be a sequence of system ids, not a string")
        parents = tuple(parents)
        sid = system.id
        now = time.time()
        enc, blob = _pack(canonical_json(system.model_dump(mode="json")), self.compress)
        info_json = json.dumps(info or {}, sort_keys=True, ensure_ascii=False)
        with self._write() as c:
            wanted = list(dict.fromkeys((sid, *parents)))
            known: set[str] = set()
            for chunk in _chunks(wanted):
                q = f"SELECT id FROM systems WHERE id IN ({','.join('?' * len(chunk))})"
                known.update(r[0] for r in c.execute(q, tuple(chunk)))
            if sid in known:
                old = tuple(r[0] for r in c.execute("SELECT parent FROM lineage WHERE child = ? ORDER BY position", (sid,)))
                if old != parents:
                    c.execute(
                        "INSERT INTO rediscoveries (id, parents, operator, rationale, generation, created_at) "
                        "VALUES (?, ?, ?, ?, ?, ?)",
                        (sid, json.dumps(list(parents)), operator, rationale, int(generation), now),
                    )
                return sid
            missing = [p for p in parents if p not in known]
            if missing:
                raise ArchiveError(f"unknown parent system(s) {', '.join(missing)}: add the parents first")
            c.execute(
                "INSERT INTO systems (id, operator, rationale, generation, info, created_at, enc, data) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (sid, operator, rationale, int(generation), info_json, now, enc, blob),
            )
            if parents:
                c.executemany(
                    "INSERT INTO lineage (child, position, parent, operator, rationale, generation, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [(sid, i, p, operator, rationale, int(generation), now) for i, p in enumerate(parents)],
                )
        return sid

    def add_candidate(self, candidate: Candidate, *, generation: int = 0) -> str:
        """:meth:`add_system` for a :class:`~evolve.types.Candidate`."""
        return self.add_system(
            candidate.system,
            parents=candidate.parents,
            operator=candidate.operator,
            rationale=candidate.rationale,
            generation=generation,
            info=dict(candidate.info),
        )

    def has_system(self, system_id: str) -> bool:
        """Whether this exact id is stored."""
        with self._read() as c:
            return c.execute("SELECT 1 FROM systems WHERE id = ?", (system_id,)).fetchone() is not None

    def _resolve_prefix(self, c: sqlite3.Connection, ref: str) -> str:
        p = ref.strip().lower()
        if not p:
            raise ArchiveError("empty system id")
        if c.execute("SELECT 1 FROM systems WHERE id = ?", (p,)).fetchone():
            return p
        rows = [r[0] for r in c.execute("SELECT id FROM systems WHERE id >= ? AND id < ? ORDER BY id LIMIT 11", (p, p + "\uffff"))]
        if not rows:
            raise ArchiveError(f"no system {ref!r} in {self.run_dir}")
        if len(rows) > 1:
            shown = ", ".join(rows[:10]) + (", ..." if len(rows) > 10 else "")
            raise ArchiveError(f"ambiguous system id prefix {ref!r}: it matches {shown}; give more characters")
        return rows[0]

    def resolve(self, ref: str) -> str:
        """A full system id from a unique id prefix or one of the words ``current``,
        ``best`` (highest val score) and ``baseline`` (the first generation-0 system)."""
        word = ref.strip().lower()
        if word == "current":
            cur = self.current()
            if cur is None:
                raise ArchiveError(f"no current system in {self.run_dir} yet")
            return cur
        if word == "best":
            best = self.best()
            if best is None:
                raise ArchiveError(f"no system in {self.run_dir} has a val score yet")
            return best
        if word == "baseline":
            with self._read() as c:
                row = c.execute("SELECT id FROM systems ORDER BY (generation != 0), seq LIMIT 1").fetchone()
            if row is None:
                raise ArchiveError(f"the archive {self.run_dir} holds no system")
            return row[0]
        with self._read() as c:
            return self._resolve_prefix(c, ref)

    def get_system(self, id_or_unique_prefix: str) -> System:
        """The stored system (also accepts ``current``/``best``/``baseline``)."""
        sid = self.resolve(id_or_unique_prefix)
        with self._read() as c:
            row = c.execute("SELECT enc, data FROM systems WHERE id = ?", (sid,)).fetchone()
        if row is None:  # pragma: no cover - resolve() checked it
            raise ArchiveError(f"no system {id_or_unique_prefix!r} in {self.run_dir}")
        system = System.model_validate_json(_unpack(row[0], row[1]))
        if system.id != sid:
            raise ArchiveError(f"system {sid} is damaged in {self.path}: its content hashes to {system.id}")
        return system

    def _records(self, where: str = "", args: tuple[Any, ...] = ()) -> list[SystemRecord]:
        with self._read() as c:
            rows = c.execute(
                f"SELECT id, operator, rationale, generation, created_at, info FROM systems {where} ORDER BY seq", args
            ).fetchall()
            if where:
                ids = [r[0] for r in rows]
                edges = []
                for chunk in _chunks(ids):
                    q = f"SELECT child, position, parent FROM lineage WHERE child IN ({','.join('?' * len(chunk))})"
                    edges += c.execute(q, tuple(chunk)).fetchall()
            else:
                edges = c.execute("SELECT child, position, parent FROM lineage").fetchall()
        parents: dict[str, list[tuple[int, str]]] = {}
        for child, pos, parent in edges:
            parents.setdefault(child, []).append((pos, parent))
        return [
            SystemRecord(
                id=r[0],
                parents=tuple(p for _, p in sorted(parents.get(r[0], ()))),
                operator=r[1],
                rationale=r[2],
                generation=r[3],
                created_at=r[4],
                info=json.loads(r[5]),
            )
            for r in rows
        ]

    def records(self) -> list[SystemRecord]:
        """Every system's record, in insertion order."""
        return self._records()

    def record(self, system_id: str) -> SystemRecord:
        """One system's record (id, prefix or word)."""
        sid = self.resolve(system_id)
        return self._records("WHERE id = ?", (sid,))[0]

    def lineage(self, system_id: str) -> list[str]:
        """The chain ``[system_id, parent, grandparent, ..., root]`` following first parents."""
        sid = self.resolve(system_id)
        with self._read() as c:
            rows = c.execute(
                """WITH RECURSIVE chain(id, depth) AS (
                       SELECT ?, 0
                       UNION ALL
                       SELECT l.parent, chain.depth + 1 FROM lineage l JOIN chain
                         ON l.child = chain.id AND l.position = 0 WHERE chain.depth < 1000000
                   ) SELECT id FROM chain ORDER BY depth""",
                (sid,),
            ).fetchall()
        return [r[0] for r in rows]

    def ancestors(self, system_id: str) -> list[str]:
        """Every ancestor through all parents (crossover included), nearest first."""
        sid = self.resolve(system_id)
        with self._read() as c:
            rows = c.execute(
                """WITH RECURSIVE anc(id, depth) AS (
                       SELECT parent, 1 FROM lineage WHERE child = ?
                       UNION
                       SELECT l.parent, anc.depth + 1 FROM lineage l JOIN anc ON l.child = anc.id
                         WHERE anc.depth < 1000000
                   ) SELECT id, MIN(depth) AS d FROM anc GROUP BY id ORDER BY d, id""",
                (sid,),
            ).fetchall()
        return [r[0] for r in rows]

    def children(self, system_id: str) -> list[str]:
        """The systems that name this one as a parent, in insertion order."""
        sid = self.resolve(system_id)
        with self._read() as c:
            rows = c.execute(
                "SELECT DISTINCT l.child FROM lineage l JOIN systems s ON s.id = l.child WHERE l.parent = ? ORDER BY s.seq",
                (sid,),
            ).fetchall()
        return [r[0] for r in rows]

    def rediscoveries(self, system_id: str | None = None) -> list[dict[str, Any]]:
        """Times an already-stored system was added again with other parents."""
        q = "SELECT id, parents, operator, rationale, generation, created_at FROM rediscoveries"
        args: tuple[Any, ...] = ()
        if system_id is not None:
            q += " WHERE id = ?"
            args = (system_id,)
        with self._read() as c:
            rows = c.execute(q + " ORDER BY seq", args).fetchall()
        return [
            {"id": r[0], "parents": json.loads(r[1]), "operator": r[2], "rationale": r[3], "generation": r[4], "created_at": r[5]}
            for r in rows
        ]

    def system_count(self) -> int:
        """How many systems are stored. (No ``__len__``: an empty Archive must stay truthy.)"""
        with self._read() as c:
            return int(c.execute("SELECT COUNT(*) FROM systems").fetchone()[0])

    # ------------------------------------------------------------------ trajectories

    def add_trajectories(self, rows: Sequence[tuple[str, str, str, int, Trajectory]]) -> int:
        """Store ``(key, split, phase, generation, trajectory)`` rows in one transaction.

        A key already stored is skipped (so replaying a batch after a crash never duplicates).
        Returns how many rows were new.
        """
        now = time.time()
        rows = list(rows)
        for key, _, _, _, traj in rows:
            if not isinstance(key, str) or not key:
                raise TypeError(f"trajectory key must be a non-empty string, got {key!r}")
            if not isinstance(traj, Trajectory):
                raise TypeError(f"expected a Trajectory for key {key!r}, got {type(traj).__name__}")
        if not rows:
            return 0
        # Serialize only rows not stored yet (a replayed batch costs a lookup, not a re-encode);
        # the transaction below checks again, so this is only an optimization.
        stored = self.has_keys([r[0] for r in rows])
        prepared = []
        for key, split, phase, generation, traj in rows:
            if key in stored:
                continue
            stored.add(key)  # a key repeated within the batch: the first row wins
            enc, blob = _pack(traj.model_dump_json(), self.compress)
            reward = traj.reward
            prepared.append(
                (
                    (
                        key,
                        split,
                        phase,
                        int(generation),
                        traj.system_id,
                        traj.task_id,
                        traj.sample,
                        _finite(reward.score if reward is not None else 0.0),
                        int(traj.error is not None),
                        int(reward is not None and reward.error is not None),
                        int(traj.tokens),
                        _finite(traj.cost),
                        now,
                    ),
                    enc,
                    blob,
                )
            )
        if not prepared:
            return 0
        with self._write() as c:
            # Skip keys already stored (or repeated in this batch), then insert the rest with
            # explicit row ids: two executemany calls instead of two statements per row.
            seen = self._has_keys(c, [m[0] for m, _, _ in prepared])
            fresh = []
            for item in prepared:
                if item[0][0] not in seen:
                    seen.add(item[0][0])
                    fresh.append(item)
            if not fresh:
                return 0
            start = c.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM trajectories").fetchone()[0]
            c.executemany(
                "INSERT INTO trajectories (seq, key, split, phase, generation, system_id, task_id, sample, "
                "score, error, reward_error, tokens, cost, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [(start + i, *meta) for i, (meta, _, _) in enumerate(fresh)],
            )
            c.executemany(
                "INSERT INTO trajectory_data (seq, enc, data) VALUES (?, ?, ?)",
                [(start + i, enc, blob) for i, (_, enc, blob) in enumerate(fresh)],
            )
            self._usage_delta[0] += len(fresh)
            self._usage_delta[1] += sum(m[10] for m, _, _ in fresh)
            self._usage_delta[2] += sum(m[11] for m, _, _ in fresh)
        return len(fresh)

    @staticmethod
    def _has_keys(c: sqlite3.Connection, keys: Sequence[str]) -> set[str]:
        keys = list(dict.fromkeys(keys))
        found: set[str] = set()
        for chunk in _chunks(keys):
            q = f"SELECT key FROM trajectories WHERE key IN ({','.join('?' * len(chunk))})"
            found.update(r[0] for r in c.execute(q, tuple(chunk)))
        return found

    def has_keys(self, keys: Sequence[str]) -> set[str]:
        """The subset of ``keys`` already stored."""
        with self._read() as c:
            return self._has_keys(c, keys)

    def get_trajectories(self, keys: Sequence[str]) -> dict[str, Trajectory]:
        """The stored trajectories among ``keys`` (missing keys are left out)."""
        keys = list(dict.fromkeys(keys))
        raw: list[tuple[str, int, bytes]] = []
        with self._read() as c:
            for chunk in _chunks(keys):
                q = (
                    "SELECT t.key, d.enc, d.data FROM trajectories t JOIN trajectory_data d ON d.seq = t.seq "
                    f"WHERE t.key IN ({','.join('?' * len(chunk))})"
                )
                raw += c.execute(q, tuple(chunk)).fetchall()
        return {k: Trajectory.model_validate_json(_unpack(enc, data)) for k, enc, data in raw}

    def trajectory_rows(
        self,
        system_id: str | None = None,
        split: str | None = None,
        phase: str | None = None,
        *,
        generation: int | None = None,
        limit: int | None = None,
    ) -> list[TrajectoryRow]:
        """Stored trajectories with their key/split/phase/generation, in insertion order."""
        where, args = [], []
        for col, val in (("t.system_id", system_id), ("t.split", split), ("t.phase", phase), ("t.generation", generation)):
            if val is not None:
                where.append(f"{col} = ?")
                args.append(val)
        q = (
            "SELECT t.key, t.split, t.phase, t.generation, d.enc, d.data FROM trajectories t "
            "JOIN trajectory_data d ON d.seq = t.seq"
        )
        if where:
            q += " WHERE " + " AND ".join(where)
        q += " ORDER BY t.seq"
        if limit is not None:
            q += " LIMIT ?"
            args.append(int(limit))
        with self._read() as c:
            raw = c.execute(q, tuple(args)).fetchall()
        return [
            TrajectoryRow(key=k, split=s, phase=p, generation=g, trajectory=Trajectory.model_validate_json(_unpack(enc, data)))
            for k, s, p, g, enc, data in raw
        ]

    def trajectories(
        self,
        system_id: str | None = None,
        split: str | None = None,
        phase: str | None = None,
        *,
        limit: int | None = None,
    ) -> list[Trajectory]:
        """Stored trajectories matching the filters, in insertion order."""
        return [r.trajectory for r in self.trajectory_rows(system_id, split, phase, limit=limit)]

    # ------------------------------------------------------------------ scores

    def score(self, system_id: str, split: str, phase: str = "eval") -> tuple[float, int] | None:
        """``(mean score, n)`` over the system's trajectories of that split and phase, or None.
        A trajectory without a reward counts as 0."""
        with self._read() as c:
            mean, n = c.execute(
                "SELECT AVG(score), COUNT(*) FROM trajectories WHERE system_id = ? AND split = ? AND phase = ?",
                (system_id, split, phase),
            ).fetchone()
        return None if not n else (float(mean), int(n))

    def task_scores(self, system_id: str, split: str, phase: str = "eval") -> dict[str, float]:
        """``task_id -> mean score over samples`` for the system on that split and phase."""
        with self._read() as c:
            rows = c.execute(
                "SELECT task_id, AVG(score) FROM trajectories WHERE system_id = ? AND split = ? AND phase = ? "
                "GROUP BY task_id ORDER BY task_id",
                (system_id, split, phase),
            ).fetchall()
        return {t: float(s) for t, s in rows}

    def scores(self, system_id: str, phase: str = "eval") -> dict[str, tuple[float, int]]:
        """``split -> (mean score, n)`` for the system (phase ``eval`` by default)."""
        with self._read() as c:
            rows = c.execute(
                "SELECT split, AVG(score), COUNT(*) FROM trajectories WHERE system_id = ? AND phase = ? "
                "GROUP BY split ORDER BY split",
                (system_id, phase),
            ).fetchall()
        return {s: (float(m), int(n)) for s, m, n in rows}

    def score_summary(self, system_id: str) -> list[tuple[str, str, float, int]]:
        """``(split, phase, mean score, n)`` for every split and phase the system was run on."""
        with self._read() as c:
            rows = c.execute(
                "SELECT split, phase, AVG(score), COUNT(*) FROM trajectories WHERE system_id = ? "
                "GROUP BY split, phase ORDER BY split, phase",
                (system_id,),
            ).fetchall()
        return [(s, p, float(m), int(n)) for s, p, m, n in rows]

    def all_scores(self, split: str, phase: str = "eval") -> dict[str, tuple[float, int]]:
        """``system_id -> (mean score, n)`` for every system scored on that split and phase."""
        with self._read() as c:
            rows = c.execute(
                "SELECT system_id, AVG(score), COUNT(*) FROM trajectories WHERE split = ? AND phase = ? GROUP BY system_id",
                (split, phase),
            ).fetchall()
        return {s: (float(m), int(n)) for s, m, n in rows}

    def best(self, split: str = "val", phase: str = "eval") -> str | None:
        """The stored system with the highest mean score on ``split`` (ties: more samples,
        then the earlier system), or None when none is scored."""
        with self._read() as c:
            row = c.execute(
                "SELECT t.system_id FROM trajectories t JOIN systems s ON s.id = t.system_id "
                "WHERE t.split = ? AND t.phase = ? GROUP BY t.system_id "
                "ORDER BY AVG(t.score) DESC, COUNT(*) DESC, MIN(s.seq) ASC LIMIT 1",
                (split, phase),
            ).fetchone()
        return row[0] if row else None

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
            c.execute("INSERT OR REPLACE INTO state (key, value, updated_at) VALUES (?, ?, ?)", (key, text, time.time()))

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

    def usage(self) -> dict[str, Any]:
        """Totals over all stored trajectories: ``{"rollouts", "tokens", "cost"}``.

        Cached and kept up to date incrementally; recomputed when another connection wrote.
        """
        with self._read() as c:
            version = c.execute("PRAGMA data_version").fetchone()[0]
            if self._usage is None or self._usage[0] != version or self._depth:
                n, tokens, cost = c.execute(
                    "SELECT COUNT(*), COALESCE(SUM(tokens), 0), COALESCE(SUM(cost), 0.0) FROM trajectories"
                ).fetchone()
                totals = {"rollouts": int(n), "tokens": int(tokens), "cost": float(cost)}
                if self._depth:  # inside a transaction: don't cache uncommitted totals
                    return totals
                self._usage = (version, totals)
            return dict(self._usage[1])

    # ------------------------------------------------------------------ export

    def export(self, system_id: str, dest: str | Path) -> Path:
        """Write a self-contained folder for one system: ``dest/system.json`` (the System,
        its record, lineage and scores) and ``dest/artifacts/`` with every artifact it
        references. Refuses a ``dest`` that exists and is not an empty folder. Atomic: the
        folder appears complete or not at all. Load it back with :func:`load_export`."""
        sid = self.resolve(system_id)
        system = self.get_system(sid)
        dest = Path(dest)
        if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
            raise RunDirError(f"refusing to overwrite {dest}: it exists and is not an empty folder")
        data = system.model_dump(mode="json")
        refs = find_artifact_refs(data)
        doc = {
            "format": EXPORT_FORMAT,
            "id": sid,
            "system": data,
            "record": self.record(sid).to_json(),
            "lineage": self.lineage(sid),
            "scores": {
                f"{split}/{phase}": {"split": split, "phase": phase, "score": s, "n": n}
                for split, phase, s, n in self.score_summary(sid)
            },
            "current": self.current() == sid,
            "artifacts": [r.model_dump(mode="json") for r in refs],
            "exported_from": str(self.run_dir.resolve()),
            "exported_at": time.time(),
        }
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.tmp-"))
        try:
            store = ArtifactStore(tmp / ARTIFACTS_DIR)
            (tmp / ARTIFACTS_DIR).mkdir()
            for ref in refs:
                self.artifacts.copy_to(ref, store)
                if not store.has(ref.sha256):
                    raise ArchiveError(f"artifact {ref.sha256[:12]} in {self.artifacts.root} is damaged (hash mismatch)")
            (tmp / "system.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
            if dest.exists():
                dest.rmdir()
            os.replace(tmp, dest)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return dest


class _Checkpointer:
    """A daemon thread that runs passive WAL checkpoints on its own connection when the
    log grows past ``_CKPT_BYTES``. Holds no reference to the Archive."""

    def __init__(self, path: Path) -> None:
        self._wal = Path(str(path) + "-wal")
        self._path = path
        self._event = threading.Event()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name=f"evolve-archive-checkpoint:{path.parent.name}", daemon=True)
        self._thread.start()

    def kick(self) -> None:
        self._event.set()

    def stop(self, wait: bool = False) -> None:
        self._stopped = True
        self._event.set()
        if wait and self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        try:
            conn = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None, timeout=30.0)
        except sqlite3.Error:  # pragma: no cover - the writer's backstop takes over
            return
        try:
            conn.execute("PRAGMA busy_timeout = 30000")
            while not self._stopped:
                self._event.wait(1.0)
                self._event.clear()
                if self._stopped:
                    break
                try:
                    if self._wal.stat().st_size >= _CKPT_BYTES:
                        conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                except (OSError, sqlite3.Error):
                    pass
        finally:
            conn.close()


class _Locked:
    """``with`` helper: hold the archive lock and hand out the open connection."""

    __slots__ = ("_lock", "_get")

    def __init__(self, lock: threading.RLock, get: Any) -> None:
        self._lock, self._get = lock, get

    def __enter__(self) -> sqlite3.Connection:
        self._lock.acquire()
        try:
            return self._get()
        except BaseException:
            self._lock.release()
            raise

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def _split_sql(script: str) -> list[str]:
    """Split the schema into statements (triggers keep their inner ``;``)."""
    out, buf = [], ""
    for line in script.splitlines():
        buf += line + "\n"
        if sqlite3.complete_statement(buf):
            if buf.strip():
                out.append(buf.strip())
            buf = ""
    if buf.strip():
        out.append(buf.strip())
    return out


# ----------------------------------------------------------------------------- benchmark


def _bench(n_systems: int = 10_000, n_trajectories: int = 100_000, shape: str = "text", compress: int = 0) -> None:
    """``python -m evolve.archive bench [N_SYSTEMS] [N_TRAJECTORIES] [small|text|logprobs] [ZLEVEL]``"""
    import random
    import statistics

    from evolve.types import LLMCall, Message, ModelSpec, Reward

    rnd = random.Random(0)
    words = "select from where group by order count table join on the of rows column schema answer".split()

    def text(n: int) -> str:
        return " ".join(rnd.choice(words) for _ in range(n))

    def system(i: int) -> System:
        return System(
            models={"policy": ModelSpec(backend="scripted", name="x")},
            prompts={"instruction": f"variant {i}: " + text(120)},
            workflow={"topology": "single", "max_steps": 8},
        )

    def traj(sid: str, i: int) -> Trajectory:
        steps: tuple[Any, ...] = ()
        if shape != "small":
            lp = shape == "logprobs"
            steps = tuple(
                LLMCall(
                    role="policy",
                    model="tiny",
                    messages=(Message(role="system", content=text(150)), Message(role="user", content=text(40))),
                    output=text(40),
                    token_ids=tuple(rnd.randrange(32000) for _ in range(64)) if lp else None,
                    logprobs=tuple(-rnd.random() * 3 for _ in range(64)) if lp else None,
                    prompt_tokens=250,
                    completion_tokens=64,
                )
                for _ in range(2)
            )
        return Trajectory(
            task_id=f"task-{i % 200}", system_id=sid, steps=steps, output="42",
            reward=Reward(score=rnd.random(), feedback="wrong count"), tokens=628, cost=0.001,
        )

    def ms(t: float) -> str:
        return f"{t * 1e3:.2f} ms"

    root = Path(tempfile.mkdtemp(prefix="evolve-archive-bench-"))
    try:
        a = Archive(root / "run", compress=compress)
        systems = [system(i) for i in range(n_systems)]
        t0 = time.perf_counter()
        ids: list[str] = []
        for i, s in enumerate(systems):
            ids.append(a.add_system(s, parents=(ids[(i - 1) // 2],) if i else (), operator="mutate", generation=i // 100))
        dt = time.perf_counter() - t0
        print(f"add_system x{n_systems}: {dt:.2f} s ({dt / max(n_systems, 1) * 1e6:.0f} us each)")
        samples = [traj(ids[i % min(100, len(ids))] if ids else "s", i) for i in range(1000)]
        print(f"trajectory JSON: {statistics.mean(len(t.model_dump_json()) for t in samples[:100]):.0f} bytes ({shape})")
        rows = [(f"k{i}", "val" if i % 3 else "train", "eval", 0, samples[i % 1000]) for i in range(n_trajectories)]
        times = []
        t0 = time.perf_counter()
        for j in range(0, len(rows), 64):
            t1 = time.perf_counter()
            a.add_trajectories(rows[j : j + 64])
            times.append(time.perf_counter() - t1)
        dt = time.perf_counter() - t0
        times.sort()
        print(
            f"add_trajectories x{n_trajectories} in 64-row batches: {dt:.2f} s; per batch median "
            f"{ms(times[len(times) // 2])}, p90 {ms(times[int(len(times) * 0.9)])}"
        )
        extra = [(f"x{i}", "val", "eval", 1, samples[i]) for i in range(1000)]
        t0 = time.perf_counter()
        a.add_trajectories(extra)
        print(f"add_trajectories 1000 rows in one call: {ms(time.perf_counter() - t0)}")
        t0 = time.perf_counter()
        a.add_trajectories(extra)
        print(f"  the same 1000 again (all skipped): {ms(time.perf_counter() - t0)}")
        keys = [f"k{rnd.randrange(n_trajectories)}" for _ in range(1000)]

        def timed(label: str, fn: Any, n: int = 1) -> None:
            t = time.perf_counter()
            for _ in range(n):
                fn()
            print(f"{label}: {ms((time.perf_counter() - t) / n)}")

        timed("get_trajectories 1000 random keys", lambda: a.get_trajectories(keys))
        timed("get_trajectories 64 random keys", lambda: a.get_trajectories(keys[:64]), 20)
        timed("has_keys 64 keys", lambda: a.has_keys(keys[:64]), 20)
        timed("score(system, val)", lambda: a.score(samples[1].system_id, "val"), 50)
        timed("task_scores(system, val)", lambda: a.task_scores(samples[1].system_id, "val"), 20)
        timed("all_scores(val)", lambda: a.all_scores("val"), 3)
        timed("best()", lambda: a.best(), 3)
        if ids:
            timed("get_system(8-char prefix)", lambda: a.get_system(ids[-1][:8]), 50)
            timed("lineage(last)", lambda: a.lineage(ids[-1]), 20)
        timed("records()", lambda: a.records(), 3)
        a._usage = None
        timed("usage() first call", a.usage)
        timed("usage() cached", a.usage, 100)
        timed("trajectories(system, val)", lambda: a.trajectories(samples[1].system_id, "val"), 3)
        a.close()
        size = sum(f.stat().st_size for f in (root / "run").glob(DB_NAME + "*"))
        print(f"file size: {size / 1e6:.1f} MB ({size / max(n_trajectories + n_systems, 1):.0f} bytes per row)")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":  # pragma: no cover
    import sys

    if sys.argv[1:2] != ["bench"]:
        sys.exit("usage: python -m evolve.archive bench [N_SYSTEMS] [N_TRAJECTORIES] [small|text|logprobs] [ZLEVEL]")
    argv = sys.argv[2:]
    _bench(
        int(argv[0]) if len(argv) > 0 else 10_000,
        int(argv[1]) if len(argv) > 1 else 100_000,
        argv[2] if len(argv) > 2 else "text",
        int(argv[3]) if len(argv) > 3 else 0,
    )


__all__ = [
    "Archive",
    "SystemRecord",
    "TrajectoryRow",
    "diff",
    "find_artifact_refs",
    "load_export",
    "SCHEMA_VERSION",
]
