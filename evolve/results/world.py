"""A world's own figures for a system's scored split (its ``eval.summary`` hook: IFEval's four
accuracies, say), for ``evolve eval`` and the run report."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from evolve.scoring.session import Session
    from evolve.types import System


def summary_hook(session: Session) -> Any:
    """The run's world's ``eval.summary`` function, or None (no world, or a world without one)."""
    name = session.task.world
    if not name:
        return None
    from evolve.registry import import_path
    from evolve.world import load_world

    path = load_world(name).hook("eval.summary")
    return import_path(path, what="eval.summary hook") if path else None


def world_summary(session: Session, system: System, split: str) -> dict[str, Any] | None:
    """The world's summary of ``system``'s evaluation rollouts on ``split`` (memoised: scored
    here if they are not stored yet), one per task; None where the world has no such hook."""
    hook = summary_hook(session)
    if hook is None:
        return None
    tasks = {str(t["id"]): t for t in session.tasks(split)}
    last = {str(t.task_id): t for t in session.evaluation(system, split) if str(t.task_id) in tasks}
    ids = sorted(last)
    return hook([tasks[i] for i in ids], [last[i].reward for i in ids])


class WorldSection:
    """``report.json``'s ``world_summary`` ({baseline, best}: {split: summary}) and its lines in
    ``report.md``; nothing for ``evolve archive show``."""

    def build(self, session: Session, best_id: str | None, baseline_id: str | None) -> dict[str, Any]:
        if baseline_id is None or summary_hook(session) is None:
            return {}
        out: dict[str, Any] = {}
        for name, sid in (("baseline", baseline_id), ("best", best_id or baseline_id)):
            system = session.archive.get_system(sid)
            stored = {split for split in ("val", "test") if session.archive.task_scores(sid, split)}
            out[name] = {split: world_summary(session, system, split) for split in ("val", "test") if split in stored}
        return {"world_summary": out}

    def markdown(self, report: dict[str, Any]) -> list[str]:
        ws = report.get("world_summary")
        if not ws:
            return []
        lines = ["", "## The world's figures", ""]
        same = (report.get("best") or {}).get("system_id") == (report.get("baseline") or {}).get("system_id")
        for name in ("baseline",) if same else ("baseline", "best"):
            for split, s in (ws.get(name) or {}).items():
                if s:
                    lines += [f"{name} on {split}:", "", "```", *s.get("lines", []), "```", ""]
        return lines

    def prepare(self, system: Any, png: Any) -> None:
        return None

    def show(self, out: Any, err: Any, sid: str) -> None:
        return None


__all__ = ["WorldSection", "summary_hook", "world_summary"]
