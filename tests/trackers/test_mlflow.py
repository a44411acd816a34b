"""The mlflow tracker against a real MLflow tracking server started on loopback (sqlite backend,
artifacts proxied to a folder), read back through MLflow's own client: params, metrics per
generation, the report, the promoted system registered with its alias, a resumed run continued,
and evolve track afterwards (slow: an MLflow server takes 20-30 s to start on 2 busy cores)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import evolve
from evolve.archive import Archive
from evolve.trackers import TrackedRun
from tests.helpers.upstream import free_port
from tests.trackers.conftest import toy

pytest.importorskip("mlflow")
pytestmark = pytest.mark.slow

NAMES = ("best_val", "median_val", "children", "accepted", "rollouts", "calls", "tokens", "cost", "seconds")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    env = {
        **os.environ,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("mlflow")),
            "server",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
            "--backend-store-uri",
            f"sqlite:///{root / 'mlflow.db'}",
            "--artifacts-destination",
            str(root / "artifacts"),
        ],
        cwd=root,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 240
    while True:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail("the MLflow server did not start:\n" + (root / "server.log").read_text()[-3000:])
        time.sleep(0.25)
    try:
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()


@pytest.fixture
def client(server, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)  # what `models:/` URIs resolve against
    return MlflowClient(tracking_uri=server, registry_uri=server)


def _mlflow_run_id(run_dir: Path, server: str, experiment: str) -> str:
    with Archive(run_dir, create=False) as a:
        return TrackedRun(a).recall(f"mlflow {server} {experiment}")["run_id"]


def _history(client, run_id: str) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for name in NAMES:
        for m in client.get_metric_history(run_id, name):
            assert name not in out.get(m.step, {}), f"{name} logged twice at step {m.step}"
            out.setdefault(m.step, {})[name] = m.value
    return out


def test_a_run_is_read_back_through_mlflows_client(tmp_path, server, client):
    task = toy(track=[{"name": "mlflow", "params": {"tracking_uri": server, "experiment": "read-back"}}])
    report = evolve.run(task, out=tmp_path / "run")
    run_id = _mlflow_run_id(tmp_path / "run", server, "read-back")
    got = client.get_run(run_id)
    assert got.info.status == "FINISHED" and got.info.run_name == "run"
    assert client.get_experiment(got.info.experiment_id).name == "read-back"
    p = got.data.params
    assert (
        p["budget.generations"] == "4"
        and p["operators.0.name"] == "scripted"
        and p["prompts.instruction"] == "multiply"
    )
    assert p["engine.minibatch"] == "12" and not any(k.startswith("track") for k in p)
    history = _history(client, run_id)
    assert sorted(history) == [g["index"] for g in report["generations"]] == [0, 1, 2, 3, 4]
    for g in report["generations"]:  # the archive's generation rows, metric by metric
        for key in ("best_val", "children", "accepted", "rollouts", "calls", "tokens", "cost", "seconds"):
            assert history[g["index"]][key] == pytest.approx(g[key]), (g["index"], key)
    assert history[1]["median_val"] == 0.65 and "median_val" not in history[3]
    assert {f.path for f in client.list_artifacts(run_id, "report")} == {"report/report.json", "report/report.md"}
    assert json.loads(
        Path(client.download_artifacts(run_id, "report/report.json", str(tmp_path))).read_text()
    ) == json.loads((tmp_path / "run" / "report.json").read_text())
    assert got.data.tags["evolve.best_test"] == str(report["best"]["test"]["score"])
    with Archive(tmp_path / "run", create=False) as a:
        current = a.current()
    mv = client.get_model_version_by_alias("evolve-toy", "champion")
    assert mv.run_id == run_id and mv.source == f"runs:/{run_id}/systems/{current[:12]}"
    assert mv.tags["evolve.system_id"] == current and got.data.tags["evolve.current"] == current
    import mlflow.artifacts

    folder = mlflow.artifacts.download_artifacts("models:/evolve-toy@champion", dst_path=str(tmp_path / "champion"))
    app = evolve.load(folder, agent="evolve.worlds.toy:agent")  # the registered system runs as evolve.load gives it
    assert app.system.id == current and app.system.prompts["instruction"] == "add carefully"
    assert app.run({"id": "q", "a": 40, "b": 2}) == "42"
    app.close()


def test_a_resumed_run_continues_the_same_mlflow_run(tmp_path, server, client):
    track = [{"name": "mlflow", "params": {"tracking_uri": server, "experiment": "resumed"}}]
    evolve.run(toy(track=track, budget={"generations": 2}), out=tmp_path / "run")
    first = _mlflow_run_id(tmp_path / "run", server, "resumed")
    assert sorted(_history(client, first)) == [0, 1, 2]
    report = evolve.run(toy(track=track), out=tmp_path / "run", resume=True)
    assert _mlflow_run_id(tmp_path / "run", server, "resumed") == first
    assert len(client.search_runs([client.get_experiment_by_name("resumed").experiment_id])) == 1
    history = _history(client, first)  # each generation once (checked in _history)
    assert sorted(history) == [0, 1, 2, 3, 4]
    assert [history[i]["best_val"] for i in range(5)] == [g["best_val"] for g in report["generations"]]
    got = client.get_run(first)
    assert got.info.status == "FINISHED" and got.data.params["budget.generations"] == "2"  # MLflow keeps the first
    assert got.data.tags["evolve.changed.budget.generations"] == "4"


def test_evolve_track_sends_a_run_afterwards_and_moves_the_alias_after_a_rollback(tmp_path, server, client, capsys):
    from evolve.cli.commands import main

    evolve.run(toy(name="later"), out=tmp_path / "run")
    args = [
        "track",
        str(tmp_path / "run"),
        "--to",
        "mlflow",
        "--param",
        f"tracking_uri={server}",
        "--param",
        "alias=prod",
    ]
    main(args)
    out = capsys.readouterr().out
    assert "5 generations" in out and "the report" in out and "(@prod)" in out
    run_id = _mlflow_run_id(tmp_path / "run", server, "later")
    with Archive(tmp_path / "run", create=False) as a:
        best, baseline = a.current(), a.resolve("baseline")
    assert client.get_model_version_by_alias("evolve-later", "prod").tags["evolve.system_id"] == best
    main(["archive", "rollback", str(tmp_path / "run"), "baseline"])
    main(args)
    assert "nothing new" not in capsys.readouterr().out
    mv = client.get_model_version_by_alias("evolve-later", "prod")
    assert mv.tags["evolve.system_id"] == baseline and mv.version == "2"
    assert sorted(_history(client, run_id)) == [0, 1, 2, 3, 4]  # nothing sent twice
    main(args)
    assert "nothing new" in capsys.readouterr().out
    main(args + ["--param", "experiment=elsewhere"])  # another experiment: another MLflow run, all of it
    assert "5 generations" in capsys.readouterr().out
    other = _mlflow_run_id(tmp_path / "run", server, "elsewhere")
    assert other != run_id and sorted(_history(client, other)) == [0, 1, 2, 3, 4]
