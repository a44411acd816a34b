"""Live traffic and deployments as the dashboard shows them: a gateway's trace store (sessions,
their calls, the users' feedback; read-only) and a run's deployment (the lifecycle state of each
system, the audit trail, the canary under way with its test on the traffic)."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from evolve.ui.run import RunView

SESSION_COLUMNS = ("id", "created", "updated", "route", "system_id", "n_calls")


class TrafficView:
    """The dashboard's read-only view of one trace store (a gateway's ``--store`` folder)."""

    def __init__(self, folder: Path, tid: str) -> None:
        from evolve.gateway.traces import TraceStore

        self.dir, self.id = Path(folder), tid
        self.store = TraceStore(self.dir, create=False, read_only=True)
        self._lock = threading.Lock()

    def close(self) -> None:
        self.store.close()

    def sql(self, query: str, args: tuple[Any, ...] = ()) -> list[Any]:
        with self._lock:
            return self.store._db().execute(query, args).fetchall()

    def version(self) -> str:
        row = self.sql("SELECT (SELECT COUNT(*) FROM sessions), (SELECT COALESCE(MAX(ts), 0) FROM calls), "
                       "(SELECT COUNT(*) FROM feedback)")[0]
        return ".".join(str(x) for x in tuple(row))

    def summary(self) -> dict[str, Any]:
        counts = self.store.counts()
        routes = [{"route": r[0], "system": r[1], "sessions": r[2], "scored": r[3], "mean": r[4]} for r in self.sql(
            "SELECT s.route, s.system_id, COUNT(*), COUNT(f.score), AVG(f.score) FROM sessions s LEFT JOIN "
            "(SELECT session_id, MIN(rowid), score FROM feedback WHERE score IS NOT NULL GROUP BY session_id) f "
            "ON f.session_id = s.id GROUP BY s.route, s.system_id ORDER BY s.route, MIN(s.created)")]
        last = self.sql("SELECT MAX(ts) FROM calls")[0][0]
        return {"id": self.id, "dir": str(self.dir), **counts, "last_call": last, "by_route_and_system": routes}

    def sessions(self, *, offset: int = 0, limit: int = 50, route: str | None = None, system: str | None = None
                 ) -> dict[str, Any]:
        where, args = ["1 = 1"], []
        for col, val in (("s.route", route), ("s.system_id", system)):
            if val:
                where.append(f"{col} = ?")
                args.append(val)
        q = " AND ".join(where)
        total = self.sql(f"SELECT COUNT(*) FROM sessions s WHERE {q}", tuple(args))[0][0]
        rows = self.sql(
            f"SELECT {', '.join('s.' + c for c in SESSION_COLUMNS)}, (SELECT f.score FROM feedback f WHERE "
            "f.session_id = s.id AND f.score IS NOT NULL ORDER BY f.ts, f.rowid LIMIT 1), (SELECT COUNT(*) FROM feedback "
            f"f WHERE f.session_id = s.id) FROM sessions s WHERE {q} ORDER BY s.created DESC LIMIT ? OFFSET ?",
            (*args, max(1, min(int(limit), 500)), max(0, int(offset))))
        return {"total": total, "rows": [{**dict(zip(SESSION_COLUMNS, tuple(r)[:6])), "score": r[6], "feedback": r[7]}
                                         for r in rows]}

    def session(self, session_id: str) -> dict[str, Any]:
        head = self.sql(f"SELECT {', '.join(SESSION_COLUMNS)} FROM sessions WHERE id = ?", (session_id,))
        if not head:
            raise LookupError(f"no session {session_id!r} in {self.dir}")
        calls = []
        for c in self.store.calls(session_id):
            d = {k: getattr(c, k) for k in ("id", "seq", "ts", "api", "route", "model", "upstream_model", "stream",
                                            "messages", "tools", "params", "output", "tool_calls", "finish_reason",
                                            "token_ids", "logprobs", "latency_s", "prompt_tokens",
                                            "completion_tokens", "cost", "system_id", "status", "error")}
            calls.append(d)
        feedback = [{"id": f.id, "call_id": f.call_id, "score": f.score, "components": f.components, "text": f.text,
                     "ts": f.ts, "source": f.source} for f in self.store.feedback_of(session_id=session_id)]
        return {"session": dict(zip(SESSION_COLUMNS, tuple(head[0]))), "calls": calls, "feedback": feedback}


def deployment(run: RunView, traffic: TrafficView | None = None) -> dict[str, Any]:
    """The run's deployment: the active system, every system's lifecycle state, the audit trail, the
    canary under way (and its test on ``traffic``, when the store that serves it is open)."""
    return run.cached(("deploy", traffic.version() if traffic else None), lambda: _deployment(run, traffic))


def _deployment(run: RunView, traffic: TrafficView | None) -> dict[str, Any]:
    from evolve.deploy.lifecycle import Deployment

    dep = Deployment(run.archive)
    out: dict[str, Any] = {"active": dep.active(), "states": dep.states(), "canary": dep.canary(),
                           "blocked": dep.blocked(), "trail": dep.events(), "pointer": [
                               {"system": s, "reason": r, "at": t} for s, r, t in run.archive.pointer_history()]}
    if out["canary"] is not None and traffic is not None:
        from evolve.deploy.canary import arm_scores, decide

        c, a = arm_scores(traffic.store, out["canary"])
        decision, ev = decide(c, a, out["canary"], started=out["canary"]["started"])
        out["canary_test"] = json.loads(json.dumps({"decision": decision, **ev}, default=str))
    return out
