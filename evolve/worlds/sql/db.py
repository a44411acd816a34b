"""Safe SQL execution on a task's database: one read-only SELECT, bounded rows and time."""

from __future__ import annotations

import re
import sqlite3
import time
import urllib.parse
from pathlib import Path
from typing import Any

MAX_ROWS = 50
TIMEOUT_S = 1.0
_ALLOWED = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION, sqlite3.SQLITE_RECURSIVE}


class SQLError(Exception):
    """A query was refused or failed; ``str(e)`` is the short message the model sees."""


def _authorizer(action: int, *_: Any) -> int:
    return sqlite3.SQLITE_OK if action in _ALLOWED else sqlite3.SQLITE_DENY


def _strip_literals(sql: str) -> str:
    return re.sub(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"", "''", sql)


def clean_sql(text: Any) -> str:
    """Model output -> one SQL string: code fences removed, whitespace collapsed, trailing ``;`` dropped."""
    if not isinstance(text, str):
        return ""
    m = re.search(r"```(?:sql)?\s*(.*?)```", text, flags=re.S | re.I)
    if m:
        text = m.group(1)
    return " ".join(text.split()).rstrip("; ").strip()


def _check(sql: Any) -> str:
    if not isinstance(sql, str):
        raise SQLError(f"query must be a string, got {type(sql).__name__}")
    sql = sql.strip().rstrip(";").strip()
    if not sql:
        raise SQLError("empty query")
    bare = _strip_literals(sql)
    if ";" in bare:
        raise SQLError("only one statement is allowed")
    if not re.match(r"select\b", bare.lstrip("( \n\t"), flags=re.I):
        raise SQLError("only select queries are allowed")
    return sql


def _connect(db: str | Path, timeout: float) -> sqlite3.Connection:
    path = Path(db)
    if not path.is_file():
        raise SQLError(f"no such database: {db}")
    uri = "file:" + urllib.parse.quote(str(path.resolve())) + "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=timeout, check_same_thread=False)
    conn.execute("pragma query_only = 1")
    conn.set_authorizer(_authorizer)
    deadline = time.monotonic() + timeout
    conn.set_progress_handler(lambda: 1 if time.monotonic() > deadline else 0, 1000)
    return conn


def _json(v: Any) -> Any:
    if isinstance(v, bytes):
        return v.hex()
    return v


def execute(db: str, sql: str, *, max_rows: int = MAX_ROWS, timeout: float = TIMEOUT_S) -> list[list[Any]]:
    """Run one SELECT on the database file ``db``, read-only, and return at most ``max_rows``
    rows as lists of JSON values. Anything else (writes, several statements, a query running
    past ``timeout`` seconds, an sqlite error) raises :class:`SQLError` with a short message."""
    sql = _check(sql)
    conn = _connect(db, timeout)
    try:
        rows = conn.execute(sql).fetchmany(max_rows)
    except sqlite3.Error as e:
        msg = str(e)
        raise SQLError("query timed out" if "interrupt" in msg else msg) from None
    finally:
        conn.close()
    return [[_json(v) for v in r] for r in rows]


def compiles(db: str, sql: str) -> bool:
    """Whether sqlite accepts ``sql`` (a single allowed SELECT whose names all resolve)."""
    try:
        sql = _check(sql)
        conn = _connect(db, TIMEOUT_S)
    except SQLError:
        return False
    try:
        conn.execute("explain " + sql).fetchall()
        return True
    except sqlite3.Error:
        return False
    finally:
        conn.close()


def error_text(e: BaseException) -> str:
    """The tool message the model sees after a failed query, e.g. ``error: no such column: agee``."""
    msg = " ".join(str(e).split()) or type(e).__name__
    return "error: " + msg[:120]
