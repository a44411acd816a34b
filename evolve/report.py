"""The run report: ``report.json`` and ``report.md`` in the run directory.

``report.json`` holds ``baseline`` and ``best`` (each with ``system_id`` and per-split
``{score, n}`` for ``val`` and ``test``), the ``generations`` list, the budget used (all of it,
and ``budget_used_by_run``: before the final test scoring, which is outside the budget) and why
the run stopped. ``paired`` holds, per split, the best system against the baseline on the same
tasks (:func:`evolve.stats.paired`: the gain's 95% interval, the tasks only one of them wins, the
sign test), so a reader can tell a gain from noise. When the best system (else the baseline) has a
workflow graph, ``workflow`` holds its text rendering and ``best_workflow.png`` (in the run directory) its picture.
``environment`` records the Python, the platform and the installed versions of the libraries a
result depends on (torch, transformers, peft, ...), so a number can be traced to what produced it.
"""

from __future__ import annotations

import json
import math
import platform
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.stats import describe, paired

if TYPE_CHECKING:
    from evolve.engine import Engine


# the distributions whose versions can change a recorded number (sampling, training, embeddings, clients)
TRACKED = ("evolvekit", "torch", "transformers", "peft", "safetensors", "numpy", "litellm", "dspy", "chromadb",
           "sentence-transformers", "networkx")


def environment() -> dict[str, Any]:
    """Python, platform and the installed versions of :data:`TRACKED` (those not installed are left out)."""
    versions = {}
    for name in TRACKED:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {"python": platform.python_version(), "platform": platform.platform(), "packages": versions}


def _scores(engine: "Engine", system_id: str) -> dict[str, dict[str, float]]:
    """``{split: {task_id: score}}`` on val and test (the memoised evaluation rollouts)."""
    system = engine.archive.get_system(system_id)
    return {split: engine.task_scores(system, split) for split in ("val", "test") if engine._split(split)}


def _entry(system_id: str, scores: dict[str, dict[str, float]]) -> dict[str, Any]:
    out: dict[str, Any] = {"system_id": system_id}
    for split, by_task in scores.items():
        out[split] = {"score": round(sum(by_task.values()) / len(by_task), 4) if by_task else 0.0, "n": len(by_task)}
    return out


def write_report(engine: "Engine", stop_reason: str) -> dict[str, Any]:
    arch = engine.archive
    baseline_id = arch.get_state("baseline")
    best_id = arch.current() or baseline_id
    report: dict[str, Any] = {"task": engine.task.name, "seed": engine.task.seed, "run_dir": str(engine.run_dir)}
    if baseline_id is None:
        report.update({"baseline": None, "best": None, "generations": [], "stop_reason": stop_reason})
    else:
        # Scoring on test is part of the run's final step; it is memoised like every rollout.
        base = _scores(engine, baseline_id)
        best = _scores(engine, best_id) if best_id != baseline_id else base
        report["baseline"], report["best"] = _entry(baseline_id, base), _entry(best_id, best)
        if best is not base:
            report["paired"] = {split: paired(base[split], best[split]) for split in base}
        report["generations"] = arch.get_state("generations", [])
        report["stop_reason"] = stop_reason
    report["budget_used"] = engine.budget_used(test=True)
    report["budget_used_by_run"] = getattr(engine, "used_by_run", None) or report["budget_used"]
    report["budget"] = engine.task.budget.model_dump()
    report["lineage"] = arch.lineage(best_id) if best_id else []
    workflow = _workflow(engine, best_id, baseline_id)
    if workflow is not None:
        report["workflow"] = workflow
    tried = _workflows_tried(engine.run_dir)
    if tried:
        report["workflows_tried"] = tried
    report["environment"] = environment()
    (engine.run_dir / "report.json").write_text(json.dumps(report, indent=2))
    (engine.run_dir / "report.md").write_text(to_markdown(report))
    return report


def _workflow(engine: "Engine", best_id: str | None, baseline_id: str | None) -> dict[str, Any] | None:
    """The workflow graph of the best system (else the baseline) as text, drawn to
    ``best_workflow.png`` in the run dir; None when neither has a graph. Drawing is optional:
    a failure leaves the text and says why."""
    from evolve.topology.graph import graph_of
    from evolve.topology.render import render_png, render_text

    for which, sid in (("best", best_id), ("baseline", baseline_id)):
        if sid is None:
            continue
        try:
            wf = graph_of(engine.archive.get_system(sid))
        except Exception as e:  # noqa: BLE001 - a bad graph must not sink the report
            return {"system": which, "system_id": sid, "text": f"(unreadable workflow graph: {e})", "image": None}
        if wf is None:
            continue
        out: dict[str, Any] = {"system": which, "system_id": sid, "workflow_id": wf.id, "text": render_text(wf),
                               "image": None}
        try:
            render_png(wf, engine.run_dir / "best_workflow.png", title=f"{which} system {sid[:12]}")
            out["image"] = "best_workflow.png"
        except Exception as e:  # noqa: BLE001 - no matplotlib, a full disk: keep the text
            out["image_error"] = f"{type(e).__name__}: {e}"
        return out
    return None


def _workflows_tried(run_dir: Path) -> list[dict[str, Any]]:
    """Every workflow a topology search scored (``work/*/topology.json``): its accuracy on the
    search's training tasks and its model calls per task, so cost and accuracy sit side by side."""
    rows = []
    for f in sorted(Path(run_dir).glob("work/*/topology.json")):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        for r in data.get("evaluated", []):
            rows.append({"search": f.parent.name, "workflow": r.get("signature", ""), "score": r.get("score"),
                         "calls": r.get("cost"), "utility": r.get("utility"), "chosen": bool(r.get("chosen"))})
    return rows


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
    for split in ("val", "test"):
        g = gain(report, split)
        if g is not None and not math.isnan(g):
            c = (report.get("paired") or {}).get(split)
            lines.append(f"\n{split} gain: " + (describe(c) if c and c.get("n") else f"{100 * g:+.1f} points"))
    lines += ["", "## Generations", "",
              "| gen | best val | children | accepted | rollouts | LLM calls | tokens | seconds |",
              "|---|---|---|---|---|---|---|---|"]
    for g in report.get("generations", []):
        lines.append(f"| {g['index']} | {g['best_val']:.3f} | {g.get('children', 0)} | {g.get('accepted', 0)} | "
                     f"{g.get('rollouts', 0)} | {g.get('calls', '—')} | {g.get('tokens', 0)} | {g.get('seconds', 0)} |")
    u = report.get("budget_used_by_run") or report.get("budget_used", {})
    a = report.get("budget_used", {})
    lines += ["", f"Budget used by the run: {u.get('rollouts', 0)} rollouts, {u.get('calls', 0)} LLM calls, "
              f"{u.get('tokens', 0)} tokens, ${u.get('cost', 0):.4f}, {u.get('seconds', 0)} s. "
              f"Stopped: {report.get('stop_reason')}. With the final test scoring (outside the budget): "
              f"{a.get('rollouts', 0)} rollouts, {a.get('calls', 0)} LLM calls, ${a.get('cost', 0):.4f}.", ""]
    env = report.get("environment")
    if env:
        pk = ", ".join(f"{k} {v}" for k, v in env.get("packages", {}).items())
        lines += [f"Environment: Python {env.get('python')} on {env.get('platform')}; {pk}.", ""]
    if report.get("lineage"):
        lines.append("Lineage of the best system: " + " → ".join(f"`{s[:8]}`" for s in reversed(report["lineage"])))
    w = report.get("workflow")
    if w:
        lines += ["", f"## Workflow of the {w['system']} system (`{w['system_id'][:12]}`)", "", "```text", w["text"], "```"]
        if w.get("image"):
            lines += ["", f"![workflow graph]({w['image']})"]
    tried = report.get("workflows_tried")
    if tried:
        lines += ["", "## Workflows tried by the topology search (accuracy on its training tasks)", "",
                  "| search | accuracy | model calls per task | utility | chosen | workflow |", "|---|---|---|---|---|---|"]
        for r in sorted(tried, key=lambda r: (r["search"], r["calls"] or 0)):
            lines.append(f"| {r['search']} | {_pct(r['score'])} | {_num(r['calls'])} | {_num(r['utility'], 4)} | "
                         f"{'yes' if r['chosen'] else ''} | `{r['workflow']}` |")
    return "\n".join(lines) + "\n"


def _pct(x: Any) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) else "—"


def _num(x: Any, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "—"
