"""The tracker protocol, and what every tracker reads: one run's archive as a :class:`TrackedRun`.

A tracker sends a run to a system its users already run (an MLflow server, Weights & Biases, an
OpenTelemetry collector). It is named in the task file (``track: [{name: mlflow, params: {...}}]``)
or on the command line (``evolve track RUN_DIR --to mlflow``), and built from its params: its class
has a pydantic ``Params`` model (checked when the task file is validated) and ``requires``, the
``(module, extra)`` pairs it imports (a missing one is an error with the install hint, at validation).

Lifecycle, the same live, after ``--resume`` and after the fact::

    tracker = Tracker(**params)       # cheap: no import of the client, no network
    tracker.open()                    # before anything is written: is the destination there?
    tracker.sync(run)                 # after each generation and at the end: send what is new
    tracker.close(status)             # "finished" | "failed" | "killed" | None (leave it running)

``sync`` reads everything it sends from ``run`` (the archive, its generation rows, report.json,
the current system) and is idempotent: what was sent is read back from the destination or
remembered in the archive's state (``run.remember``), so a sync that failed is caught up by the
next one, a resumed run continues the destination's run, and ``evolve track`` sends what a live
run could not. ``sync`` writes nothing but its own ``track/`` state keys.
"""

from __future__ import annotations

import hashlib
import json
import statistics
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from evolve.errors import UserError

if TYPE_CHECKING:
    from evolve.archive import Archive
    from evolve.scoring.state import GenerationRow


class TrackerError(UserError):
    """A tracker cannot reach its destination when the run starts (or ``evolve track`` runs); the
    message names the tracker and the address (the CLI exits with code 2)."""


@runtime_checkable
class Tracker(Protocol):
    """Where a run reports (see the module docstring for the lifecycle)."""

    name: str  # "mlflow", "wandb", "otel", ...
    address: str  # where it sends (a URL, a folder): named in every message about it

    def open(self) -> None:
        """Check that the destination answers; raise :class:`TrackerError` when it does not."""

    def sync(self, run: TrackedRun) -> str:
        """Send what ``run`` holds that the destination lacks; return a line saying what was sent."""

    def close(self, status: str | None) -> None:
        """End the destination's run as ``status`` (None: leave it as it is)."""


# the per-generation metrics, in this order; median_val only for a generation with scored children,
# calls and cost only where the row has them (rows of runs made before they were recorded lack them)
METRICS = ("best_val", "median_val", "children", "accepted", "rollouts", "calls", "tokens", "cost", "seconds")


class TrackedRun:
    """A read view of one run directory for trackers, plus their own state (``track/`` keys).

    ``live``: the run is going on in this process (an export afterwards is not live)."""

    REPORT_FILES: ClassVar[tuple[str, ...]] = ("report.json", "report.md")

    def __init__(self, archive: Archive, run_dir: str | Path | None = None, *, live: bool = False) -> None:
        self.archive = archive
        self.run_dir = Path(run_dir if run_dir is not None else archive.run_dir)
        self.live = live

    @property
    def name(self) -> str:
        """The run directory's name (what trackers call the run)."""
        return self.run_dir.resolve().name

    def task(self) -> dict[str, Any]:
        """The task configuration the run was started (or last resumed) with."""
        saved = self.archive.get_state("task")
        return json.loads(saved) if saved else {}

    def task_name(self) -> str:
        return str(self.task().get("name") or "task")

    def generations(self) -> list[GenerationRow]:
        from evolve.scoring.state import RunState

        return RunState(self.archive).generations()

    def current(self) -> str | None:
        """The system that serves (the archive's current pointer): what trackers log as promoted."""
        return self.archive.current()

    def report(self) -> dict[str, Any] | None:
        """``report.json`` once a run has written it (at its end), else None."""
        from evolve.results.report import read_report

        return read_report(self.run_dir)

    def report_files(self) -> list[Path]:
        """report.json, report.md and the pictures at the top of the run directory (e.g.
        ``best_workflow.png``), those that exist."""
        files = [self.run_dir / f for f in self.REPORT_FILES if (self.run_dir / f).is_file()]
        if not files:
            return []
        return files + sorted(p for p in self.run_dir.glob("*.png") if p.is_file())

    def report_digest(self) -> str | None:
        """A hash of the report files (None before the report is written): a tracker sends them again
        only when it changed (a resumed run writes a new report)."""
        files = self.report_files()
        if not files:
            return None
        h = hashlib.sha256()
        for f in files:
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
        return h.hexdigest()[:16]

    def metrics(self) -> list[tuple[int, dict[str, float]]]:
        """``(generation, {metric: value})`` for each finished generation (:data:`METRICS`): the
        archive's generation row, and ``median_val``, the median val score of the generation's
        children that were scored on val."""
        by_gen: dict[int, list[float]] = {}
        val = self.archive.all_scores("val")
        for r in self.archive.records():
            if r.parents and r.id in val:
                by_gen.setdefault(r.generation, []).append(val[r.id][0])
        out = []
        for row in self.generations():
            values: dict[str, float] = {}
            for key in METRICS:
                v = row.get(key)
                if key == "median_val":
                    v = statistics.median(by_gen[row.index]) if by_gen.get(row.index) else None
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    values[key] = float(v)
            out.append((row.index, values))
        return out

    def recall(self, key: str, default: Any = None) -> Any:
        """A tracker's own state (``track/KEY`` in the archive's state table)."""
        return self.archive.get_state(f"track/{key}", default)

    def remember(self, key: str, value: Any) -> None:
        self.archive.put_state(f"track/{key}", value)


def flat_params(task: dict[str, Any], *, skip: tuple[str, ...] = ("track",)) -> dict[str, str]:
    """The task's settings as ``{"budget.generations": "4", "operators.0.name": "scripted", ...}``
    (strings; lists of plain values as JSON), without ``skip`` (where the run reports is not a
    setting of the run)."""
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k in sorted(value):
                walk(f"{prefix}.{k}" if prefix else str(k), value[k])
        elif isinstance(value, list) and value and any(isinstance(v, (dict, list)) for v in value):
            for i, v in enumerate(value):
                walk(f"{prefix}.{i}", v)
        else:
            out[prefix] = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, sort_keys=True)

    walk("", {k: v for k, v in task.items() if k not in skip})
    return out


def system_folder(run: TrackedRun, system_id: str, dest: Path, *, with_artifacts: bool = True) -> Path:
    """``dest`` holding the system as ``evolve archive export`` writes it (``system.json`` and,
    with ``with_artifacts``, the ``artifacts/`` it references), which ``evolve.load(dest)`` reads."""
    if with_artifacts:
        return run.archive.export(system_id, dest)
    dest.mkdir(parents=True, exist_ok=True)
    system = run.archive.get_system(system_id)
    doc = {
        "format": "evolvekit-system/1",
        "id": system_id,
        "system": system.model_dump(mode="json"),
        "record": run.archive.record(system_id).to_json(),
        "lineage": run.archive.lineage(system_id),
        "artifacts": [],
        "exported_from": str(run.run_dir.resolve()),
    }
    (dest / "system.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return dest


def summary(report: dict[str, Any] | None) -> dict[str, Any]:
    """The report's headline numbers: ``{baseline_val, baseline_test, best_val, best_test, best_system,
    baseline_system}`` (those it has)."""
    out: dict[str, Any] = {}
    for which in ("baseline", "best"):
        entry = (report or {}).get(which) or {}
        if entry.get("system_id"):
            out[f"{which}_system"] = entry["system_id"]
        for split in ("val", "test"):
            if isinstance(entry.get(split), dict):
                out[f"{which}_{split}"] = float(entry[split]["score"])
    return out


__all__ = ["METRICS", "TrackedRun", "Tracker", "TrackerError", "flat_params", "summary", "system_folder"]
