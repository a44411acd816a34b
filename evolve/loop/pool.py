"""Views of the pool of accepted systems: for the selector (:class:`~evolve.loop.selectors.Scored`,
with per-task validation scores and per-rollout metrics when the selector asks for them) and
for operators (``ctx.extra["pool"]``, loaded on first use).

Scores are the systems' validation means: sample 0 of every val task, or, for a system the
engine re-evaluated (``engine.reeval``), the mean over all its samples. A generation's pool
uses only what earlier generations decided, so a resumed generation selects the same parents.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from evolve.loop.selectors import Scored

if TYPE_CHECKING:
    from evolve.scoring.session import Session


def scored_pool(session: Session, before: int | None = None, detail: bool = False) -> list[Scored]:
    """The accepted systems (those accepted before generation ``before``, or all), each with
    its validation score; with ``detail``, also ``per_task`` and ``metrics`` (mean ``cost``,
    ``calls`` and ``latency`` per val rollout) from the stored val trajectories."""
    archive = session.archive
    refined = session.state.reevaluated()
    reeval = session.task.engine.reeval
    val_ids = {str(t["id"]) for t in session.tasks("val")} if detail else set()
    out = []
    for a in session.state.accepted():
        sid, gen = a.system_id, a.generation
        if before is not None and gen >= before:
            continue
        r = refined.get(sid)
        use_refined = r is not None and (before is None or r[1] < before)
        score = float(r[0]) if r is not None and use_refined else float(a.score)
        per_task, metrics = None, {}
        if detail:
            n = 1 + reeval.samples if use_refined and reeval is not None else 1
            per_task = {t: s for t, s in archive.task_scores(sid, "val", samples=n).items() if t in val_ids}
            metrics = archive.rollout_metrics(sid, "val", samples=n)
        out.append(Scored(sid, score, gen, per_task=per_task, metrics=metrics))
    return out


class OperatorPool(Sequence[dict]):
    """``ctx.extra["pool"]``: ``{"system": System, "score": float, "per_task": {task: score} | None,
    "metrics": {...}}`` for every system accepted so far, built on first access (an operator
    that never looks at it costs nothing)."""

    def __init__(self, session: Session) -> None:
        self._session = session
        self._items: list[dict[str, Any]] | None = None

    def _load(self) -> list[dict[str, Any]]:
        if self._items is None:
            get = self._session.archive.get_system
            self._items = [
                {
                    "system": get(s.system_id),
                    "score": s.score,
                    "per_task": s.per_task or None,
                    "metrics": s.metrics,
                    "generation": s.generation,
                }
                for s in scored_pool(self._session, detail=True)
            ]
        return self._items

    def __len__(self) -> int:
        return len(self._load())

    def __getitem__(self, i: Any) -> Any:
        return self._load()[i]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self._load())

    def __repr__(self) -> str:
        return f"OperatorPool({'not loaded' if self._items is None else len(self._items)})"
