"""Trackers named by import path (``tests.trackers.plugins:Recorder``), as a plugin's would be: one
that writes down what it is given and can be told to fail or to hang, one that needs a package
that is not installed."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from evolve.trackers import TrackedRun

RELEASE = threading.Event()  # what a hanging Recorder waits for


class Recorder:
    name = "recorder"
    requires = ()

    class Params(BaseModel):
        model_config = ConfigDict(extra="forbid")
        log: str
        fail_first: int = 0  # syncs that raise before one succeeds
        hang: bool = False  # the last sync (when the run ends) waits for RELEASE

    def __init__(self, **params: Any) -> None:
        self.p = self.Params(**params)
        self.address = self.p.log
        self.calls = 0
        self.sent: set[int] = set()

    def open(self) -> None:
        self._write({"event": "open"})

    def sync(self, run: TrackedRun) -> str:
        self.calls += 1
        if self.calls <= self.p.fail_first:
            raise ConnectionError(f"sync {self.calls} refused")
        if self.p.hang and run.report() is not None:
            RELEASE.wait(60)
        done = set(run.recall("recorder", []))
        new = [(i, m) for i, m in run.metrics() if i not in done]
        for i, m in new:
            self._write({"event": "generation", "index": i, "metrics": m})
        run.remember("recorder", sorted(done | {i for i, _ in new}))
        return f"{len(new)} generations"

    def close(self, status: str | None) -> None:
        self._write({"event": "close", "status": status})

    def _write(self, line: dict) -> None:
        with open(self.p.log, "a") as f:
            f.write(json.dumps(line) + "\n")

    @staticmethod
    def read(path: Path) -> list[dict]:
        return [json.loads(x) for x in Path(path).read_text().splitlines()] if Path(path).exists() else []


class NeedsAMissingPackage:
    name = "missing"
    requires = (("evolve_no_such_package", "nosuch"),)

    def __init__(self, **params: Any) -> None: ...
