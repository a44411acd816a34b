"""The run report: ``report.json`` and ``report.md`` in the run directory.

``report.json`` holds ``baseline`` and ``best`` (each with ``system_id`` and per-split
``{score, n}`` for ``val`` and ``test``; ``best`` is the run's best-scored system, and when the
current one differs, after a rollback or under a deploy policy, ``current`` names it and says why),
the ``generations`` list, the budget used (all of it,
and ``budget_used_by_run``: before the final test scoring, which is outside the budget) and why
the run stopped. ``paired`` holds, per split, the best system against the baseline on the same
tasks (:func:`evolve.results.stats.paired`: the gain's 95% interval, the tasks only one of them wins, the
sign test), so a reader can tell a gain from noise. The layers add sections
(:data:`evolve.registry.report_sections`): with a workflow graph, ``workflow`` holds the best (else the
baseline) system's graph as text and ``best_workflow.png`` its picture; ``workflows_tried`` what a
topology search scored.
``environment`` records the Python, the platform and the installed versions of the libraries a
result depends on (torch, transformers, peft, ...), so a number can be traced to what produced it.
``failures`` counts, per split, the rollouts that failed by the agent's or the reward's own error
(scores of 0) with their most common kinds, and the world failures that were retried and never
scored; ``out_of_range`` counts the scores outside the task's ``reward_range``.
"""

from __future__ import annotations

import json
import math
import platform
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.failures import describe_common, most_common
from evolve.results.stats import describe, paired

if TYPE_CHECKING:
    from evolve.scoring.session import Session


@dataclass(frozen=True)
class SplitScore:
    score: float  # mean score over the split's tasks
    n: int  # tasks


@dataclass(frozen=True)
class SystemScores:
    system_id: str
    val: SplitScore | None = None
    test: SplitScore | None = None


class RunReport(dict):
    """What :func:`evolve.run` returns: ``report.json`` as a mapping (``report["best"]["test"]``),
    with typed views of its parts (``report.best.test.score``, ``report.gain("test")``)."""

    def _system(self, which: str) -> SystemScores | None:
        e = self.get(which)
        if not e:
            return None
        return SystemScores(
            e["system_id"], *(SplitScore(e[s]["score"], e[s]["n"]) if s in e else None for s in ("val", "test"))
        )

    @property
    def baseline(self) -> SystemScores | None:
        """The starting system's scores."""
        return self._system("baseline")

    @property
    def best(self) -> SystemScores | None:
        """The run's best-scored system's scores (``report["current"]`` names the current system when it
        is another: after a rollback, or under a deploy policy)."""
        return self._system("best")

    @property
    def run_dir(self) -> Path:
        return Path(self["run_dir"])

    @property
    def stop_reason(self) -> str:
        return str(self.get("stop_reason") or "")

    @property
    def generations(self) -> list[Any]:
        """One :class:`~evolve.scoring.state.GenerationRow` per generation."""
        from evolve.scoring.state import GenerationRow

        return [GenerationRow.model_validate(g) for g in self.get("generations", [])]

    def gain(self, split: str = "test") -> float | None:
        """The best system's score minus the baseline's on ``split`` (None when either lacks it)."""
        return gain(self, split)

    def comparison(self, split: str = "test") -> dict[str, Any] | None:
        """The paired comparison on ``split`` (:func:`evolve.results.stats.paired`: ``diff``, its 95% interval
        ``low``/``high`` (and ``ci95``, the normal half-width), ``p``, ...)."""
        return (self.get("paired") or {}).get(split)


# the distributions whose versions can change a recorded number (sampling, training, embeddings, clients)
TRACKED = (
    "evolvekit",
    "torch",
    "transformers",
    "peft",
    "safetensors",
    "numpy",
    "litellm",
    "dspy",
    "chromadb",
    "sentence-transformers",
    "networkx",
)


def environment() -> dict[str, Any]:
    """Python, platform and the installed versions of :data:`TRACKED` (those not installed are left out)."""
    versions = {}
    for name in TRACKED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {"python": platform.python_version(), "platform": platform.platform(), "packages": versions}


def _scores(session: Session, system_id: str, score_test: bool = True) -> dict[str, dict[str, float]]:
    """``{split: {task_id: score}}`` on val and test (the memoised evaluation rollouts; without
    ``score_test``, test only as far as it is stored)."""
    system = session.archive.get_system(system_id)
    out = {
        split: session.task_scores(system, split)
        for split in ("val", "test")
        if session.tasks(split) and (score_test or split == "val")
    }
    if not score_test:
        stored = session.archive.task_scores(system_id, "test")
        if stored:
            out["test"] = stored
    return out


def _entry(system_id: str, scores: dict[str, dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"system_id": system_id}
    for split, by_task in scores.items():
        out[split] = {"score": round(sum(by_task.values()) / len(by_task), 4) if by_task else 0.0, "n": len(by_task)}
    return out


def failure_check(session: Session, *, baseline: bool) -> str | None:
    """Why the run must be called failed, or None: more than ``failures.max_share`` of the
    baseline's evaluation rollouts (``baseline=True``), or of all candidates' taken together,
    failed by the agent's or the reward's own error."""
    arch, limit = session.archive, session.task.failures.max_share
    base_id = session.state.baseline
    if base_id is None:
        return None
    if baseline:
        n, msgs = arch.failure_stats(system_id=base_id, split="val")
        who, show = "the baseline", "baseline"
    else:
        n, msgs = arch.failure_stats(other_than=base_id)
        who, show = "the candidates", "SYSTEM  (evolve archive list " + str(session.run_dir) + " lists them)"
    if not n or len(msgs) / n <= limit:
        return None
    return (
        f"{who} failed on {len(msgs)} of {n} evaluation rollouts ({100 * len(msgs) / n:.0f}%, more than "
        f"failures.max_share = {limit:g}); most common: {describe_common(msgs)}; the trajectories: "
        f"evolve archive show {session.run_dir} {show}"
    )


def failures(session: Session) -> dict[str, Any]:
    """Per split: stored rollouts, those that failed (the agent's error; the reward's), the world
    failures retried (never stored as scores) and the most common kinds of each."""
    arch = session.archive
    out: dict[str, Any] = {}
    for (split, _phase), c in sorted(arch.rollout_counts().items()):
        row = out.setdefault(
            split, {"rollouts": 0, "failed": 0, "reward_errors": 0, "world_failures": 0, "kinds": [], "world_kinds": []}
        )
        row["rollouts"] += c["rollouts"]
        row["failed"] += c["failed"]
        row["reward_errors"] += c["reward_errors"]
    for split, row in out.items():
        if row["failed"] or row["reward_errors"]:
            _, msgs = arch.failure_stats(phase=None, split=split)
            row["kinds"] = [list(k) for k in most_common(msgs, 5)]
    world: dict[str, list[str]] = {}
    for e in arch.events("world_failure"):
        world.setdefault(e.get("split", "?"), []).append(e.get("message", ""))
    for split, msgs in world.items():
        row = out.setdefault(
            split, {"rollouts": 0, "failed": 0, "reward_errors": 0, "world_failures": 0, "kinds": [], "world_kinds": []}
        )
        row["world_failures"] = len(msgs)
        row["world_kinds"] = [list(k) for k in most_common(msgs, 5)]
    return out


def read_report(run_dir: str | Path) -> dict[str, Any] | None:
    """``report.json`` of a run directory once the run has written it (at its end), else None."""
    try:
        return json.loads((Path(run_dir) / "report.json").read_text())
    except (OSError, ValueError):
        return None


def write_report(
    session: Session, stop_reason: str, *, score_test: bool = True, used_by_run: dict[str, Any] | None = None
) -> RunReport:
    """Write ``report.json`` and ``report.md``; with ``score_test=False`` (a run that failed) the
    test split is not scored and the report shows what is stored. ``used_by_run``: the budget used
    before the final scoring (default: all of it)."""
    arch = session.archive
    baseline_id = session.state.baseline
    # the run's best-scored system (the engine's last promotion), which need not be the current one: a
    # deploy policy only proposes it (evolve promote decides), and a rollback moves the pointer away
    best_id = arch.get_state("best") or arch.current() or baseline_id
    report: dict[str, Any] = {"task": session.task.name, "seed": session.task.seed, "run_dir": str(session.run_dir)}
    current_id = arch.current()
    if current_id is not None and best_id is not None and current_id != best_id:
        report["current"] = {"system_id": current_id, "why": why_current(arch, current_id, session.task.deploy)}
    if baseline_id is None:
        report.update({"baseline": None, "best": None, "generations": [], "stop_reason": stop_reason})
    else:
        assert best_id is not None  # the baseline at least
        # Scoring on test is part of the run's final step; it is memoised like every rollout.
        base = _scores(session, baseline_id, score_test)
        best = _scores(session, best_id, score_test) if best_id != baseline_id else base
        report["baseline"], report["best"] = _entry(baseline_id, base), _entry(best_id, best)
        if best is not base:
            report["paired"] = {split: paired(base[split], best[split]) for split in base}
        report["generations"] = [g.model_dump(mode="json", exclude_unset=True) for g in session.state.generations()]
        report["stop_reason"] = stop_reason
    report["budget_used"] = session.budget_used(test=True)
    report["budget_used_by_run"] = used_by_run or report["budget_used"]
    report["budget"] = session.task.budget.model_dump()
    report["lineage"] = arch.lineage(best_id) if best_id else []
    for section in _sections():  # what the layers add (a workflow graph and the workflows a search tried)
        report.update(section.build(session, best_id, baseline_id))
    report["failures"] = failures(session)
    lo, hi = session.task.reward_range
    report["reward_range"] = [lo, hi]
    report["out_of_range"] = arch.out_of_range(lo, hi)
    report["environment"] = environment()
    (session.run_dir / "report.json").write_text(json.dumps(report, indent=2))
    (session.run_dir / "report.md").write_text(to_markdown(report))
    return RunReport(report)


def why_current(arch: Any, current_id: str, deploy: Any) -> str:
    """Why the current system is not the run's best-scored one, from the pointer's last move."""
    import datetime

    moves = [m for m in arch.pointer_history() if m[0] == current_id]
    reason, at = (moves[-1][1], moves[-1][2]) if moves else ("", 0.0)
    when = datetime.datetime.fromtimestamp(at, datetime.UTC).strftime("%Y-%m-%d %H:%M UTC") if at else ""
    if reason == "rollback":
        return (
            f"it was rolled back to on {when} (evolve archive rollback or evolve rollback), and no system the run "
            "evolved since scored above the best one"
        )
    if deploy is not None:
        return (
            "the run has a deploy policy: its best system is proposed, not made current; evolve promote decides "
            "what is served"
        )
    return f"it was made current ({reason or 'unknown'}) on {when}"


def _fmt(entry: dict | None, split: str) -> str:
    if not entry or split not in entry:
        return "—"
    s = entry[split]
    return f"{100 * s['score']:.1f}% (n={s['n']})"


def gain(report: dict[str, Any], split: str) -> float | None:
    b, x = report.get("baseline") or {}, report.get("best") or {}
    if split in b and split in x:
        return x[split]["score"] - b[split]["score"]
    return None


def to_markdown(report: dict[str, Any]) -> str:
    lines = [f"# Run report: {report['task']} (seed {report['seed']})", ""]
    lines += ["| system | id | val | test |", "|---|---|---|---|"]
    for name in ("baseline", "best"):
        e = report.get(name) or {}
        lines.append(f"| {name} | `{(e.get('system_id') or '')[:12]}` | {_fmt(e, 'val')} | {_fmt(e, 'test')} |")
    cur = report.get("current")
    if cur:
        lines.append(f"\nThe current system is `{cur['system_id'][:12]}`, not the best one above: {cur['why']}.")
    for split in ("val", "test"):
        g = gain(report, split)
        if g is not None and not math.isnan(g):
            c = (report.get("paired") or {}).get(split)
            lines.append(f"\n{split} gain: " + (describe(c) if c and c.get("n") else f"{100 * g:+.1f} points"))
    lines += [
        "",
        "## Generations",
        "",
        "| gen | best val | children | accepted | rollouts | LLM calls | tokens | seconds |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for g in report.get("generations", []):
        lines.append(
            f"| {g['index']} | {g['best_val']:.3f} | {g.get('children', 0)} | {g.get('accepted', 0)} | "
            f"{g.get('rollouts', 0)} | {g.get('calls', '—')} | {g.get('tokens', 0)} | {g.get('seconds', 0)} |"
        )
    u = report.get("budget_used_by_run") or report.get("budget_used", {})
    a = report.get("budget_used", {})
    lines += [
        "",
        f"Budget used by the run: {u.get('rollouts', 0)} rollouts, {u.get('calls', 0)} LLM calls, "
        f"{u.get('tokens', 0)} tokens, ${u.get('cost', 0):.4f}, {u.get('seconds', 0)} s. "
        f"Stopped: {report.get('stop_reason')}. With the final test scoring (outside the budget): "
        f"{a.get('rollouts', 0)} rollouts, {a.get('calls', 0)} LLM calls, ${a.get('cost', 0):.4f}.",
        "",
    ]
    lines += _failures_md(report)
    env = report.get("environment")
    if env:
        pk = ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items())
        lines += [f"Environment: Python {env.get('python')} on {env.get('platform')}; {pk}.", ""]
    if report.get("lineage"):
        lines.append("Lineage of the best system: " + " → ".join(f"`{s[:8]}`" for s in reversed(report["lineage"])))
    for section in _sections():
        lines += section.markdown(report)
    return "\n".join(lines) + "\n"


def _failures_md(report: dict[str, Any]) -> list[str]:
    fails = report.get("failures") or {}
    rng = report.get("out_of_range") or {}
    lines = ["## Failures", ""]
    if not any(r["failed"] or r["reward_errors"] or r["world_failures"] for r in fails.values()) and not rng:
        return lines + ["No rollout failed: no agent or reward error, and the world never failed under one.", ""]
    lines += [
        "Failed rollouts score 0 (the agent raised or timed out; the reward failed). World failures (the model "
        "unreachable, a rate limit, a dead worker) were retried and are never scores.",
        "",
        "| split | rollouts | agent failed | reward failed | world failures retried | most common |",
        "|---|---|---|---|---|---|",
    ]
    for split, r in fails.items():
        kinds = r["kinds"] or r["world_kinds"]
        common = "; ".join(f"`{k}` ×{n}" for k, n in kinds[:2]) if kinds else ""
        lines.append(
            f"| {split} | {r['rollouts']} | {r['failed']} | {r['reward_errors']} | {r['world_failures']} | {common} |"
        )
    lo, hi = report.get("reward_range") or [0, 1]
    for split, r in rng.items():
        lines.append(
            f"\n{r['n']} {split} rollouts scored outside the reward range [{lo:g}, {hi:g}] "
            f"(from {r['min']:g} to {r['max']:g})."
        )
    return lines + [""]


def _sections() -> list[Any]:
    """The report sections the layers register (:data:`evolve.registry.report_sections`)."""
    from evolve.registry import report_sections

    return [report_sections.get(name)() for name in report_sections.names()]
