"""What the trackers' tests share: no tracker client phones home, W&B writes only under the test's
folder and never goes online, and a toy task to run with a tracker on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import DATA

# MLflow's and W&B's own telemetry (DO_NOT_TRACK=1 is not what MLflow looks for: it wants "true")
for key, value in {
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "WANDB_ERROR_REPORTING": "false",
    "WANDB_DISABLE_CODE": "true",
    "WANDB_SILENT": "true",
}.items():
    os.environ.setdefault(key, value)


@pytest.fixture(autouse=True)
def _wandb_stays_here(tmp_path, monkeypatch):
    """W&B's folders (staging, cache, settings) under the test's folder, and offline unless a test says."""
    for var, sub in (("WANDB_DATA_DIR", "data"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config")):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", raising=False)


def toy(**changes: Any) -> dict[str, Any]:
    """The toy task (tests/data/toy.yaml: scripted model, golden lineage) with ``changes``."""
    task = yaml.safe_load((DATA / "toy.yaml").read_text())
    task.update(changes)
    return task


def write_task(folder: Path, task: dict[str, Any]) -> Path:
    path = folder / "task.yaml"
    path.write_text(yaml.safe_dump(task))
    return path


class Messages:
    """An observer that keeps the run's messages (and can act on each generation)."""

    def __init__(self, on_generation: Any = None) -> None:
        self.lines: list[str] = []
        self.on_generation = on_generation

    def phase(self, description: str, total: int) -> None: ...
    def advance(self, n: int = 1) -> None: ...
    def started(self, run_dir: Path) -> None: ...

    def generation(self, row: dict) -> None:
        if self.on_generation is not None:
            self.on_generation(row)

    def message(self, text: str) -> None:
        self.lines.append(text)

    def about(self, word: str) -> list[str]:
        return [line for line in self.lines if word in line]
