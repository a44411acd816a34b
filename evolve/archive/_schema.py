"""The archive's SQLite schema: tables, indexes and the append-only triggers, and the
migrations that bring an archive written by an older evolvekit up to date.

v2 added ``trajectories.calls`` (the trajectory's LLM calls) and ``trajectories.duration``
(its wall time in seconds), so call budgets and per-rollout cost/latency are SQL sums.

v3 moves rollouts that an older evolvekit stored as scores although the world failed under them
(the model unreachable, a rate limit, a dead worker: :func:`evolve.failures.legacy_category`) out
of the trajectories into ``world_failure`` events, with their whole JSON (nothing is lost), so a
resumed run or ``evolve eval`` runs them again instead of serving a connection error as a 0."""

from __future__ import annotations

import json
import sqlite3

SCHEMA_VERSION = 3
DB_NAME = "archive.sqlite"
ARTIFACTS_DIR = "artifacts"

_HISTORY_TABLES = ("systems", "lineage", "rediscoveries", "trajectories", "trajectory_data", "pointer", "events")

SCHEMA = """
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
    created_at   REAL NOT NULL,
    calls        INTEGER NOT NULL DEFAULT 0,
    duration     REAL NOT NULL DEFAULT 0.0
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


def split_sql(script: str) -> list[str]:
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


def _set_aside_world_failures(conn: sqlite3.Connection) -> None:
    """v3: stored rollouts the world failed under become ``world_failure`` events (see above)."""
    import time

    from evolve.archive._codec import unpack
    from evolve.failures import legacy_category

    rows = conn.execute(
        "SELECT t.seq, t.key, t.split, t.phase, t.generation, t.system_id, t.task_id, d.enc, d.data "
        "FROM trajectories t JOIN trajectory_data d ON d.seq = t.seq WHERE t.error = 1"
    ).fetchall()
    moved = []
    for seq, key, split, phase, gen, sid, tid, enc, data in rows:
        traj = json.loads(unpack(enc, data))
        cat = legacy_category(traj.get("error") or "")
        if cat is not None:
            moved.append(
                (
                    seq,
                    {
                        "key": key,
                        "split": split,
                        "phase": phase,
                        "generation": gen,
                        "system": sid,
                        "task": tid,
                        "category": cat,
                        "message": (traj.get("error") or "").splitlines()[0],
                        "migrated": "stored as a score by an evolvekit before 0.2",
                        "trajectory": traj,
                    },
                )
            )
    if not moved:
        return
    for t in ("trajectories", "trajectory_data"):
        conn.execute(f"DROP TRIGGER IF EXISTS {t}_no_delete")  # restored by SCHEMA right after
    now = time.time()
    for seq, event in moved:
        conn.execute(
            "INSERT INTO events (kind, data, created_at) VALUES (?, ?, ?)",
            ("world_failure", json.dumps(event, ensure_ascii=False), now),
        )
        conn.execute("DELETE FROM trajectory_data WHERE seq = ?", (seq,))
        conn.execute("DELETE FROM trajectories WHERE seq = ?", (seq,))


def migrate(conn: sqlite3.Connection, version: int) -> None:
    """Bring a v``version`` archive's tables up to :data:`SCHEMA_VERSION` inside the caller's
    transaction (the caller then runs :data:`SCHEMA`, which restores dropped triggers)."""
    _migrate_v2(conn, version)
    if version < 3:
        _set_aside_world_failures(conn)


def _migrate_v2(conn: sqlite3.Connection, version: int) -> None:
    if version < 2:
        from evolve.archive._codec import unpack

        cols = {r[1] for r in conn.execute("PRAGMA table_info(trajectories)")}
        for col, decl in (("calls", "INTEGER NOT NULL DEFAULT 0"), ("duration", "REAL NOT NULL DEFAULT 0.0")):
            if col not in cols:
                conn.execute(f"ALTER TABLE trajectories ADD COLUMN {col} {decl}")
        # fill the new columns of the stored rows from their JSON (once; the history is
        # append-only again as soon as SCHEMA recreates the trigger)
        conn.execute("DROP TRIGGER IF EXISTS trajectories_no_update")
        # in chunks, so that memory stays flat however many (large) trajectories are stored
        last = -1
        while True:
            rows = conn.execute(
                "SELECT seq, enc, data FROM trajectory_data WHERE seq > ? ORDER BY seq LIMIT 1000", (last,)
            ).fetchall()
            if not rows:
                break
            filled = []
            for seq, enc, data in rows:
                t = json.loads(unpack(enc, data))
                calls = sum(1 for step in t.get("steps") or () if step.get("kind") == "llm")
                filled.append((calls, float(t.get("duration") or 0.0), seq))
            conn.executemany("UPDATE trajectories SET calls = ?, duration = ? WHERE seq = ?", filled)
            last = rows[-1][0]
