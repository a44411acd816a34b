"""Weights & Biases: the same as the MLflow tracker, in a W&B run.

* config: the task's settings (nested, as in the task file, without ``track``);
* history with ``step`` = generation: the per-generation metrics (:meth:`TrackedRun.metrics`);
* summary: the report's headline numbers (baseline and best, val and test, their system ids);
* artifacts: ``RUN-report`` (type ``report``: report.json, report.md, pictures) when the report is
  written or changes, and each system that was made current as a version of the ``model_name``
  artifact (type ``model``, default ``evolve-TASK``, the folder ``evolve archive export`` writes)
  with the alias ``alias`` (default ``champion``, which W&B moves to the newest) and ``system-ID12``.

``mode: offline`` (or ``WANDB_MODE=offline``) writes the run under ``dir`` (default: the run
directory, as ``RUN_DIR/wandb/offline-run-*``) and never touches the network; ``wandb sync`` uploads
it later. The W&B run id is kept in the archive, so ``--resume`` and ``evolve track`` continue the
same W&B run; the generations sent are remembered there too, and none is sent twice.
"""

from __future__ import annotations

import os
import tempfile
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from evolve.trackers.base import TrackedRun, TrackerError, summary, system_folder


class WandbTracker:
    """See the module docstring."""

    name = "wandb"
    requires = (("wandb", "wandb"),)

    class Params(BaseModel):
        model_config = ConfigDict(frozen=True, extra="forbid")
        project: str | None = Field(None, description="W&B project (default: the task's name)")
        entity: str | None = Field(None, description="W&B entity (team or user; default: yours)")
        mode: Literal["online", "offline"] | None = Field(None, description="default: $WANDB_MODE, else online")
        dir: str | None = Field(None, description="where W&B writes its files (default: the run directory)")
        run_name: str | None = Field(None, description="the W&B run's name (default: the run directory's)")
        group: str | None = Field(None, description="W&B run group")
        tags: list[str] = Field(default_factory=list, description="W&B run tags")
        model_name: str | None = Field(None, description="the systems' artifact (default: evolve-TASK)")
        alias: str = Field("champion", pattern=r"^[\w\-.]+$", description="the alias of the serving system")
        system_artifacts: bool = Field(True, description="log a system with its artifacts; false: system.json only")
        base_url: str | None = Field(
            None, description="online: the W&B server (default: $WANDB_BASE_URL, else https://api.wandb.ai)"
        )
        timeout: float = Field(10.0, gt=0, description="online: seconds to wait for the server when the run starts")

    def __init__(self, **params: Any) -> None:
        self.p = self.Params.model_validate(params)
        mode = self.p.mode or os.environ.get("WANDB_MODE") or "online"
        self.mode: Literal["online", "offline"] = "offline" if mode in ("offline", "dryrun") else "online"
        self.base_url = self.p.base_url or os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai"
        self.address = (
            self.base_url if self.mode == "online" else f"offline files under {self.p.dir or 'RUN_DIR'}/wandb"
        )
        self._run: Any = None
        self._steps: set[int] | None = None

    def open(self) -> None:
        if self.mode == "offline":
            return
        try:
            with urllib.request.urlopen(urllib.request.Request(self.base_url, method="HEAD"), timeout=self.p.timeout):
                pass
        except urllib.error.HTTPError:  # it answered
            return
        except (urllib.error.URLError, OSError) as e:
            raise TrackerError(
                f"the wandb tracker cannot reach the W&B server at {self.base_url} "
                f"({getattr(e, 'reason', None) or e}); check the network or track params.base_url, "
                "or use mode: offline (then `wandb sync` uploads the run later)"
            ) from None

    def _key(self, run: TrackedRun) -> str:
        return f"wandb {self.p.entity or ''}/{self.p.project or run.task_name()}"

    def _start(self, run: TrackedRun) -> Any:
        import wandb

        saved = run.recall(self._key(run), {})
        run_id = saved.get("id") or uuid.uuid4().hex[:8]
        folder = Path(self.p.dir) if self.p.dir else run.run_dir
        self.address = self.base_url if self.mode == "online" else f"offline files under {folder / 'wandb'}"
        task = {k: v for k, v in run.task().items() if k != "track"}
        settings = wandb.Settings(
            silent=True,
            console="off",
            disable_git=True,
            disable_code=True,
            save_code=False,
            x_disable_stats=True,
            x_disable_machine_info=True,
            base_url=self.base_url,
        )
        self._run = wandb.init(
            project=self.p.project or run.task_name(),
            entity=self.p.entity,
            id=run_id,
            resume="allow",
            mode=self.mode,
            dir=str(folder),
            name=self.p.run_name or run.name,
            group=self.p.group,
            tags=self.p.tags or None,
            settings=settings,
            reinit="create_new",
        )
        self._run.config.update(task, allow_val_change=True)
        if not saved.get("id"):
            run.remember(self._key(run), {"id": run_id, "steps": []})
        self._steps = set(saved.get("steps", []))
        return self._run

    def sync(self, run: TrackedRun) -> str:
        wb = self._run or self._start(run)
        key = self._key(run)
        assert self._steps is not None  # read by _start
        sent: list[str] = []
        n = 0
        for index, values in run.metrics():
            if index in self._steps:
                continue
            wb.log(values, step=index)
            self._steps.add(index)
            n += 1
        if n:
            run.remember(key, {**run.recall(key, {}), "steps": sorted(self._steps)})
            sent.append(f"{n} generations")
        if self._log_report(wb, run):
            sent.append("the report")
        said = self._log_system(wb, run)
        if said:
            sent.append(said)
        return f"wandb run {wb.id} ({self.address}): " + (", ".join(sent) if sent else "nothing new")

    def _log_report(self, wb: Any, run: TrackedRun) -> bool:
        import wandb

        digest = run.report_digest()
        key = self._key(run) + " report"
        if digest is None or run.recall(key) == digest:
            return False
        wb.summary.update(summary(run.report()))
        art = wandb.Artifact(_artifact_name(f"{run.name}-report"), type="report")
        for f in run.report_files():
            art.add_file(str(f), name=f.name)
        wb.log_artifact(art)
        run.remember(key, digest)
        return True

    def _log_system(self, wb: Any, run: TrackedRun) -> str:
        import wandb

        sid = run.current()
        key = self._key(run) + " system"
        if sid is None or run.recall(key) == sid:
            return ""
        name = _artifact_name(self.p.model_name or f"evolve-{run.task_name()}")
        art = wandb.Artifact(name, type="model", metadata={"system_id": sid, "run_dir": str(run.run_dir.resolve())})
        with tempfile.TemporaryDirectory(prefix="evolve-wandb-") as tmp:
            # add_dir copies the files to W&B's staging folder at once: the temporary folder may go
            art.add_dir(str(system_folder(run, sid, Path(tmp) / "system", with_artifacts=self.p.system_artifacts)))
        wb.log_artifact(art, aliases=[self.p.alias, f"system-{sid[:12]}"])
        wb.summary["current_system"] = sid
        run.remember(key, sid)
        return f"system {sid[:12]} as {name}:{self.p.alias}"

    def close(self, status: str | None) -> None:
        if self._run is None:
            return
        wb, self._run = self._run, None
        wb.finish(exit_code=0 if status in (None, "finished") else 1)


def _artifact_name(text: str) -> str:
    """An artifact name W&B takes (alphanumerics, dashes, underscores and dots)."""
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in text)[:128]


__all__ = ["WandbTracker"]
