"""What the topology layer adds to a run's report and to ``evolve archive show``
(:data:`evolve.registry.report_sections`): the workflow graph of the best system (else the
baseline) as text and a picture, and every workflow a topology search scored, with its accuracy on
the search's training tasks and its model calls per task, so cost and accuracy sit side by side."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolve.errors import UserError

if TYPE_CHECKING:
    from rich.console import Console

    from evolve.scoring.session import Session
    from evolve.types import System


class WorkflowSection:
    """The report section and the ``archive show`` view of workflow graphs."""

    def __init__(self) -> None:
        self._wf: Any = None
        self._problem: str | None = None
        self._png: Path | None = None

    # ------------------------------------------------------------------ report.json / report.md

    def build(self, session: Session, best_id: str | None, baseline_id: str | None) -> dict[str, Any]:
        """``{"workflow": ..., "workflows_tried": [...]}``, the keys that apply."""
        out: dict[str, Any] = {}
        workflow = _workflow(session, best_id, baseline_id)
        if workflow is not None:
            out["workflow"] = workflow
        tried = _workflows_tried(session.run_dir)
        if tried:
            out["workflows_tried"] = tried
        return out

    def markdown(self, report: dict[str, Any]) -> list[str]:
        lines: list[str] = []
        w = report.get("workflow")
        if w:
            lines += [
                "",
                f"## Workflow of the {w['system']} system (`{w['system_id'][:12]}`)",
                "",
                "```text",
                w["text"],
                "```",
            ]
            if w.get("image"):
                lines += ["", f"![workflow graph]({w['image']})"]
        tried = report.get("workflows_tried")
        if tried:
            lines += [
                "",
                "## Workflows tried by the topology search (accuracy on its training tasks)",
                "",
                "| search | accuracy | model calls per task | utility | chosen | workflow |",
                "|---|---|---|---|---|---|",
            ]
            for r in sorted(tried, key=lambda r: (r["search"], r["calls"] or 0)):
                lines.append(
                    f"| {r['search']} | {_pct(r['score'])} | {_num(r['calls'])} | {_num(r['utility'], 4)} | "
                    f"{'yes' if r['chosen'] else ''} | `{r['workflow']}` |"
                )
        return lines

    # ------------------------------------------------------------------ evolve archive show

    def prepare(self, system: System, png: Path | None) -> None:
        """Read the system's workflow graph; raise UserError when ``png`` (``--graph``) asks to draw
        a graph the system does not have."""
        from evolve.topology.graph import WorkflowError, graph_of

        try:
            self._wf, self._problem = graph_of(system), None
        except WorkflowError as e:
            self._wf, self._problem = None, str(e)
        self._png = png
        if png is not None and self._wf is None:
            why = f": {self._problem}" if self._problem else ""
            raise UserError(f"system {system.id} has no workflow graph to draw (--graph){why}")

    def show(self, out: Console, err: Console, sid: str) -> None:
        from rich.text import Text

        if self._problem:
            out.print(Text(f"workflow graph: unreadable ({self._problem})", style="red"))
        if self._wf is None:
            return
        from evolve.topology.render import render_png, render_text

        out.print(Text("workflow graph", style="bold"))
        out.print(Text(render_text(self._wf)))
        if self._png is not None:
            try:
                written = render_png(self._wf, self._png, title=f"system {sid[:12]}")
            except (UserError, OSError) as e:
                err.print(Text(f"error: cannot draw the workflow graph to {self._png}: {e}", style="red"))
                raise SystemExit(2) from None
            out.print(Text(f"workflow graph drawn to {written}"))


def _workflow(session: Session, best_id: str | None, baseline_id: str | None) -> dict[str, Any] | None:
    """The workflow graph of the best system (else the baseline) as text, drawn to
    ``best_workflow.png`` in the run dir; None when neither has a graph. Drawing is optional:
    a failure leaves the text and says why."""
    from evolve.topology.graph import graph_of
    from evolve.topology.render import render_png, render_text

    for which, sid in (("best", best_id), ("baseline", baseline_id)):
        if sid is None:
            continue
        try:
            wf = graph_of(session.archive.get_system(sid))
        except Exception as e:  # noqa: BLE001 - a bad graph must not sink the report
            return {"system": which, "system_id": sid, "text": f"(unreadable workflow graph: {e})", "image": None}
        if wf is None:
            continue
        out: dict[str, Any] = {
            "system": which,
            "system_id": sid,
            "workflow_id": wf.id,
            "text": render_text(wf),
            "image": None,
        }
        try:
            render_png(wf, session.run_dir / "best_workflow.png", title=f"{which} system {sid[:12]}")
            out["image"] = "best_workflow.png"
        except Exception as e:  # noqa: BLE001 - no matplotlib, a full disk: keep the text
            out["image_error"] = f"{type(e).__name__}: {e}"
        return out
    return None


def _workflows_tried(run_dir: Path) -> list[dict[str, Any]]:
    """Every workflow a topology search scored (``work/*/topology.json``)."""
    rows = []
    for f in sorted(Path(run_dir).glob("work/*/topology.json")):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        for r in data.get("evaluated", []):
            rows.append(
                {
                    "search": f.parent.name,
                    "workflow": r.get("signature", ""),
                    "score": r.get("score"),
                    "calls": r.get("cost"),
                    "utility": r.get("utility"),
                    "chosen": bool(r.get("chosen")),
                }
            )
    return rows


def _pct(x: Any) -> str:
    return f"{100 * x:.1f}%" if isinstance(x, (int, float)) else "—"


def _num(x: Any, digits: int = 2) -> str:
    return f"{x:.{digits}f}" if isinstance(x, (int, float)) else "—"


__all__ = ["WorkflowSection"]
