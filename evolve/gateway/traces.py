"""The trace store: every call through the gateway, grouped into sessions, with feedback.

One SQLite file (``traces.sqlite`` in the store's folder), WAL journal, append-only: a call is one
row written in its own transaction when the call has finished (so a gateway killed with -9 loses
only the calls still in flight, never a finished one); feedback rows are added, never changed.
Several gateway processes (or threads) may write the same file: every write is a short
``BEGIN IMMEDIATE`` transaction under SQLite's busy timeout.

Tables:

* ``sessions`` — id, first and last call time, route, the system that answered the first call,
  a call count (kept by the same transaction as each call);
* ``calls`` — id, session, its place in the session, time, api (``openai`` / ``anthropic``),
  route, the model the agent asked for and the one that answered, the request (messages, tools
  offered, params) and the response (text, tool calls, finish reason) as JSON in the OpenAI
  chat format, the raw API body of each, token ids and log-probs where the backend gives them,
  latency, tokens, cost, the system id, status (``ok`` / ``error``) and the error;
* ``feedback`` — id (the client's, or one derived from its content, so sending it twice records
  it once), the session or call it is about, a score, named components, text, time.

Upstream API keys never reach the store: a request is recorded as the agent sent it, less its
headers. What a row holds (:class:`CallRecord`, :class:`Feedback`) and the conversation key are in
:mod:`evolve.gateway.records`; this module exports them too.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from evolve.errors import UserError
from evolve.gateway.records import CallRecord, Feedback, answer_message, chain_key, check_feedback, scores_of

SCHEMA_VERSION = 1
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY, created REAL NOT NULL, updated REAL NOT NULL, route TEXT, system_id TEXT,
    n_calls INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS calls (
    id TEXT PRIMARY KEY, session_id TEXT NOT NULL REFERENCES sessions(id), seq INTEGER NOT NULL,
    ts REAL NOT NULL, api TEXT NOT NULL, route TEXT, model TEXT, upstream_model TEXT, stream INTEGER NOT NULL,
    messages TEXT NOT NULL, tools TEXT, params TEXT, output TEXT, tool_calls TEXT, finish_reason TEXT,
    request TEXT, response TEXT, prompt_token_ids TEXT, token_ids TEXT, logprobs TEXT,
    latency_s REAL, prompt_tokens INTEGER, completion_tokens INTEGER, cost REAL, system_id TEXT,
    status TEXT NOT NULL, error TEXT, chain_key TEXT
);
CREATE INDEX IF NOT EXISTS calls_session ON calls(session_id, seq);
CREATE INDEX IF NOT EXISTS calls_chain ON calls(chain_key);
CREATE INDEX IF NOT EXISTS calls_ts ON calls(ts);
CREATE TABLE IF NOT EXISTS feedback (
    id TEXT PRIMARY KEY, session_id TEXT, call_id TEXT, score REAL, components TEXT, text TEXT, ts REAL NOT NULL,
    source TEXT
);
CREATE INDEX IF NOT EXISTS feedback_session ON feedback(session_id);
CREATE INDEX IF NOT EXISTS feedback_call ON feedback(call_id);
"""


_JSON_FIELDS = (
    "messages",
    "tools",
    "params",
    "tool_calls",
    "request",
    "response",
    "prompt_token_ids",
    "token_ids",
    "logprobs",
)
_CALL_COLUMNS = (
    "id",
    "session_id",
    "seq",
    "ts",
    "api",
    "route",
    "model",
    "upstream_model",
    "stream",
    "messages",
    "tools",
    "params",
    "output",
    "tool_calls",
    "finish_reason",
    "request",
    "response",
    "prompt_token_ids",
    "token_ids",
    "logprobs",
    "latency_s",
    "prompt_tokens",
    "completion_tokens",
    "cost",
    "system_id",
    "status",
    "error",
    "chain_key",
)


def _dumps(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class TraceStore:
    """The gateway's trace store in folder ``path`` (created unless ``create=False``). With
    ``read_only=True`` the file is opened read-only (SQLite ``mode=ro``): reads work, writes raise, and
    no file is created beside it (:mod:`evolve.archive.readonly`: ``immutable`` while no gateway has
    it open; through the gateway's ``-wal`` while one has, let go by :meth:`release` after each read)."""

    def __init__(self, path: str | Path, *, create: bool = True, read_only: bool = False) -> None:
        self.dir = Path(path)
        self.file = self.dir / "traces.sqlite"
        self.read_only = read_only
        if not self.file.exists():
            if not create or read_only:
                raise UserError(
                    f"no trace store at {self.dir} (no traces.sqlite); give the --store folder the "
                    "gateway was started with"
                )
            try:
                self.dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise UserError(f"cannot create the trace store folder {self.dir}: {e.strerror or e}") from None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._readers: list[Any] = []  # read-only: each thread's connection (closed by close())
        if read_only:
            row = self._db().execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None or int(row[0]) > SCHEMA_VERSION:
                raise UserError(
                    f"{self.file} is not a trace store this evolvekit reads (schema "
                    f"{row[0] if row else 'missing'}, reads {SCHEMA_VERSION})"
                )
            self.release()
            return
        self._db().executescript(_SCHEMA)  # CREATE ... IF NOT EXISTS: safe from several processes at once
        with self._tx() as db:
            row = db.execute("SELECT value FROM meta WHERE key='schema'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('schema', ?)", (str(SCHEMA_VERSION),))
            elif int(row[0]) > SCHEMA_VERSION:
                raise UserError(
                    f"the trace store {self.file} has schema {row[0]}, newer than this evolvekit "
                    f"understands ({SCHEMA_VERSION}); upgrade evolvekit"
                )

    # -- connections --------------------------------------------------------------------------------

    def _db(self) -> sqlite3.Connection:
        db = getattr(self._local, "db", None)
        if db is None:
            if self.read_only:
                return self._read_only()
            else:
                db = sqlite3.connect(self.file, timeout=30.0, isolation_level=None, check_same_thread=False)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: a committed call survives the process dying
            db.execute("PRAGMA busy_timeout=30000")
            db.row_factory = sqlite3.Row
            self._local.db = db
        return db

    class _Tx:
        def __init__(self, db: sqlite3.Connection) -> None:
            self.db = db

        def __enter__(self) -> sqlite3.Connection:
            self.db.execute("BEGIN IMMEDIATE")
            return self.db

        def __exit__(self, kind: Any, *rest: Any) -> None:
            try:
                self.db.execute("COMMIT" if kind is None else "ROLLBACK")
            except BaseException:
                if self.db.in_transaction:  # a failed COMMIT (disk full, I/O): never keep the write lock
                    try:
                        self.db.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                raise

    def _read_only(self) -> sqlite3.Connection:
        from evolve.archive.readonly import ReadOnly

        ro = getattr(self._local, "ro", None)
        if ro is None:
            ro = self._local.ro = ReadOnly(self.file)
            with self._lock:
                self._readers.append(ro)
        db = ro.connection()
        db.row_factory = sqlite3.Row
        return db

    def release(self) -> None:
        """A read-only store: this thread's reads ended; a connection through a gateway's ``-wal`` is
        let go, so that the gateway, ending while nobody reads, removes its files."""
        ro = getattr(self._local, "ro", None)
        if ro is not None:
            ro.done()

    def _tx(self) -> TraceStore._Tx:
        return TraceStore._Tx(self._db())

    def close(self) -> None:
        db = getattr(self._local, "db", None)
        if db is not None:
            db.close()
            self._local.db = None
        with self._lock:
            readers, self._readers = self._readers, []
        for ro in readers:
            ro.close()

    # -- writing ------------------------------------------------------------------------------------

    def record(self, call: CallRecord) -> CallRecord:
        """Store a finished call (its session is created on its first call); returns it with ``seq``."""
        with self._tx() as db:
            row = db.execute("SELECT n_calls FROM sessions WHERE id=?", (call.session_id,)).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO sessions (id, created, updated, route, system_id, n_calls) VALUES (?,?,?,?,?,0)",
                    (call.session_id, call.ts, call.ts, call.route, call.system_id),
                )
                seq = 0
            else:
                seq = int(row[0])
            call.seq = seq
            if call.status == "ok" and call.chain_key is None:
                call.chain_key = chain_key([*call.messages, answer_message(call)])
            elif call.status != "ok":
                call.chain_key = None  # only an answered call can be continued
            values = []
            for col in _CALL_COLUMNS:
                v = getattr(call, col)
                values.append(_dumps(v) if col in _JSON_FIELDS else (int(v) if col == "stream" else v))
            db.execute(
                f"INSERT INTO calls ({','.join(_CALL_COLUMNS)}) VALUES ({','.join('?' * len(_CALL_COLUMNS))})", values
            )
            db.execute(
                "UPDATE sessions SET n_calls=n_calls+1, updated=MAX(updated, ?) WHERE id=?", (call.ts, call.session_id)
            )
        return call

    def feedback(
        self,
        *,
        session_id: str | None = None,
        call_id: str | None = None,
        score: float | None = None,
        components: Mapping[str, float] | None = None,
        text: str | None = None,
        id: str | None = None,
        source: str | None = None,
    ) -> tuple[Feedback, bool]:
        """Attach a reward to a session or a call. Returns (the feedback as stored, whether it is new):
        feedback with an ``id`` already stored is recorded once (without an id, the id is a hash of
        its content, so an identical retry is recorded once too)."""
        fb = check_feedback(
            session_id=session_id, call_id=call_id, score=score, components=components, text=text, id=id, source=source
        )
        with self._tx() as db:
            if fb.call_id is not None:
                row = db.execute("SELECT session_id FROM calls WHERE id=?", (fb.call_id,)).fetchone()
                if row is None:
                    raise UserError(
                        f"no call {fb.call_id!r} in the trace store; feedback names a call id the gateway "
                        "returned (the response's id) or a session"
                    )
                if fb.session_id is not None and fb.session_id != row[0]:
                    raise UserError(f"call {fb.call_id!r} belongs to session {row[0]!r}, not {fb.session_id!r}")
                fb = Feedback(fb.id, row[0], fb.call_id, fb.score, fb.components, fb.text, fb.ts, fb.source)
            elif db.execute("SELECT 1 FROM sessions WHERE id=?", (fb.session_id,)).fetchone() is None:
                raise UserError(
                    f"no session {fb.session_id!r} in the trace store; feedback may only follow a session's first call"
                )
            old = db.execute("SELECT * FROM feedback WHERE id=?", (fb.id,)).fetchone()
            if old is not None:
                stored = _feedback_row(old)
                if (stored.session_id, stored.call_id) != (fb.session_id, fb.call_id):
                    raise UserError(
                        f"feedback {fb.id!r} was already given to "
                        f"{'call ' + repr(stored.call_id) if stored.call_id else 'session ' + repr(stored.session_id)}"
                        "; an id names one piece of feedback: choose another id"
                    )
                return stored, False
            db.execute(
                "INSERT INTO feedback (id, session_id, call_id, score, components, text, ts, source) "
                "VALUES (?,?,?,?,?,?,?,?)",
                (fb.id, fb.session_id, fb.call_id, fb.score, _dumps(fb.components), fb.text, fb.ts, fb.source),
            )
        return fb, True

    # -- reading ------------------------------------------------------------------------------------

    def calls(
        self,
        session_id: str | None = None,
        *,
        since: float | None = None,
        until: float | None = None,
        route: str | None = None,
        system_id: str | None = None,
        status: str | None = None,
    ) -> list[CallRecord]:
        where, args = [], []
        for col, op, v in (
            ("session_id", "=", session_id),
            ("ts", ">=", since),
            ("ts", "<", until),
            ("route", "=", route),
            ("system_id", "=", system_id),
            ("status", "=", status),
        ):
            if v is not None:
                where.append(f"{col} {op} ?")
                args.append(v)
        sql = "SELECT * FROM calls" + (" WHERE " + " AND ".join(where) if where else "") + " ORDER BY ts, seq"
        return [self._call(r) for r in self._db().execute(sql, args)]

    def continued_session(self, messages: Sequence[dict]) -> str | None:
        """The session whose last answered call these messages continue (the conversation up to the
        last assistant message is that call's messages and answer), or None."""
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
        if last is None:
            return None
        row = (
            self._db()
            .execute(
                "SELECT session_id FROM calls WHERE chain_key=? AND status='ok' ORDER BY ts DESC LIMIT 1",
                (chain_key(messages[: last + 1]),),
            )
            .fetchone()
        )
        return None if row is None else str(row[0])

    def call(self, call_id: str) -> CallRecord | None:
        row = self._db().execute("SELECT * FROM calls WHERE id=?", (call_id,)).fetchone()
        return None if row is None else self._call(row)

    def session_first(self, session_id: str) -> tuple[str | None, str | None] | None:
        """(the system that answered a session's first call, its route); None for a new session."""
        row = self._db().execute("SELECT system_id, route FROM sessions WHERE id=?", (session_id,)).fetchone()
        return None if row is None else (row[0], row[1])

    def sessions(self) -> list[dict[str, Any]]:
        rows = self._db().execute(
            "SELECT s.*, (SELECT COUNT(*) FROM feedback f WHERE f.session_id = s.id) AS n_feedback "
            "FROM sessions s ORDER BY created"
        )
        return [dict(r) for r in rows]

    def session_scores(
        self, since: float = 0.0, route: str | None = None
    ) -> list[tuple[str, str | None, float | None]]:
        """``(session id, system that answered its first call, its first score or None)`` of every
        session created at or after ``since`` (on ``route``), in one query: what a canary's test
        reads. The first score, so that a value once counted never changes under the test."""
        q = (
            "SELECT s.id, s.system_id, (SELECT f.score FROM feedback f WHERE f.session_id = s.id AND f.score IS NOT "
            "NULL ORDER BY f.ts, f.rowid LIMIT 1) FROM sessions s WHERE s.created >= ?"
        )
        args: list[Any] = [since]
        if route is not None:
            q += " AND s.route = ?"
            args.append(route)
        rows = self._db().execute(q + " ORDER BY s.created", args)
        return [(r[0], r[1], r[2]) for r in rows]

    def feedback_of(self, *, session_id: str | None = None, call_id: str | None = None) -> list[Feedback]:
        if session_id is None and call_id is None:
            rows = self._db().execute("SELECT * FROM feedback ORDER BY ts")
        elif call_id is not None:
            rows = self._db().execute("SELECT * FROM feedback WHERE call_id=? ORDER BY ts", (call_id,))
        else:
            rows = self._db().execute("SELECT * FROM feedback WHERE session_id=? ORDER BY ts", (session_id,))
        return [_feedback_row(r) for r in rows]

    def counts(self) -> dict[str, int]:
        db = self._db()
        return {
            t: int(db.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0]) for t in ("sessions", "calls", "feedback")
        }

    def integrity(self) -> list[str]:
        """Problems found (empty when sound): SQLite's own check, and sessions whose call count or
        sequence numbers disagree with their calls."""
        db = self._db()
        problems = [r[0] for r in db.execute("PRAGMA integrity_check") if r[0] != "ok"]
        for sid, n, got, seqs in db.execute(
            "SELECT s.id, s.n_calls, COUNT(c.id), GROUP_CONCAT(c.seq) FROM sessions s "
            "LEFT JOIN calls c ON c.session_id = s.id GROUP BY s.id"
        ):
            if n != got or sorted(int(x) for x in (seqs or "").split(",") if x) != list(range(got)):
                problems.append(f"session {sid}: n_calls {n}, {got} calls, seq {seqs}")
        return problems

    @staticmethod
    def _call(row: sqlite3.Row) -> CallRecord:
        kw = {k: row[k] for k in row.keys()}
        for k in _JSON_FIELDS:
            kw[k] = json.loads(kw[k]) if kw[k] is not None else None
        kw["params"] = kw["params"] or {}
        kw["stream"] = bool(kw["stream"])
        return CallRecord(**kw)


def _feedback_row(r: sqlite3.Row) -> Feedback:
    return Feedback(
        r["id"],
        r["session_id"],
        r["call_id"],
        r["score"],
        json.loads(r["components"] or "{}"),
        r["text"],
        r["ts"],
        r["source"],
    )


__all__ = ["CallRecord", "Feedback", "TraceStore", "answer_message", "chain_key", "check_feedback", "scores_of"]
