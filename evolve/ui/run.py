"""One run as the dashboard reads it: read-only, cheap to poll, cached until the run writes.

:class:`RunView` opens the run's archive with SQLite's ``mode=ro`` (every write raises), so the
dashboard can never change a run, and can look at one that is still being written. Its answers
are cached under the archive's :meth:`~RunView.version` (the newest row of each history table),
so polling a finished run costs a few index lookups and a live run is re-read only when it wrote.

What a run is doing (:meth:`RunView.status`) is what its engine last said (``finished``,
``failed``, ``stopped``, ``running``), whatever a promotion or a rollback wrote since; ``running``
holds while it wrote within :data:`ACTIVE_S` seconds, then it is ``stopped`` (killed:
``evolve run --resume`` continues it). A run an older evolvekit made is ``finished`` or ``failed``
when ``report.json`` is newer than its engine's last write.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from evolve.archive import Archive
from evolve.results.report import read_report
from evolve.results.stats import interval, with_bounds
from evolve.scoring.state import RunState
from evolve.ui import lineage

ACTIVE_S = 120.0
# what the engine records a rollout under (the gate's own: evolve.deploy.gates)
SPLITS = ("train", "val", "test", "gate")
T = TypeVar("T")


class NotFound(LookupError):
    """What the request names is not here (answered 404; other errors are the dashboard's own)."""


class RunView:
    """The dashboard's read-only view of one run directory."""

    def __init__(self, run_dir: Path, rid: str, *, shown: str | None = None) -> None:
        self.run_dir, self.id = Path(run_dir), rid
        self.shown = shown or self.run_dir.name  # how the page names it (never the server's absolute path)
        self.archive = Archive(self.run_dir, create=False, read_only=True)
        self.runstate = RunState(self.archive)
        self._cache: dict[Any, tuple[str, Any]] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self.archive.close()

    def sql(self, query: str, args: tuple[Any, ...] = ()) -> list[tuple]:
        with self.archive._read() as c:  # the archive's own connection (read-only), for the views' own queries
            return c.execute(query, args).fetchall()

    # ------------------------------------------------------------------ change detection and caching

    def version(self) -> str:
        """Changes whenever the run writes anything the dashboard shows, or its status changes (a run
        that stops writing becomes ``stopped`` without writing)."""
        parts = self.sql(
            "SELECT (SELECT COALESCE(MAX(seq), 0) FROM systems), (SELECT COALESCE(MAX(seq), 0) FROM trajectories), "
            "(SELECT COALESCE(MAX(seq), 0) FROM events), (SELECT COALESCE(MAX(seq), 0) FROM pointer), "
            "(SELECT COALESCE(MAX(updated_at), 0) FROM state)"
        )[0]
        report = self.run_dir / "report.json"
        mtime = report.stat().st_mtime if report.exists() else 0
        return ".".join(str(p) for p in parts) + f".{mtime}.{self.status()}"

    def cached(self, key: Any, compute: Callable[[], T]) -> T:
        v = self.version()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] == v:
                return hit[1]
        value = compute()
        with self._lock:
            if len(self._cache) > 256:
                self._cache.clear()
            self._cache[key] = (v, value)
        return value

    # ------------------------------------------------------------------ the run

    def state(self, key: str, default: Any = None) -> Any:
        return self.archive.get_state(key, default)

    def task(self) -> dict[str, Any]:
        """The run's task settings (stored as the task file's canonical JSON text)."""
        task = self.state("task") or {}
        return json.loads(task) if isinstance(task, str) else task

    def report(self) -> dict[str, Any] | None:
        return read_report(self.run_dir)

    def last_write(self) -> float:
        row = self.sql(
            "SELECT MAX(t) FROM (SELECT (SELECT created_at FROM trajectories ORDER BY seq DESC LIMIT 1) AS t "
            "UNION ALL SELECT (SELECT created_at FROM systems ORDER BY seq DESC LIMIT 1) "
            "UNION ALL SELECT (SELECT created_at FROM events ORDER BY seq DESC LIMIT 1) "
            "UNION ALL SELECT MAX(updated_at) FROM state)"
        )
        return float(row[0][0] or 0.0)

    def status(self) -> str:
        """The run's own status, as its engine last set it (:attr:`RunState.status`): a promotion, a
        rollback or an evaluation after the run's end writes to the archive and changes nothing here.
        ``running`` reads as ``stopped`` once nothing was written for :data:`ACTIVE_S` seconds (a
        killed run says nothing more)."""
        own = self.runstate.status
        if own in ("finished", "failed", "stopped"):
            return own
        if own is None:  # a run an older evolvekit made
            report = self.run_dir / "report.json"
            if report.exists() and report.stat().st_mtime >= self._engine_write() - 1.0:
                r = self.report() or {}
                return "failed" if str(r.get("stop_reason", "")).startswith("failed") else "finished"
        return "running" if time.time() - self.last_write() < ACTIVE_S else "stopped"

    def _engine_write(self) -> float:
        """When the run itself last wrote: its systems, rollouts and events, not a deploy's (its gate
        rollouts, its events, the pointer and the state it keeps)."""
        row = self.sql(
            "SELECT MAX(t) FROM (SELECT (SELECT created_at FROM systems ORDER BY seq DESC LIMIT 1) AS t "
            "UNION ALL SELECT (SELECT created_at FROM trajectories WHERE phase != 'gate' ORDER BY seq DESC LIMIT 1) "
            "UNION ALL SELECT (SELECT created_at FROM events WHERE kind NOT LIKE 'deploy%' ORDER BY seq DESC LIMIT 1))"
        )
        return float(row[0][0] or 0.0)

    def score(self, system_id: str | None, split: str) -> dict[str, Any] | None:
        """``{mean, n, low, high}`` over the tasks of ``split`` the system was scored on (each task's
        mean over its samples first: re-evaluated samples of one task are not more tasks), with the
        95% interval ``[low, high]`` (:func:`evolve.results.stats.interval`: Wilson for scores in
        [0, 1]), or None."""
        if not system_id:
            return None
        mean, sq, lo, hi, n = self.sql(
            "SELECT AVG(m), AVG(m * m), MIN(m), MAX(m), COUNT(*) FROM (SELECT AVG(score) AS m FROM trajectories "
            "WHERE system_id = ? AND split = ? AND phase = 'eval' GROUP BY task_id)",
            (system_id, split),
        )[0]
        if not n:
            return None
        low, high = interval(mean, sq, n, unit=0.0 <= lo and hi <= 1.0) or (None, None)
        return {"mean": mean, "n": n, "low": low, "high": high}

    def marks(self) -> dict[str, str | None]:
        baseline = self.runstate.baseline
        return {"baseline": baseline, "best": self.state("best") or baseline, "current": self.archive.current()}

    def summary(self) -> dict[str, Any]:
        """What the runs page shows of a run (its status and last write read now, not cached)."""
        return {**self.cached("summary", self._summary), "status": self.status(), "updated": self.last_write()}

    def _summary(self) -> dict[str, Any]:
        task = self.task()
        gens = self.runstate.generations()
        marks = self.marks()
        used = self.archive.usage(test=False)
        for k, v in self.runstate.operator_llm().items():  # the operators' own model calls count too
            if k in ("calls", "tokens", "cost"):
                used[k] = used.get(k, 0) + v
        used["seconds"] = round(self.runstate.elapsed, 1)
        budget = {k: v for k, v in (task.get("budget") or {}).items() if v is not None}
        report = self.report() or {}
        systems = self.sql("SELECT COUNT(*) FROM systems")[0][0]

        def entry(sid: str | None) -> dict[str, Any] | None:
            return None if not sid else {"id": sid, "val": self.score(sid, "val"), "test": self.score(sid, "test")}

        return {
            "id": self.id,
            "dir": self.shown,
            "name": task.get("name") or self.run_dir.name,
            "world": task.get("world"),
            "seed": task.get("seed"),
            "stop_reason": report.get("stop_reason"),
            "generation": max((g.index for g in gens), default=None),
            "systems": systems,
            "used": used,
            "budget": budget,
            "baseline": entry(marks["baseline"]),
            "best": entry(marks["best"]),
            "current": marks["current"],
            "paired": {k: with_bounds(v) for k, v in report["paired"].items()} if report.get("paired") else None,
            "operators": [o.get("name") for o in task.get("operators") or []],
        }

    # ------------------------------------------------------------------ per generation

    def curves(self) -> dict[str, Any]:
        """Per generation: the best val score after it, the median and count of its children's val
        scores, and what it spent (rollouts, LLM calls, tokens, money, seconds)."""
        return self.cached("curves", self._curves)

    def _curves(self) -> dict[str, Any]:
        gens = sorted(self.runstate.generations(), key=lambda g: g.index)
        val = self._val_scores()
        born: dict[int, list[float]] = {}
        for sid, gen in self.sql("SELECT id, generation FROM systems"):
            if sid in val:
                born.setdefault(gen, []).append(val[sid][0])
        spent: dict[int, float] = {}
        if any(g.get("cost") is None for g in gens):  # rows of an evolvekit before they recorded their cost
            spent = dict(
                self.sql(
                    "SELECT generation, COALESCE(SUM(cost), 0) FROM trajectories WHERE split != 'test' "
                    "GROUP BY generation"
                )
            )
        rows = []
        for g in gens:
            scores = born.get(g.index, [])
            cost = g.get("cost")
            rows.append(
                {
                    **{
                        k: g.get(k)
                        for k in (
                            "index",
                            "best_val",
                            "best",
                            "children",
                            "accepted",
                            "rollouts",
                            "calls",
                            "tokens",
                            "seconds",
                        )
                    },
                    "median_val": statistics.median(scores) if scores else None,
                    "scored": len(scores),
                    "cost": round(float(cost if cost is not None else spent.get(g.index, 0.0)), 6),
                }
            )
        return {"generations": rows}

    def curriculum(self) -> dict[str, Any] | None:
        """The run's curriculum (``engine.curriculum``), None without one: its settings as the task file
        gave them and, per generation, each group's level and share of the training tasks, the move and
        the success counts that decided it (:func:`evolve.loop.curriculum.decision_rows`)."""
        return self.cached("curriculum", self._curriculum)

    def _curriculum(self) -> dict[str, Any] | None:
        from evolve.loop.curriculum import decision_rows

        decisions = self.runstate.curricula()
        if not decisions:
            return None
        settings = (self.task().get("engine") or {}).get("curriculum")
        return {"settings": settings, "generations": decision_rows(decisions)}

    def other_splits(self) -> list[str]:
        """The splits outside :data:`SPLITS` the run's rollouts were recorded under: a world's own,
        e.g. IFEval's ``unseen`` (``evolve eval --split unseen``)."""
        return self.cached(
            "other_splits",
            lambda: sorted(r[0] for r in self.sql("SELECT DISTINCT split FROM trajectories") if r[0] not in SPLITS),
        )

    def _val_scores(self) -> dict[str, tuple[float, int]]:
        return self.cached("val", lambda: self.archive.all_scores("val"))

    # ------------------------------------------------------------------ lineage

    def decisions(self) -> dict[str, dict[str, Any]]:
        """The acceptance decision of every judged child, by its id."""
        return self.cached("decisions", lambda: {e["child"]: e for e in self.archive.events("decision")})

    def deploy_states(self) -> dict[str, str]:
        def states() -> dict[str, str]:
            from evolve.deploy.lifecycle import Deployment

            return Deployment(self.archive).states() if self.archive.events("deploy") else {}

        return self.cached("deploy_states", states)

    def nodes(self) -> list[lineage.Node]:
        def build() -> list[lineage.Node]:
            parents: dict[str, list[tuple[int, str]]] = {}
            for child, pos, parent in self.sql("SELECT child, position, parent FROM lineage"):
                parents.setdefault(child, []).append((pos, parent))
            return [
                lineage.Node(sid, gen, tuple(p for _, p in sorted(parents.get(sid, ()))), seq)
                for seq, sid, gen in self.sql("SELECT seq, id, generation FROM systems ORDER BY seq")
            ]

        return self.cached("nodes", build)

    def lineage(self, expanded: Sequence[str] = (), mode: str = "auto") -> dict[str, Any]:
        """The lineage picture (:func:`evolve.ui.lineage.picture`) with each node's operator, val
        score, acceptance and marks."""
        return self.cached(("lineage", tuple(sorted(expanded)), mode), lambda: self._lineage(expanded, mode))

    def _lineage(self, expanded: Sequence[str], mode: str) -> dict[str, Any]:
        nodes = self.nodes()
        ops = dict(self.sql("SELECT id, operator FROM systems"))
        val = self._val_scores()
        decided = self.decisions()
        accepted = {a.system_id for a in self.runstate.accepted()}
        marks = self.marks()
        deploy = self.deploy_states()
        facts = {}
        for n in nodes:
            d = decided.get(n.id)
            facts[n.id] = {
                "operator": ops.get(n.id),
                "val": val[n.id][0] if n.id in val else None,
                "accepted": True if n.id in accepted else (False if d is not None else None),
                "why": d.get("why") if d else None,
                "deploy": deploy.get(n.id),
                "marks": [k for k, v in marks.items() if v == n.id],
            }
        keep = accepted | set(deploy)
        pic = lineage.picture(
            nodes, facts, keep=keep, marked=[v for v in marks.values() if v], expanded=expanded, mode=mode
        )
        pic["marks"] = marks
        return pic
