"""Live traffic and deployments as the dashboard shows them: a gateway's trace store (sessions,
their calls, the users' feedback; read-only) and a run's deployment (the lifecycle state of each
system, the audit trail, the canary under way with its test on the traffic)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from evolve.ui.run import NotFound, RunView

SESSION_COLUMNS = ("id", "created", "updated", "route", "system_id", "n_calls")


class TrafficView:
    """The dashboard's read-only view of one trace store (a gateway's ``--store`` folder)."""

    def __init__(self, folder: Path, tid: str, *, shown: str | None = None) -> None:
        from evolve.gateway.traces import TraceStore

        self.dir, self.id = Path(folder), tid
        self.shown = shown or self.dir.name  # how the page names it (never the server's absolute path)
        self.store = TraceStore(self.dir, create=False, read_only=True)  # leaves no file beside it

    def close(self) -> None:
        self.store.close()

    def sql(self, query: str, args: tuple[Any, ...] = ()) -> list[Any]:
        return self.store._db().execute(query, args).fetchall()

    def version(self) -> str:
        row = self.sql(
            "SELECT (SELECT COUNT(*) FROM sessions), (SELECT COALESCE(MAX(ts), 0) FROM calls), "
            "(SELECT COUNT(*) FROM feedback)"
        )[0]
        return ".".join(str(x) for x in tuple(row))

    def summary(self) -> dict[str, Any]:
        """Counts, and per route and serving system: sessions, those scored, the mean of their first
        scores (the first score of a session, as the canary counts it: TraceStore.session_scores)."""
        counts = self.store.counts()
        groups: dict[tuple[Any, Any], list[float | None]] = {}
        routes = dict(self.sql("SELECT id, route FROM sessions"))
        for sid, system, score in self.store.session_scores():
            groups.setdefault((routes.get(sid), system), []).append(score)
        by = [
            {
                "route": r,
                "system": sy,
                "sessions": len(v),
                "scored": sum(x is not None for x in v),
                "mean": (sum(x for x in v if x is not None) / max(1, sum(x is not None for x in v)))
                if any(x is not None for x in v)
                else None,
            }
            for (r, sy), v in groups.items()
        ]
        last = self.sql("SELECT MAX(ts) FROM calls")[0][0]
        return {"id": self.id, "dir": self.shown, **counts, "last_call": last, "by_route_and_system": by}

    def sessions(
        self, *, offset: int = 0, limit: int = 50, route: str | None = None, system: str | None = None
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
            (*args, max(1, min(int(limit), 500)), max(0, int(offset))),
        )
        return {
            "total": total,
            "rows": [{**dict(zip(SESSION_COLUMNS, tuple(r)[:6])), "score": r[6], "feedback": r[7]} for r in rows],
        }

    def session(self, session_id: str) -> dict[str, Any]:
        head = self.sql(f"SELECT {', '.join(SESSION_COLUMNS)} FROM sessions WHERE id = ?", (session_id,))
        if not head:
            raise NotFound(f"no session {session_id!r} in {self.shown}")
        calls = []
        for c in self.store.calls(session_id):
            d = {
                k: getattr(c, k)
                for k in (
                    "id",
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
                    "token_ids",
                    "logprobs",
                    "latency_s",
                    "prompt_tokens",
                    "completion_tokens",
                    "cost",
                    "system_id",
                    "status",
                    "error",
                )
            }
            calls.append(d)
        feedback = [
            {
                "id": f.id,
                "call_id": f.call_id,
                "score": f.score,
                "components": f.components,
                "text": f.text,
                "ts": f.ts,
                "source": f.source,
            }
            for f in self.store.feedback_of(session_id=session_id)
        ]
        return {"session": dict(zip(SESSION_COLUMNS, tuple(head[0]))), "calls": calls, "feedback": feedback}


def deployment(run: RunView, stores: Sequence[TrafficView] = ()) -> dict[str, Any]:
    """The run's deployment: the active system, every system's lifecycle state, the audit trail, the
    canary under way and its test, on the trace store (and route) whose sessions the candidate served
    (read now: the test depends on the time as well as the traffic)."""
    out = dict(run.cached("deploy", lambda: _deployment(run)))
    canary = out["canary"]
    if canary is not None:
        from evolve.deploy.canary import arm_scores, decide

        for traffic in stores:
            routes = Counter(
                r
                for (r,) in traffic.sql(
                    "SELECT route FROM sessions WHERE system_id = ? AND created >= ?",
                    (canary["system"], canary["started"]),
                )
            )
            if routes:
                route = routes.most_common(1)[0][0]
                c, a = arm_scores(traffic.store, canary, route)
                decision, ev = decide(c, a, canary, started=canary["started"])
                out["canary_test"] = json.loads(
                    json.dumps({"decision": decision, "store": traffic.id, "route": route, **ev}, default=str)
                )
                break
    return out


def _deployment(run: RunView) -> dict[str, Any]:
    from evolve.deploy.lifecycle import Deployment

    dep = Deployment(run.archive)
    return {
        "active": dep.active(),
        "states": dep.states(),
        "canary": dep.canary(),
        "blocked": dep.blocked(),
        "trail": dep.events(),
        "problems": dep.check(),
        "pointer": [{"system": s, "reason": r, "at": t} for s, r, t in run.archive.pointer_history()],
    }
