"""MLflow: a run's settings, its generations and report, and its promoted system in the model registry.

One MLflow run per evolvekit run and experiment (``experiment``, default: the task's name); its id
is kept in the archive, so ``--resume`` and ``evolve track`` continue the same MLflow run, and
``evolve track --param experiment=OTHER`` starts another one there:

* params: the task's settings, flattened (``budget.generations``, ``operators.0.name``, ...; values
  past MLflow's 6,000 characters are cut). A resumed run under another budget keeps the first value
  and records the new one as a tag ``evolve.changed.KEY``;
* metrics with ``step`` = generation: best_val, median_val (the generation's children scored on
  val), children, accepted, rollouts, calls, tokens, cost, seconds (:meth:`TrackedRun.metrics`);
* artifacts: ``report/`` (report.json, report.md and the pictures beside them) once the report is
  written, and each system that was made current, under ``systems/ID12/`` as ``evolve archive
  export`` writes it (system.json and its artifacts; ``system_artifacts: false`` for system.json only);
* the model registry: each of those systems a version of the registered model ``model_name``
  (default ``evolve-TASK``), whose source is the logged folder, and the alias ``alias`` (default
  ``champion``) moved to the system that serves now. ``mlflow.artifacts.download_artifacts(
  "models:/NAME@champion")`` gives a folder ``evolve.load`` runs.

Nothing is sent twice: the metrics already logged are read back from MLflow, the report and the
registered systems are remembered in the archive.
"""

from __future__ import annotations

import base64
import os
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from evolve.trackers.base import TrackedRun, TrackerError, flat_params, summary, system_folder

MAX_PARAM = 6000  # MLflow's longest param value
BATCH = 100  # MLflow's most params (or tags) per log_batch


class MLflowTracker:
    """See the module docstring."""

    name = "mlflow"
    requires = (("mlflow", "mlflow"),)

    class Params(BaseModel):
        model_config = ConfigDict(frozen=True, extra="forbid")
        tracking_uri: str | None = Field(
            None,
            description="http://HOST:PORT of an MLflow server, or any MLflow "
            "tracking URI (default: $MLFLOW_TRACKING_URI)",
        )
        registry_uri: str | None = Field(None, description="the model registry (default: the tracking URI)")
        experiment: str | None = Field(None, description="experiment name (default: the task's name)")
        run_name: str | None = Field(None, description="the MLflow run's name (default: the run directory's)")
        tags: dict[str, str] = Field(default_factory=dict, description="tags set on the MLflow run")
        model_registry: bool = Field(True, description="register each system made current, and move the alias")
        model_name: str | None = Field(None, description="registered model (default: evolve-TASK)")
        alias: str = Field("champion", pattern=r"^[\w\-]+$", description="the alias moved to the serving system")
        system_artifacts: bool = Field(
            True, description="log a system with its artifacts (weights, adapters, tool code); false: system.json only"
        )
        timeout: float = Field(10.0, gt=0, description="seconds to wait for the server when the run starts")

    def __init__(self, **params: Any) -> None:
        self.p = self.Params.model_validate(params)
        if self.p.alias == "latest" or self.p.alias[:1] in "vV" and self.p.alias[1:].isdigit():
            raise ValueError(f"alias {self.p.alias!r} is reserved by MLflow (latest, v1, v2, ...); choose another")
        self.uri = self.p.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or ""
        self.address = self.uri or "(no tracking_uri)"
        self._client: Any = None
        self._state_key = f"mlflow {self.uri}"
        self._run_id: str | None = None
        self._steps: set[int] | None = None  # generations whose metrics MLflow holds
        self._params: dict[str, str] | None = None

    # ------------------------------------------------------------------ open

    def open(self) -> None:
        if not self.uri:
            raise TrackerError(
                "the mlflow tracker needs a server: set track params.tracking_uri (e.g. "
                "http://127.0.0.1:5000) or MLFLOW_TRACKING_URI"
            )
        if urllib.parse.urlparse(self.uri).scheme in ("http", "https"):
            self._probe()

    def _probe(self) -> None:
        """One request with a short timeout: does an MLflow server answer at the URI?"""
        url = self.uri.rstrip("/") + "/api/2.0/mlflow/experiments/get-by-name?experiment_name=evolvekit-probe"
        req = urllib.request.Request(url, headers=_auth_headers())
        try:
            with urllib.request.urlopen(req, timeout=self.p.timeout) as r:
                r.read()
            return
        except urllib.error.HTTPError as e:
            body = e.read(2000).decode("utf-8", "replace")
            if e.code in (401, 403):
                raise TrackerError(
                    f"the mlflow tracker: the server at {self.uri} refused the credentials (HTTP "
                    f"{e.code}); set MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME and "
                    "MLFLOW_TRACKING_PASSWORD"
                ) from None
            if "error_code" in body:  # MLflow's own answer (no such experiment): the server is there
                return
            raise TrackerError(
                f"the mlflow tracker: {self.uri} answers HTTP {e.code}, not as an MLflow tracking "
                "server; check track params.tracking_uri"
            ) from None
        except (urllib.error.URLError, OSError) as e:
            why = getattr(e, "reason", None) or e
            raise TrackerError(
                f"the mlflow tracker cannot reach the MLflow server at {self.uri} ({why}); start it "
                "(mlflow server --host 127.0.0.1 --port 5000) or fix track params.tracking_uri"
            ) from None

    # ------------------------------------------------------------------ sync

    def sync(self, run: TrackedRun) -> str:
        client = self._mlflow_client()
        run_id = self._ensure_run(client, run)
        sent: list[str] = []
        n = self._log_params(client, run_id, run)
        if n:
            sent.append(f"{n} params")
        n = self._log_metrics(client, run_id, run)
        if n:
            sent.append(f"{n} generations")
        if self._log_report(client, run_id, run):
            sent.append("the report")
        registered = self._log_system(client, run_id, run)
        if registered:
            sent.append(registered)
        return f"mlflow run {run_id} at {self.uri}: " + (", ".join(sent) if sent else "nothing new")

    def _mlflow_client(self) -> Any:
        if self._client is None:
            from mlflow.tracking import MlflowClient

            self._client = MlflowClient(tracking_uri=self.uri, registry_uri=self.p.registry_uri or self.uri)
        return self._client

    def _key(self) -> str:
        """Where this tracker's state is kept in the archive: one MLflow run per server and experiment."""
        return self._state_key

    def _ensure_run(self, client: Any, run: TrackedRun) -> str:
        """The MLflow run of this evolvekit run: the one remembered (if it still exists), else a new one."""
        if self._run_id is not None:
            return self._run_id
        experiment = self.p.experiment or run.task_name()
        self._state_key = f"mlflow {self.uri} {experiment}"
        saved = run.recall(self._key(), {})
        run_id = saved.get("run_id")
        if run_id:
            from mlflow.exceptions import MlflowException

            try:
                info = client.get_run(run_id).info
                if info.lifecycle_stage == "deleted":
                    run_id = None
                elif run.live and info.status != "RUNNING":  # a resumed run: running again
                    client.update_run(run_id, status="RUNNING")
            except MlflowException as e:
                if getattr(e, "error_code", "") != "RESOURCE_DOES_NOT_EXIST":
                    raise
                run_id = None
        if not run_id:
            from mlflow.exceptions import MlflowException

            exp = client.get_experiment_by_name(experiment)
            if exp is None:
                try:
                    exp_id = client.create_experiment(experiment)
                except MlflowException:  # created meanwhile by another run
                    exp_id = client.get_experiment_by_name(experiment).experiment_id
            else:
                exp_id = exp.experiment_id
            tags = {"evolve.run_dir": str(run.run_dir.resolve()), "evolve.task": run.task_name(), **self.p.tags}
            created = client.create_run(exp_id, run_name=self.p.run_name or run.name, tags=tags)
            run_id = created.info.run_id
            saved = {"run_id": run_id, "experiment_id": exp_id}
            run.remember(self._key(), saved)
        self._run_id = run_id
        return run_id

    def _log_params(self, client: Any, run_id: str, run: TrackedRun) -> int:
        from mlflow.entities import Param, RunTag

        if self._params is None:
            self._params = dict(client.get_run(run_id).data.params)
        want = {_name(k): v[:MAX_PARAM] for k, v in flat_params(run.task()).items()}
        new = {k: v for k, v in want.items() if k not in self._params}
        changed = {k: v for k, v in want.items() if k in self._params and self._params[k] != v}
        items = sorted(new.items())
        for i in range(0, len(items), BATCH):
            client.log_batch(run_id, params=[Param(k, v) for k, v in items[i : i + BATCH]])
            self._params.update(items[i : i + BATCH])
        if changed:  # MLflow keeps a param's first value: a resumed run's new budget is a tag
            tags = sorted(changed.items())
            for i in range(0, len(tags), BATCH):
                client.log_batch(run_id, tags=[RunTag(f"evolve.changed.{k}", v) for k, v in tags[i : i + BATCH]])
        return len(new)

    def _log_metrics(self, client: Any, run_id: str, run: TrackedRun) -> int:
        from mlflow.entities import Metric

        if self._steps is None:
            self._steps = {m.step for m in client.get_metric_history(run_id, "best_val")}
        n = 0
        now = int(time.time() * 1000)
        for index, values in run.metrics():
            if index in self._steps:
                continue
            # best_val last: MLflow holds a generation once its best_val is there (read back on a resume)
            order = sorted(values, key=lambda k: k == "best_val")
            client.log_batch(run_id, metrics=[Metric(k, values[k], now, index) for k in order])
            self._steps.add(index)
            n += 1
        return n

    def _log_report(self, client: Any, run_id: str, run: TrackedRun) -> bool:
        from mlflow.entities import RunTag

        digest = run.report_digest()
        key = self._key() + " report"
        if digest is None or run.recall(key) == digest:
            return False
        for f in run.report_files():
            client.log_artifact(run_id, str(f), "report")
        tags = {f"evolve.{k}": str(v) for k, v in summary(run.report()).items()}
        if tags:
            client.log_batch(run_id, tags=[RunTag(k, v) for k, v in sorted(tags.items())])
        run.remember(key, digest)
        return True

    def _log_system(self, client: Any, run_id: str, run: TrackedRun) -> str:
        """Log the serving system (once per system), register it and move the alias to it."""
        sid = run.current()
        key = self._key() + " systems"
        done: dict[str, Any] = run.recall(key, {})
        if sid is None or done.get("current") == sid:
            return ""
        path = f"systems/{sid[:12]}"
        if sid not in done.get("logged", {}):
            with tempfile.TemporaryDirectory(prefix="evolve-mlflow-") as tmp:
                folder = system_folder(run, sid, Path(tmp) / "system", with_artifacts=self.p.system_artifacts)
                client.log_artifacts(run_id, str(folder), path)
            done.setdefault("logged", {})[sid] = None
            run.remember(key, done)
        said = f"system {sid[:12]}"
        if self.p.model_registry:
            name = self.p.model_name or f"evolve-{run.task_name()}"
            version = done["logged"].get(sid) or self._register(client, name, run_id, sid, path, run)
            done["logged"][sid] = version
            run.remember(key, done)
            client.set_registered_model_alias(name, self.p.alias, version)
            said += f" as {name} version {version} (@{self.p.alias})"
        client.set_tag(run_id, "evolve.current", sid)
        done["current"] = sid
        run.remember(key, done)
        return said

    def _register(self, client: Any, name: str, run_id: str, sid: str, path: str, run: TrackedRun) -> str:
        from mlflow.exceptions import MlflowException

        try:
            client.create_registered_model(name, description=f"evolvekit systems of the task {run.task_name()!r}")
        except MlflowException as e:
            if getattr(e, "error_code", "") != "RESOURCE_ALREADY_EXISTS":
                raise
        for mv in client.search_model_versions(f"name = '{name}' and run_id = '{run_id}'"):
            if (mv.tags or {}).get("evolve.system_id") == sid:  # registered before a crash: not twice
                return str(mv.version)
        mv = client.create_model_version(
            name,
            source=f"runs:/{run_id}/{path}",
            run_id=run_id,
            tags={"evolve.system_id": sid, "evolve.run_dir": str(run.run_dir.resolve())},
            description=f"evolvekit system {sid}",
            await_creation_for=0,
        )
        return str(mv.version)

    # ------------------------------------------------------------------ close

    def close(self, status: str | None) -> None:
        if status is None or self._run_id is None:
            return
        self._mlflow_client().set_terminated(
            self._run_id, {"finished": "FINISHED", "killed": "KILLED"}.get(status, "FAILED")
        )


def _name(key: str) -> str:
    """A param name MLflow takes (alphanumerics, _ - . / : and spaces; 250 characters)."""
    clean = "".join(c if c.isalnum() or c in "_-./: " else "_" for c in key)
    return clean[:250]


def _auth_headers() -> dict[str, str]:
    """The headers MLflow's own client would send, from its environment variables."""
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if token:
        return {"Authorization": f"Bearer {token}"}
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    if user and password:
        return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
    return {}


__all__ = ["MLflowTracker"]
