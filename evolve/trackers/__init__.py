"""Exporters to the trackers users already run, named in the task file's ``track:`` section.

    base.py    the Tracker protocol (open / sync / close) and TrackedRun, the read view of a run
    live.py    Tracking: a run's trackers while it runs (a thread each; a failure is a warning)
    mlflow.py  params, per-generation metrics, the report, the promoted system registered and aliased
    wandb.py   the same for Weights & Biases (online, or offline: files to `wandb sync` later)
    otel.py    one OpenTelemetry gen_ai span per rollout, child spans per model and tool call
    cli.py     evolve track RUN_DIR --to NAME: send a run (finished or not) afterwards

None is needed; each imports its client only when used. The task file's ``track`` entries are
checked when it is validated (:func:`evolve.task.taskfile.check_tracker`). docs/tracking.md has the details.
"""

from __future__ import annotations

from typing import Any

from evolve.errors import ConfigError
from evolve.trackers.base import TrackedRun, Tracker, TrackerError


def build(name: str, params: dict[str, Any], *, path: str = "track", source: str = "task") -> Tracker:
    """A tracker from its name (registered, or an import path) and params, checked as the task file's are."""
    from evolve.task.taskfile import check_tracker

    cls = check_tracker(name, params, path=path, source=source)
    try:
        return cls(**params)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"the {name} tracker: {e}", path=f"{path}.params", source=source) from None


__all__ = ["TrackedRun", "Tracker", "TrackerError", "build"]
