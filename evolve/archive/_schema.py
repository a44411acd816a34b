"""The archive's SQLite schema: tables, indexes and the append-only triggers."""

from __future__ import annotations

import sqlite3

SCHEMA_VERSION = 1
DB_NAME = "archive.sqlite"
ARTIFACTS_DIR = "artifacts"

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
